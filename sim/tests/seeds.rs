//! The simulator's short budget, as CI runs it: 30 seeds on redb, every invariant checked, each
//! seed run twice. The long run is `cargo run --release -p oncebox-sim -- --seeds 2000` (see
//! sim/README.md).

use std::process::{Command, Output, Stdio};

/// Seeds 1..=30 in two processes at once (one process runs one seed at a time, and a seed spends
/// most of its real time waiting on the ledger's disk): their outputs, the first half's first.
fn simulate() -> (String, String, bool) {
    let half = |from: &str| {
        Command::new(env!("CARGO_BIN_EXE_oncebox-sim"))
            .args(["--seeds", "15", "--from", from])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run oncebox-sim")
    };
    let (first, second) = (half("1"), half("16"));
    let outs: Vec<Output> =
        [first, second].into_iter().map(|child| child.wait_with_output().expect("wait for oncebox-sim")).collect();
    let text = |f: fn(&Output) -> &Vec<u8>| outs.iter().map(|o| String::from_utf8_lossy(f(o)).into_owned()).collect();
    (text(|o| &o.stdout), text(|o| &o.stderr), outs.iter().all(|o| o.status.success()))
}

/// The summary lines' numbers, added up: seeds, operations, faults, violations.
fn summary(stdout: &str) -> [u64; 4] {
    let mut sum = [0; 4];
    for line in stdout.lines().filter(|l| l.starts_with("sim: ")) {
        let numbers: Vec<u64> = line
            .trim_start_matches("sim: ")
            .split(", ")
            .filter_map(|part| part.split(' ').next()?.parse().ok())
            .collect();
        let [seeds, operations, faults, violations] = numbers[..] else {
            panic!("not a summary: {line:?}");
        };
        for (total, n) in sum.iter_mut().zip([seeds, operations, faults, violations]) {
            *total += n;
        }
    }
    sum
}

/// The seed lines of a run that are not `free`: those run the same way every time.
fn fixed(stdout: &str) -> Vec<String> {
    stdout.lines().filter(|l| l.contains("digest: ") && !l.contains("(free)")).map(str::to_string).collect()
}

#[test]
fn thirty_seeds_keep_every_promise_and_run_the_same_way_twice() {
    let (stdout, stderr, success) = simulate();
    assert!(success, "oncebox-sim failed:\n{stdout}\n{stderr}");
    let [seeds, operations, faults, violations] = summary(&stdout);
    let last = format!("{seeds} seeds, {operations} operations, {faults} faults, {violations} violations");
    assert_eq!((seeds, violations), (30, 0), "{last}");
    // The world did lie, and the workload did run: a summary of nothing proves nothing.
    assert!(operations > 30 * 10 && faults > 30, "{last}");
    let lines = stdout.lines().filter(|l| l.contains("digest: ")).count();
    assert_eq!(lines, 30, "every seed prints its digest:\n{stdout}");

    let (again, _, _) = simulate();
    assert!(fixed(&stdout).len() >= 15, "most seeds are not free:\n{stdout}");
    assert_eq!(fixed(&stdout), fixed(&again), "two runs of the same seeds differ");
}
