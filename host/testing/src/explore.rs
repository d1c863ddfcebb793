//! Exploration: learn a tool's effects from one fault-free run, then for every effect and every
//! crash point and fault run the scenario again on a fresh ledger, and check the guarantee's
//! invariants against what landed at the script.

use oncebox_runtime::Status;
use oncebox_runtime::hooks::Point;

use super::HarnessError;
use super::harness::{Harness, Injection, Run, Target};
use super::report::{Report, Row, Violation};
use super::script::{Dispatch, Event, Fault};

/// The crash points an effect meets (the attempt's record is explored per attempt).
const EFFECT_POINTS: [Point; 4] =
    [Point::BeforeWriteAhead, Point::AfterWriteAhead, Point::AfterDispatch, Point::AfterAnswer];

impl Harness {
    /// Runs `args` fault-free to learn the tool's effects, then every (effect, crash point or
    /// fault) and every attempt's record crashed, each on a fresh ledger; one row each.
    pub async fn explore(&self, args: &str) -> Result<Report, HarnessError> {
        let baseline = self.run(args, None).await?;
        let mut effects: Vec<(String, u32)> = Vec::new();
        for dispatch in &baseline.dispatches {
            let effect = (dispatch.label.clone(), dispatch.occurrence);
            if !effects.contains(&effect) {
                effects.push(effect);
            }
        }
        let mut injections = Vec::new();
        for (ordinal, (label, occurrence)) in effects.iter().enumerate() {
            let effect = Target { ordinal, name: format!("{label}#{occurrence}") };
            for point in EFFECT_POINTS {
                injections.push(Injection::Crash { point, effect: effect.clone() });
            }
            for fault in Fault::ALL {
                injections.push(Injection::Fault { fault, effect: effect.clone() });
            }
        }
        for attempt in 1..=baseline.outcome.attempts.max(1) {
            injections.push(Injection::CrashAfterAttempt { attempt });
        }
        let honours_keys = self.script.downstream.honours_keys;
        let mut rows = Vec::new();
        for injection in injections {
            let run = self.run(args, Some(&injection)).await?;
            let violations = check(&baseline, &run, &injection, honours_keys);
            rows.push(Row::of(&injection, &run, violations));
        }
        Ok(Report { baseline: Row::baseline(&baseline), rows })
    }
}

/// The invariants, for one scenario against the fault-free run.
pub(crate) fn check(baseline: &Run, run: &Run, injection: &Injection, honours_keys: bool) -> Vec<Violation> {
    let mut violations = duplicates(baseline, run);
    violations.extend(run.diverged.iter().map(|message| Violation::Diverged(message.clone())));
    violations.extend(silent_resends(run, honours_keys));
    violations.extend(result(baseline, run, injection));
    violations
}

/// No effect lands more often than in the fault-free run, and none twice: a second commit of the
/// same request, under its key where the downstream does not honour keys, or under another key
/// anywhere. Once is never a duplicate, even where the fault-free run landed nothing: a fault that
/// commits (a lost response) makes a downstream that refused in the fault-free run take the
/// request once.
fn duplicates(baseline: &Run, run: &Run) -> Vec<Violation> {
    let landed = |dispatches: &[Dispatch], of: &Dispatch| -> usize {
        dispatches.iter().filter(|d| d.landed && d.same_request(of)).count()
    };
    let mut violations = Vec::new();
    let mut seen: Vec<&Dispatch> = Vec::new();
    for dispatch in run.dispatches.iter().filter(|d| d.landed) {
        if seen.iter().any(|s| s.same_request(dispatch)) {
            continue;
        }
        seen.push(dispatch);
        let (now, before) = (landed(&run.dispatches, dispatch), landed(&baseline.dispatches, dispatch));
        let before = before.max(1);
        if now > before {
            let copies: Vec<&Dispatch> =
                run.dispatches.iter().filter(|d| d.landed && d.same_request(dispatch)).collect();
            let keys: Vec<String> = copies.iter().map(|d| format!("`{}` (key {})", d.label, d.key)).collect();
            let why = if copies.iter().all(|d| d.key == dispatch.key) {
                "the same key was sent again to a downstream that does not deduplicate it"
            } else {
                "it went out again under another key (a label that changed between attempts, or the tool \
                 sending it again itself), so the downstream took it for a new request"
            };
            violations.push(Violation::Duplicate {
                label: dispatch.label.clone(),
                landed: now,
                expected: before,
                detail: format!("landed {now} times (the fault-free run: {before}): {}; {why}", keys.join(", ")),
            });
        }
    }
    violations
}

