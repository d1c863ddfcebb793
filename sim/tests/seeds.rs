//! The simulator's short budget, as CI runs it: 30 seeds on redb, every invariant checked. The
//! long run is `cargo run --release -p oncebox-sim -- --seeds 2000` (see sim/README.md).

use std::process::Command;

#[test]
fn thirty_seeds_keep_every_promise() {
    let out =
        Command::new(env!("CARGO_BIN_EXE_oncebox-sim")).args(["--seeds", "30"]).output().expect("run oncebox-sim");
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
    let digests = stdout.lines().filter(|l| l.contains("digest: ")).count();
    assert_eq!(digests, 30, "every seed prints its digest:\n{stdout}");
}
