//! The simulator's short budget, as CI runs it: 30 seeds on redb, every invariant checked, each
//! seed run twice. The long run is `cargo run --release -p oncebox-sim -- --seeds 2000` (see
//! sim/README.md).

use std::process::{Command, Output};

fn simulate(seeds: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oncebox-sim")).args(["--seeds", seeds]).output().expect("run oncebox-sim")
}

/// The seed lines of a run that are not `free`: those run the same way every time.
fn fixed(stdout: &str) -> Vec<String> {
    stdout.lines().filter(|l| l.contains("digest: ") && !l.contains("(free)")).map(str::to_string).collect()
}

#[test]
fn thirty_seeds_keep_every_promise_and_run_the_same_way_twice() {
    let out = simulate("30");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "oncebox-sim failed ({:?}):\n{stdout}\n{stderr}", out.status);
    let last = stdout.lines().last().unwrap_or_default();
    let numbers: Vec<u64> =
        last.trim_start_matches("sim: ").split(", ").filter_map(|part| part.split(' ').next()?.parse().ok()).collect();
    let [seeds, operations, faults, violations] = numbers[..] else {
        panic!("the last line is not the summary: {last:?}");
    };
    assert_eq!((seeds, violations), (30, 0), "{last}");
    // The world did lie, and the workload did run: a summary of nothing proves nothing.
    assert!(operations > 30 * 10 && faults > 30, "{last}");
    let lines = stdout.lines().filter(|l| l.contains("digest: ")).count();
    assert_eq!(lines, 30, "every seed prints its digest:\n{stdout}");

    let again = simulate("30");
    let again = String::from_utf8_lossy(&again.stdout);
    assert!(fixed(&stdout).len() >= 15, "most seeds are not free:\n{stdout}");
    assert_eq!(fixed(&stdout), fixed(&again), "two runs of the same seeds differ");
}