/// An effect in doubt is never sent again with its key to a downstream that does not honour
/// keys, unless a reconcile proved in between that it was not taken.
fn silent_resends(run: &Run, honours_keys: bool) -> Vec<Violation> {
    if honours_keys {
        return Vec::new();
    }
    let mut doubt: Vec<&Dispatch> = Vec::new();
    let mut violations = Vec::new();
    for event in &run.events {
        match event {
            Event::ProvenNotTaken => doubt.clear(),
            Event::Dispatch(index) => {
                let Some(dispatch) = run.dispatches.get(*index) else { continue };
                if doubt.iter().any(|d| d.key == dispatch.key) {
                    violations
                        .push(Violation::SilentResend { label: dispatch.label.clone(), key: dispatch.key.clone() });
                }
                if dispatch.in_doubt {
                    doubt.push(dispatch);
                }
            }
        }
    }
    violations
}

/// The final result equals the fault-free one, or is an honest unknown (an effect is on record in
/// doubt or taken), or a failure with nothing landed where a fault in the downstream's answer
/// refused the work (an irreversible tool does not retry a refused connection) or a reconcile
/// proved the effect in doubt not taken.
fn result(baseline: &Run, run: &Run, injection: &Injection) -> Option<Violation> {
    let landed = run.dispatches.iter().any(|d| d.landed);
    let expected = &baseline.outcome;
    let got = &run.outcome;
    match got.status {
        Status::Failed if landed => Some(Violation::Result(
            "failed, yet an effect landed at the downstream: `failed` must mean nothing took effect".into(),
        )),
        Status::Failed if expected.status == Status::Failed => None,
        // A reconcile proved that the effect in doubt was never taken, and nothing else landed: an
        // irreversible step then fails rather than run again unapproved, and `failed` is the truth.
        Status::Failed if run.events.contains(&Event::ProvenNotTaken) => None,
        // A downstream that refused (or kept refusing) did nothing: failing is the truth.
        Status::Failed if matches!(injection, Injection::Fault { .. }) => None,
        Status::Unknown => {
            let on_record = run.effects.iter().any(|e| e.status.in_doubt() || e.status.taken());
            (!on_record).then(|| Violation::Result("unknown, yet no effect is on record in doubt or taken".into()))
        }
        status if status == expected.status && got.output == expected.output => None,
        status => Some(Violation::Result(format!(
            "ended {} where the fault-free run ended {}{}",
            status.as_str(),
            expected.status.as_str(),
            if status == expected.status { " with another output" } else { "" }
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncebox_runtime::Outcome;

    fn dispatch(key: &str, landed: bool, in_doubt: bool) -> Dispatch {
        Dispatch {
            key: key.into(),
            label: "charge".into(),
            occurrence: 0,
            method: "POST".into(),
            url: "http://downstream.test/payments".into(),
            body: b"{}".to_vec(),
            landed,
            in_doubt,
            answer: String::new(),
        }
    }

    fn run(status: Status, dispatches: Vec<Dispatch>) -> Run {
        let events = (0..dispatches.len()).map(Event::Dispatch).collect();
        Run {
            outcome: Outcome {
                status,
                replayed: false,
                attempts: 1,
                operation_key: None,
                output: None,
                error: None,
                fingerprint: None,
                approval: None,
            },
            crashed: true,
            approvals: 0,
            reconciles: Vec::new(),
            dispatches,
            effects: Vec::new(),
            diverged: Vec::new(),
            events,
        }
    }

    fn crash() -> Injection {
        Injection::crash(Point::AfterDispatch, 0)
    }

    #[test]
    fn the_fault_free_result_breaks_nothing() {
        let baseline = run(Status::Completed, vec![dispatch("k1", true, false)]);
        let again = run(Status::Completed, vec![dispatch("k1", true, true), dispatch("k1", false, false)]);
        assert_eq!(check(&baseline, &again, &crash(), true), Vec::new());
    }

    #[test]
    fn a_key_resent_to_a_downstream_without_keys_is_a_duplicate_and_a_silent_resend() {
        let baseline = run(Status::Completed, vec![dispatch("k1", true, false)]);
        let twice = run(Status::Completed, vec![dispatch("k1", true, true), dispatch("k1", true, false)]);
        let violations = check(&baseline, &twice, &crash(), false);
        assert!(
            matches!(&violations[0], Violation::Duplicate { landed: 2, expected: 1, detail, .. } if detail.contains("same key"))
        );
        assert!(matches!(&violations[1], Violation::SilentResend { key, .. } if key == "k1"), "{violations:?}");
    }

    #[test]
    fn a_request_the_fault_free_run_saw_refused_may_land_once_under_a_fault_that_commits() {
        let refused = run(Status::Failed, vec![dispatch("k1", false, false)]);
        let committed = run(Status::Unknown, vec![dispatch("k1", true, true), dispatch("k1", false, false)]);
        assert_eq!(duplicates(&refused, &committed), Vec::new());
        let twice = run(Status::Unknown, vec![dispatch("k1", true, true), dispatch("k2", true, false)]);
        let violations = duplicates(&refused, &twice);
        assert!(matches!(&violations[0], Violation::Duplicate { landed: 2, expected: 1, .. }), "{violations:?}");
    }

    #[test]
    fn a_resend_after_a_proven_not_taken_is_not_silent() {
        let baseline = run(Status::Completed, vec![dispatch("k1", true, false)]);
        let mut proven = run(Status::Completed, vec![dispatch("k1", false, true), dispatch("k1", true, false)]);
        proven.events = vec![Event::Dispatch(0), Event::ProvenNotTaken, Event::Dispatch(1)];
        assert_eq!(check(&baseline, &proven, &crash(), false), Vec::new());
    }

    #[test]
    fn a_new_key_for_the_same_request_is_a_duplicate_even_where_keys_are_honoured() {
        let baseline = run(Status::Completed, vec![dispatch("k1", true, false)]);
        let changed = run(Status::Unknown, vec![dispatch("k1", true, true), dispatch("k2", true, false)]);
        let violations = check(&baseline, &changed, &crash(), true);
        assert!(matches!(&violations[0], Violation::Duplicate { detail, .. } if detail.contains("under another key")));
    }

    #[test]
    fn failed_after_an_effect_landed_and_unknown_with_nothing_on_record_are_dishonest() {
        let baseline = run(Status::Completed, vec![dispatch("k1", true, false)]);
        let failed = run(Status::Failed, vec![dispatch("k1", true, true)]);
        assert!(
            matches!(&check(&baseline, &failed, &crash(), true)[..], [Violation::Result(why)] if why.contains("failed"))
        );
        let unknown = run(Status::Unknown, vec![]);
        assert!(
            matches!(&check(&baseline, &unknown, &crash(), true)[..], [Violation::Result(why)] if why.contains("no effect"))
        );
        // Proven not taken by a reconcile, nothing landed: failing is the truth.
        let mut proven = run(Status::Failed, vec![dispatch("k1", false, true)]);
        proven.events.push(Event::ProvenNotTaken);
        assert_eq!(check(&baseline, &proven, &crash(), true), Vec::new());
        // A refusal is the truth when nothing landed.
        let refused = run(Status::Failed, vec![dispatch("k1", false, false)]);
        assert_eq!(check(&baseline, &refused, &Injection::fault(Fault::Permanent, 0), true), Vec::new());
    }
}
