//! The simulated guest clock (`GuestClock::Simulated`), on a paused tokio clock as the simulator
//! runs it: a guest that spins traps at its attempt's deadline on that clock, the clock moved on
//! by its spinning (other tasks due meanwhile run), at a small cost in real time; a guest that
//! does not spin moves it by nothing. Under the real guest clock the first test fails: the paused
//! clock stands still while the guest holds the thread, and it traps when real time says.

use std::time::Duration;

use serde_json::json;

use oncebox_runtime::{Call, GuestClock, Host, HostBuilder, ReplayClass, RetryPolicy, Status};

const DEADLINE: Duration = Duration::from_secs(5);
const STEP: Duration = Duration::from_millis(50);

/// A host in memory on the simulated guest clock, with `panicky` loaded: one attempt, under
/// [`DEADLINE`].
async fn host() -> Host {
    let policy = RetryPolicy {
        max_attempts: 1,
        attempt_deadline: DEADLINE,
        ..RetryPolicy::for_class(ReplayClass::IdempotentWrite)
    };
    let host = HostBuilder::in_memory()
        .guest_clock(GuestClock::Simulated { step: STEP })
        .retry_policy("panicky", policy)
        .build()
        .await
        .expect("a host");
    host.load(oncebox_artifacts::PANICKY).await.expect("load panicky");
    host
}

#[tokio::test(start_paused = true)]
async fn a_spinning_guest_traps_at_its_deadline_on_the_simulated_clock_which_moves_as_it_spins() {
    let host = host().await;
    let start = tokio::time::Instant::now();
    // Another task of the simulation, due two seconds in: it runs while the guest spins.
    let other = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        tokio::time::Instant::now()
    });
    let real = std::time::Instant::now();
    let call = Call::step("r", "spin", "panicky", json!({"mode": "spin"}).to_string());
    let outcome = host.call(call).await.expect("the call");
    let (simulated, real) = (start.elapsed(), real.elapsed());

    assert_eq!(outcome.status, Status::Failed, "{outcome:?}");
    assert_eq!(outcome.attempts, 1);
    assert_eq!(outcome.error.as_ref().map(|e| e.class.as_str()), Some("deadline"), "{outcome:?}");
    // At the deadline itself: the last step is cut to it.
    assert_eq!(simulated, DEADLINE, "the simulated clock moved by the deadline while the guest spun");
    assert!(other.is_finished(), "the other task ran while the guest spun");
    let woke = other.await.expect("the other task");
    assert_eq!(woke - start, Duration::from_secs(2), "at its own time, not after the guest");
    // The grace (three ticks of the real epoch, 10 ms each) and a hundred task switches: about
    // 40 ms here, where the real clock would take five seconds, and steps paced by real ticks one.
    assert!(real < Duration::from_millis(500), "the spinning cost {real:?} of real time");
}

#[tokio::test(start_paused = true)]
async fn a_guest_that_returns_moves_the_simulated_clock_by_nothing() {
    let host = host().await;
    let start = tokio::time::Instant::now();
    let call = Call::step("r", "ok", "panicky", json!({"mode": "ok", "echo": "hi"}).to_string());
    let outcome = host.call(call).await.expect("the call");
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    assert_eq!(start.elapsed(), Duration::ZERO);
}
