//! What an approval binds and how long it stands: the component that will run (its digest) as
//! well as the params, and an expiry; a tool replaced while its request is pending or approved
//! and unused needs a new approval, and requests nobody decided or used lapse with retention.
//! Counted at the example provider.

use std::path::Path;
use std::time::Duration;

use oncebox::ledger::{ApprovalStanding, ApprovalState};
use oncebox::{Call, Decision, Status};
use serde_json::{Value, json};

use crate::support::{Fixture, approve, now_ms, oncebox};

fn fulfill(order: &str) -> Value {
    json!({"order_id": order, "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]})
}

fn ship(step: &str, order: &str) -> Call {
    Call::step("r", step, "fulfill", fulfill(order).to_string())
}

/// `component` as another build of the same source would make it: the same code with one more
/// custom section (`note`), so another digest. Custom sections may close a component's binary.
fn rebuilt(component: &[u8], note: &str) -> Vec<u8> {
    let name = b"oncebox-test-build";
    let mut payload = vec![name.len() as u8];
    payload.extend_from_slice(name);
    payload.extend_from_slice(note.as_bytes());
    let mut out = component.to_vec();
    out.push(0); // a custom section
    let mut size = payload.len();
    loop {
        let byte = (size & 0x7f) as u8;
        size >>= 7;
        out.push(if size == 0 { byte } else { byte | 0x80 });
        if size == 0 {
            break;
        }
    }
    out.extend_from_slice(&payload);
    out
}

/// A fixture whose `fulfill` is loaded from a file of its own in the fixture's directory (which
/// the test replaces): the file and its digest.
async fn fulfill_from_own_file(f: &Fixture) -> (std::path::PathBuf, Vec<u8>, String) {
    let path = f.dir.path().join("fulfill.wasm");
    let original = std::fs::read(oncebox_artifacts::FULFILL).expect("the fulfill component");
    std::fs::write(&path, &original).expect("copy");
    assert!(f.host.unload("fulfill"));
    f.host.load(&path).await.expect("load the copy");
    let digest = f.host.digest("fulfill").expect("loaded");
    (path, original, digest)
}

/// Deploys another build of `fulfill` at `path`, as a server watching its directory reloads it.
async fn replace(f: &Fixture, path: &Path, original: &[u8], note: &str) -> String {
    std::fs::write(path, rebuilt(original, note)).expect("replace");
    f.host.reload(path).await.expect("reload");
    f.host.digest("fulfill").expect("loaded")
}

#[tokio::test]
async fn a_component_replaced_while_its_request_is_pending_needs_a_new_approval() {
    let f = Fixture::new().await;
    let (path, original, digest_a) = fulfill_from_own_file(&f).await;
    assert!(digest_a.starts_with("sha256:") && digest_a.len() == 7 + 64, "{digest_a}");
    let first = f.host.call(ship("ship", "o-1")).await.expect("call");
    assert_eq!(first.status, Status::AwaitingApproval, "{first:?}");
    let view = first.approval.as_ref().expect("what to approve");
    assert_eq!(view.component.as_deref(), Some(digest_a.as_str()), "the request names the code that would run");
    assert!(view.approve.as_deref().is_some_and(|a| a.contains(&format!("--component {digest_a}"))), "{view:?}");
    let (key, fingerprint) = (first.operation_key.clone().expect("key"), first.fingerprint.clone().expect("fp"));

    // Another build is deployed while the request waits; then the person approves what they were
    // shown, the request for the old build.
    let digest_b = replace(&f, &path, &original, "b").await;
    assert_ne!(digest_a, digest_b);
    approve(&f.host, &first).await;

    // The call does not run the new build under it, and says why.
    let refused = f.host.call(ship("ship", "o-1")).await.expect("call");
    assert_eq!(refused.status, Status::AwaitingApproval, "{refused:?}");
    let why = refused.error.as_ref().map(|e| e.message.clone()).unwrap_or_default();
    assert!(why.contains(&format!("changed from {digest_a} to {digest_b}")), "{why}");
    assert!(why.contains("approve again"), "{why}");
    f.provider.settled().await;
    assert_eq!((f.provider.requests(), f.provider.counts("o-1").fulfillments), (0, 0));

    // The old request is superseded by a new pending one for the new build, under the same key.
    assert_eq!(refused.operation_key.as_deref(), Some(key.as_str()));
    let record = f.host.ledger().approval(&key).await.expect("read").expect("request");
    assert_eq!(
        (record.state, record.component.as_deref(), record.revision),
        (ApprovalState::Pending, Some(digest_b.as_str()), 3)
    );
    assert_eq!(refused.approval.as_ref().and_then(|v| v.component.as_deref()), Some(digest_b.as_str()));
    // Calling again changes nothing: the request is for the code loaded now.
    let again = f.host.call(ship("ship", "o-1")).await.expect("call");
    assert_eq!(again.status, Status::AwaitingApproval, "{again:?}");
    assert_eq!(f.host.ledger().approval(&key).await.expect("read").expect("request").revision, 3);

    // A decision naming the build the person saw before is refused: the request changed since.
    let approve_a = Decision::Approve { expires_ms: None };
    let stale = f.host.decide_on(&key, &fingerprint, Some(&digest_a), approve_a, "test", None).await;
    assert!(stale.is_err_and(|e| e.to_string().contains("replaced since you looked")));
    // Approving the new request lets the new build run, once.
    let approve_b = Decision::Approve { expires_ms: None };
    f.host.decide_on(&key, &fingerprint, Some(&digest_b), approve_b, "test", None).await.expect("approve");
    let shipped = f.host.call(ship("ship", "o-1")).await.expect("call");
    assert_eq!(shipped.status, Status::Completed, "{shipped:?}");
    for _ in 0..2 {
        let replay = f.host.call(ship("ship", "o-1")).await.expect("call");
        assert!(replay.replayed && replay.status == Status::Completed, "{replay:?}");
    }
    f.provider.settled().await;
    assert_eq!(f.provider.counts("o-1").fulfillments, 1);
}

#[tokio::test]
async fn a_component_replaced_after_the_approval_and_before_its_use_needs_a_new_one() {
    let f = Fixture::new().await;
    let (path, original, digest_a) = fulfill_from_own_file(&f).await;
    let first = f.host.call(ship("ship", "o-1")).await.expect("call");
    approve(&f.host, &first).await;
    // Approved, not used yet; then another build is deployed.
    let digest_b = replace(&f, &path, &original, "b").await;
    let refused = f.host.call(ship("ship", "o-1")).await.expect("call");
    assert_eq!(refused.status, Status::AwaitingApproval, "{refused:?}");
    let why = refused.error.as_ref().map(|e| e.message.clone()).unwrap_or_default();
    assert!(why.contains(&format!("changed from {digest_a} to {digest_b} since test approved it")), "{why}");
    f.provider.settled().await;
    assert_eq!(f.provider.requests(), 0);
    // And once more, back to the first build: each build needs its own approval.
    approve(&f.host, &refused).await;
    std::fs::write(&path, &original).expect("restore");
    f.host.reload(&path).await.expect("reload");
    let back = f.host.call(ship("ship", "o-1")).await.expect("call");
    assert_eq!(back.status, Status::AwaitingApproval, "{back:?}");
    assert!(back.error.as_ref().is_some_and(|e| e.message.contains(&format!("from {digest_b} to {digest_a}"))));
    approve(&f.host, &back).await;
    let shipped = f.host.call(ship("ship", "o-1")).await.expect("call");
    assert_eq!(shipped.status, Status::Completed, "{shipped:?}");
    f.provider.settled().await;
    assert_eq!(f.provider.counts("o-1").fulfillments, 1);
}

#[tokio::test]
async fn a_request_recorded_before_requests_named_their_component_needs_a_new_approval() {
    let f = Fixture::new().await;
    let first = f.host.call(ship("ship", "o-1")).await.expect("call");
    let key = first.operation_key.clone().expect("key");
    let fingerprint = first.fingerprint.clone().expect("fp");
    // What an older oncebox wrote: the same request without `component`, approved.
    let mut old = f.host.ledger().approval(&key).await.expect("read").expect("request");
    let mut json = serde_json::to_value(&old).expect("json");
    json.as_object_mut().expect("object").remove("component");
    old = serde_json::from_value(json).expect("an old record still reads");
    assert_eq!(old.component, None);
    old.revision += 1;
    f.host.ledger().put_approval(&old).await.expect("write the old record");
    // Approving it approves no code: refused, saying what to do instead.
    let refused = f.host.decide(&key, &fingerprint, Decision::Approve { expires_ms: None }, "test", None).await;
    assert!(refused.is_err_and(|e| e.to_string().contains("call the step again")));
    // Approved anyway (as an older oncebox would have): the call needs a new approval all the same.
    old.state = ApprovalState::Approved;
    old.revision += 1;
    f.host.ledger().put_approval(&old).await.expect("approved by an older oncebox");
    let renewed = f.host.call(ship("ship", "o-1")).await.expect("call");
    assert_eq!(renewed.status, Status::AwaitingApproval, "{renewed:?}");
    assert!(renewed.error.as_ref().is_some_and(|e| e.message.contains("before requests named their component")));
    f.provider.settled().await;
    assert_eq!(f.provider.requests(), 0);
    approve(&f.host, &renewed).await;
    let shipped = f.host.call(ship("ship", "o-1")).await.expect("call");
    assert_eq!(shipped.status, Status::Completed, "{shipped:?}");
    assert_eq!(f.provider.counts("o-1").fulfillments, 1);
}

#[tokio::test]
async fn an_expired_approval_shows_as_expired_and_lets_nothing_through_until_approved_again() {
    let f = Fixture::new().await;
    let first = f.host.call(ship("ship", "o-1")).await.expect("call");
    let (key, fingerprint) = (first.operation_key.clone().expect("key"), first.fingerprint.clone().expect("fp"));
    // Long enough that a loaded machine still reads it approved before it expires.
    let until = now_ms() + 1_000;
    f.host.decide(&key, &fingerprint, Decision::Approve { expires_ms: Some(until) }, "erin", None).await.expect("ok");
    let record = f.host.ledger().approval(&key).await.expect("read").expect("request");
    let view = oncebox::approvals::ApprovalView::of(&record, f.host.ledger());
    assert_eq!(view.state, ApprovalStanding::Approved);
    while now_ms() <= until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Stored as approved; shown as expired, derived from the clock.
    let record = f.host.ledger().approval(&key).await.expect("read").expect("request");
    assert_eq!(record.state, ApprovalState::Approved);
    let view = oncebox::approvals::ApprovalView::of(&record, f.host.ledger());
    assert_eq!(view.state, ApprovalStanding::Expired);
    assert_eq!(serde_json::to_value(&view).expect("json")["state"], "expired");
    let late = f.host.call(ship("ship", "o-1")).await.expect("call");
    assert_eq!(late.status, Status::AwaitingApproval, "{late:?}");
    assert_eq!(late.approval.as_ref().map(|v| v.state), Some(ApprovalStanding::Expired));
    assert!(late.error.as_ref().is_some_and(|e| e.message.contains("expired")));
    assert_eq!(f.provider.requests(), 0);
    // Approved again, it ships, once.
    f.host.decide(&key, &fingerprint, Decision::Approve { expires_ms: None }, "erin", None).await.expect("again");
    assert_eq!(f.host.call(ship("ship", "o-1")).await.expect("call").status, Status::Completed);
    assert_eq!(f.provider.counts("o-1").fulfillments, 1);
}

#[tokio::test]
async fn gc_removes_requests_nobody_decided_or_used_within_the_window_and_the_step_asks_again() {
    let f = Fixture::new().await;
    // Pending; approved and not used; approved with an expiry that passed; rejected.
    let pending = f.host.call(ship("pending", "o-1")).await.expect("call");
    let unused = f.host.call(ship("unused", "o-2")).await.expect("call");
    approve(&f.host, &unused).await;
    let expiring = f.host.call(ship("expiring", "o-3")).await.expect("call");
    let until = now_ms() + 20;
    let (key, fingerprint) = (expiring.operation_key.clone().expect("k"), expiring.fingerprint.clone().expect("f"));
    f.host.decide(&key, &fingerprint, Decision::Approve { expires_ms: Some(until) }, "t", None).await.expect("ok");
    let rejected = f.host.call(ship("rejected", "o-4")).await.expect("call");
    let (key, fingerprint) = (rejected.operation_key.clone().expect("k"), rejected.fingerprint.clone().expect("f"));
    f.host.decide(&key, &fingerprint, Decision::Reject, "t", None).await.expect("reject");
    while now_ms() <= until + 5 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Every write above is now at least a millisecond old: a zero window covers it.
    tokio::time::sleep(Duration::from_millis(5)).await;

    // Within the window, nothing goes.
    let kept = f.host.gc(Duration::from_secs(3600)).await.expect("gc");
    assert_eq!((kept.removed_operations, kept.removed_approvals), (0, 0), "{kept:?}");
    assert_eq!(f.host.ledger().approvals(None).await.expect("read").len(), 4);
    // Past it, every request goes: the rejection leaves its tombstone, the others nothing.
    let gc = f.host.gc(Duration::ZERO).await.expect("gc");
    assert_eq!((gc.removed_operations, gc.removed_approvals), (0, 4), "{gc:?}");
    assert!(f.host.ledger().approvals(None).await.expect("read").is_empty());

    // The lapsed steps ask again: a new request, which a person must approve; nothing shipped.
    for (lapsed, order) in [(&pending, "o-1"), (&unused, "o-2")] {
        let step = lapsed.approval.as_ref().expect("view").step_id.clone();
        let again = f.host.call(ship(&step, order)).await.expect("call");
        assert_eq!(again.status, Status::AwaitingApproval, "{again:?}");
        let key = again.operation_key.as_deref().expect("key");
        let record = f.host.ledger().approval(key).await.expect("read").expect("new request");
        assert_eq!((record.state, record.revision), (ApprovalState::Pending, 1));
    }
    let refused = f.host.call(ship("rejected", "o-4")).await.expect("call");
    assert_eq!(refused.status, Status::Expired, "the rejection stays final: {refused:?}");
    f.provider.settled().await;
    assert_eq!(f.provider.requests(), 0);
}

/// The same from the CLI, as an operator deploys and approves: real processes, one ledger file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_the_cli_a_replaced_component_is_shown_and_needs_its_own_approval() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("l.redb");
    let ledger_arg = ledger.to_str().expect("utf8");
    let component = dir.path().join("fulfill.wasm");
    let original = std::fs::read(oncebox_artifacts::FULFILL).expect("component");
    std::fs::write(&component, &original).expect("copy");
    let base = provider.base_url();
    let (config, grant) = (format!("base_url={base}"), format!("http={base}"));
    let args = fulfill("o-1").to_string();
    let ship = [
        "call",
        "--ledger",
        ledger_arg,
        "--config",
        &config,
        "--grant",
        &grant,
        "--run",
        "r",
        "--step",
        "ship",
        component.to_str().expect("utf8"),
        &args,
    ];
    let (code, awaiting, stderr) = oncebox(&ship);
    assert_eq!((code, awaiting["status"].as_str()), (1, Some("awaiting-approval")), "{awaiting} {stderr}");
    let key = awaiting["operation_key"].as_str().expect("key").to_string();
    let fingerprint = awaiting["fingerprint"].as_str().expect("fingerprint").to_string();
    let (_, shown, _) = oncebox(&["approvals", "show", "--ledger", ledger_arg, &key]);
    let digest_a = shown["component"].as_str().expect("the component is shown").to_string();
    assert!(shown["approve"].as_str().is_some_and(|a| a.contains(&digest_a)), "{shown}");

    std::fs::write(&component, rebuilt(&original, "b")).expect("replace");
    let approve = |component: &str| {
        oncebox(&[
            "approve",
            "--ledger",
            ledger_arg,
            &key,
            "--fingerprint",
            &fingerprint,
            "--component",
            component,
            "--by",
            "ops",
        ])
    };
    // Approved as shown (the old build), then called with the new build: nothing ships.
    let (code, _, stderr) = approve(&digest_a);
    assert_eq!(code, 0, "{stderr}");
    let (code, refused, stderr) = oncebox(&ship);
    assert_eq!((code, refused["status"].as_str()), (1, Some("awaiting-approval")), "{refused} {stderr}");
    let digest_b = refused["approval"]["component"].as_str().expect("the new component").to_string();
    assert_ne!(digest_a, digest_b);
    let why = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(why.contains(&format!("changed from {digest_a} to {digest_b}")), "{refused}");
    provider.settled().await;
    assert_eq!(provider.requests(), 0);
    let (_, listed, _) = oncebox(&["approvals", "list", "--ledger", ledger_arg, "--pending"]);
    assert_eq!((listed["component"].as_str(), listed["state"].as_str()), (Some(digest_b.as_str()), Some("pending")));

    // The old build's approval again: refused. The new one's: it ships, once.
    let (code, _, stderr) = approve(&digest_a);
    assert_ne!(code, 0, "{stderr}");
    assert!(stderr.contains("replaced since you looked"), "{stderr}");
    let (code, _, stderr) = approve(&digest_b);
    assert_eq!(code, 0, "{stderr}");
    let (code, shipped, stderr) = oncebox(&ship);
    assert_eq!((code, shipped["status"].as_str()), (0, Some("completed")), "{shipped} {stderr}");
    let (_, again, _) = oncebox(&ship);
    assert_eq!(again["replayed"], true);
    provider.settled().await;
    assert_eq!(provider.counts("o-1").fulfillments, 1);
}

/// `approvals show` prints a param holding a direction override (which would show the person
/// another order than the one bound) as its JSON escape: the same value to a JSON reader, and
/// nothing on the terminal that hides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_the_cli_a_param_that_would_hide_is_printed_as_its_escape() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let dir = tempfile::tempdir().expect("dir");
    let ledger = dir.path().join("l.redb");
    let ledger_arg = ledger.to_str().expect("utf8");
    let order = "o-\u{202E}4321";
    let args = fulfill(order).to_string();
    let flags = crate::support::call_flags(&ledger, &provider);
    let mut ship: Vec<&str> = flags.iter().map(String::as_str).collect();
    ship.extend(["--run", "r", "--step", "ship", oncebox_artifacts::FULFILL, args.as_str()]);
    let (code, awaiting, stderr) = oncebox(&ship);
    assert_eq!((code, awaiting["status"].as_str()), (1, Some("awaiting-approval")), "{awaiting} {stderr}");
    let key = awaiting["operation_key"].as_str().expect("key");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(["approvals", "show", "--ledger", ledger_arg, key])
        .output()
        .expect("approvals show");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("\"order_id\":\"o-\\u202e4321\"") && !printed.contains('\u{202E}'), "{printed}");
    let shown: Value = serde_json::from_str(printed.trim()).expect("one line of JSON");
    assert_eq!(shown["params"]["order_id"], order, "the same value: {shown}");
}
