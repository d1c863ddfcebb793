//! The people: the operator who decides approvals, reconciles, settles by hand, compensates,
//! reloads, runs `gc` and the outbox relay; the second person whose rejection races an approved
//! call; and the last pass, in which the operator settles what the callers left.

use std::time::Duration;

use serde_json::Value;

use oncebox_runtime::ledger::{ApprovalRecord, ApprovalState, OperationRecord, OperationStatus, Resolution};
use oncebox_runtime::{Call, Decision, Host, Relay};
use tokio::sync::mpsc::UnboundedReceiver;

use super::caller::{args_of, ask};
use super::{Act, Ctx, LAST_PASS, LAST_PASS_CALLER, LAST_PASS_REAL, LedgerAt, SEND_BY, compensate, same_everywhere};
use crate::history::Event;
use crate::plan::{Job, choice, percent};
use crate::world::route_of;

/// The operator, while the callers work: looks every `every_ms`.
pub(super) async fn operator(ctx: Ctx, host: Host) {
    let mut looked = 0u64;
    let mut reloads = ctx.plan.operator.reloads.clone();
    let mut upgrades = ctx.plan.upgrades.clone();
    let mut gcs = ctx.plan.operator.gcs.clone();
    let mut jumps = if ctx.ledger_is_file() { ctx.plan.clock_jumps.clone() } else { Vec::new() };
    let relay = host.outbox_relay();
    loop {
        tokio::time::sleep(Duration::from_millis(ctx.plan.operator.every_ms)).await;
        looked += 1;
        let into_life = looked * ctx.plan.operator.every_ms;
        for (at, delta) in std::mem::take(&mut jumps) {
            if at > into_life {
                jumps.push((at, delta));
                continue;
            }
            crate::clock::jump(delta);
            ctx.history.push(Event::ClockJumped { delta_ms: delta });
        }
        look(&ctx, &host, false).await;
        // On several hosts each host's relay runs on its own (`drive::relays`).
        if ctx.hosts.is_none() {
            relay_pass(&ctx, relay.as_ref().ok()).await;
        }
        for (at, tool) in std::mem::take(&mut reloads) {
            if at > into_life {
                reloads.push((at, tool));
                continue;
            }
            let path = match tool.as_str() {
                // The build deployed.
                "charge" => Some(ctx.builds.charge.clone()),
                _ => oncebox_artifacts::EXAMPLE_TOOLS
                    .iter()
                    .find(|p| p.ends_with(&format!("{tool}.wasm")))
                    .map(std::path::PathBuf::from),
            };
            let result = match path {
                Some(path) => crate::paced::blocking(Box::pin(host.reload(path)))
                    .await
                    .map_or_else(|e| format!("error: {e}"), |_| "reloaded".into()),
                None => "no such tool".into(),
            };
            ctx.history.push(Event::Reloaded { tool, result });
        }
        if upgrades.iter().any(|at| *at <= into_life) {
            upgrades.retain(|at| *at > into_life);
            upgrade(&ctx, &host).await;
        }
        // A person asks again for the compensation of a run already undone (a retry of a call
        // whose answer they did not see): answered from the records, whatever build runs now.
        let undone: Vec<String> = ctx.shared().undone.iter().cloned().collect();
        for run in undone {
            if percent(ctx.plan.seed, &["undo-again", &run, &looked.to_string()]) < 3 {
                compensate(&ctx, &host, &run, "operator, again").await;
            }
        }
        if gcs.iter().any(|at| *at <= into_life) {
            gcs.retain(|at| *at > into_life);
            collect(&ctx, &host).await;
        }
        // A person undoing an order midway, racing its steps.
        for job in &ctx.plan.jobs {
            if let Job::Order { run, .. } = job
                && percent(ctx.plan.seed, &["midway", run, &looked.to_string()]) < ctx.plan.operator.compensate_pct
            {
                compensate(&ctx, &host, run, "operator").await;
            }
        }
    }
}

/// Deploys the other build of `charge`: the one naming `refun2` as its compensation, or back.
async fn upgrade(ctx: &Ctx, host: &Host) {
    let build = if ctx.shared().charge_build == 2 { 1 } else { 2 };
    let result = match ctx.builds.deploy(build) {
        Ok(()) => {
            ctx.shared().charge_build = build;
            match crate::paced::blocking(Box::pin(host.reload(&ctx.builds.charge))).await {
                Ok(manifest) => {
                    format!("build {build}, compensated by {}", manifest.compensated_by.as_deref().unwrap_or("nothing"))
                }
                Err(e) => format!("build {build}: error: {e}"),
            }
        }
        Err(e) => format!("error: {e:#}"),
    };
    ctx.history.push(Event::Reloaded { tool: "charge".into(), result });
}

/// One look of the operator: decides requests for approval, reconciles what is unknown, settles
/// by hand what stays unknown, and (`last`) compensates the runs waiting for it.
async fn look(ctx: &Ctx, host: &Host, last: bool) {
    let ledger = host.ledger().clone();
    if let Ok(approvals) = ledger.approvals(None).await {
        for record in approvals.into_iter().filter(|a| a.state == ApprovalState::Pending) {
            decide(ctx, host, &record, last).await;
        }
    }
    let Ok(operations) = ledger.operations(None).await else {
        return;
    };
    let now = ledger.now_ms();
    let due = {
        let mut shared = ctx.shared();
        let due = last || now >= shared.reconciled_ms.saturating_add(ctx.plan.operator.reconcile_every_ms);
        if due {
            shared.reconciled_ms = now;
        }
        due
    };
    for op in operations.iter().filter(|op| due && op.status == OperationStatus::Unknown) {
        reconcile(ctx, host, op).await;
    }
    if last {
        let runs: Vec<String> = ctx.shared().to_compensate.iter().cloned().collect();
        for run in runs {
            compensate(ctx, host, &run, "operator").await;
        }
    }
}

/// Decides one request for approval of the params the operator sees, now and then with a second
/// person's rejection racing the approval's use.
async fn decide(ctx: &Ctx, host: &Host, record: &ApprovalRecord, last: bool) {
    let seed = ctx.plan.seed;
    // Once the callers are done, a run being undone gets no new shipment.
    let ending = last && ctx.shared().to_compensate.contains(&record.run_id);
    let approve =
        !ending && percent(seed, &["reject", &record.run_id, &record.step_id]) >= ctx.plan.operator.reject_pct;
    let racing =
        approve && percent(seed, &["race", &record.run_id, &record.step_id]) < ctx.plan.operator.racing_reject_pct;
    if racing && !last && percent(seed, &["at-once", &record.run_id, &record.step_id]) < 50 {
        // Two people decide at once, one each way, while the orchestrator calls the step again
        // (at once, or a few ms later: while a decision's write may still be held, `race.rs`).
        let call = args_of(ctx, &record.run_id, &record.step_id)
            .map(|args| Call::step(&record.run_id, &record.step_id, &record.tool, args));
        let later =
            choice(seed, &["at-once-call", &record.run_id, &record.step_id]) % ctx.plan.operator.every_ms.max(1);
        let calling = async {
            let Some(call) = call else { return };
            tokio::time::sleep(Duration::from_millis(later)).await;
            // An error is the host's refusal to run it now; what counts is what reached the downstream.
            if let Ok(outcome) = host.call(call).await {
                ctx.history.push(Event::Called {
                    caller: "the orchestrator, again".into(),
                    run: record.run_id.clone(),
                    step: record.step_id.clone(),
                    tool: record.tool.clone(),
                    order: crate::plan::order_in(&record.args).map(str::to_string),
                    status: outcome.status,
                    replayed: outcome.replayed,
                    operation_key: outcome.operation_key.clone(),
                    output: outcome.output.clone(),
                    error: outcome.error.as_ref().map(|e| same_everywhere(ctx, &e.message)),
                });
            }
        };
        let (approving, rejecting) =
            (decide_as(ctx, host, record, true, "sim-operator"), decide_as(ctx, host, record, false, "second-person"));
        // In the order they are first polled: the call between the two decisions, or after both;
        // or the rejection first (whose write the store may hold back: `race.rs`).
        match percent(seed, &["at-once-order", &record.run_id, &record.step_id]) % 3 {
            0 => tokio::join!(approving, calling, rejecting),
            1 => tokio::join!(approving, rejecting, calling),
            _ => tokio::join!(rejecting, approving, calling),
        };
        return;
    }
    decide_as(ctx, host, record, approve, "sim-operator").await;
    if racing {
        if percent(seed, &["race-when", &record.run_id, &record.step_id]) < 50 {
            // The second person rejects the moment the approved call is about to send.
            ctx.shared().armed.insert(record.operation_key.clone(), record.clone());
            return;
        }
        // The second person acts a few ms after the approval, before or while the caller uses it.
        let (ctx, host, record) = (ctx.clone(), host.clone(), record.clone());
        tokio::spawn(async move {
            let delay = percent(ctx.plan.seed, &["race-at", &record.run_id]) % 7;
            tokio::time::sleep(Duration::from_millis(delay)).await;
            decide_as(&ctx, &host, &record, false, "second-person").await;
        });
    }
}

/// One person's decision on `record`, of the params they see, recorded in the history.
pub(super) async fn decide_as(ctx: &Ctx, host: &Host, record: &ApprovalRecord, approve: bool, by: &str) {
    let decision = if approve { Decision::Approve { expires_ms: None } } else { Decision::Reject };
    let decided = host
        .decide_on(&record.operation_key, &record.fingerprint, record.component.as_deref(), decision, by, None)
        .await;
    ctx.history.push(Event::Decided {
        run: record.run_id.clone(),
        step: record.step_id.clone(),
        approve,
        params: host.reveal(record).unwrap_or(Value::Null),
        component: record.component.clone(),
        result: decided.as_ref().map_or_else(|e| format!("refused: {e}"), |r| r.state.as_str().to_string()),
    });
}

/// The second person: rejects each armed request the moment its call reaches the point before its
/// write-ahead, or undoes a run as one of its requests is about to leave (the hooks send the act
/// here, then yield so that this runs while the call waits).
pub(super) async fn second_person(ctx: Ctx, host: Host, mut acts: UnboundedReceiver<Act>) {
    while let Some(act) = acts.recv().await {
        match act {
            Act::Reject(record) => decide_as(&ctx, &host, &record, false, "second-person").await,
            Act::Collect => collect(&ctx, &host).await,
            Act::Undo(operation_key) => {
                // Its claim may be in memory only (nothing of it durable yet): in flight.
                let in_flight = host.ledger().in_flight(None).await.unwrap_or_default();
                let run = in_flight.into_iter().find(|op| op.key == operation_key).map(|op| op.run_id);
                let run = match run {
                    Some(run) => Some(run),
                    None => host.ledger().operation(&operation_key).await.ok().flatten().map(|op| op.run_id),
                };
                // Orders only: a single call's run has nothing to undo.
                if let Some(run) = run.filter(|run| run.starts_with("run-")) {
                    compensate(&ctx, &host, &run, "a second person, as a request leaves").await;
                }
            }
        }
    }
}

/// Runs `gc` with the seed's retention.
pub(super) async fn collect(ctx: &Ctx, host: &Host) {
    let retention = Duration::from_millis(ctx.plan.gc_retention_ms);
    let result = host.gc(retention).await.map_or_else(|e| format!("error: {e}"), |r| format!("{r:?}"));
    ctx.history.push(Event::Collected { result });
}

/// Reconciles an unknown operation; after a few tries that settle nothing, settles it by hand
/// from the downstream's own record (a person reading the provider's dashboard), once nothing of
/// it is still on its way.
async fn reconcile(ctx: &Ctx, host: &Host, op: &OperationRecord) {
    let answer = match host.reconcile_operation(&op.key).await {
        Ok(Some(answer)) => match answer.answer {
            oncebox_runtime::Reconciliation::Committed { outcome } => format!("committed: {}", outcome.status.as_str()),
            oncebox_runtime::Reconciliation::NotCommitted { .. } => "not-committed".into(),
            oncebox_runtime::Reconciliation::StillUnknown { reason, .. } => format!("still unknown: {reason}"),
            other => format!("{other:?}"),
        },
        Ok(None) => "no such operation".into(),
        Err(e) => format!("error: {e}"),
    };
    let not_taken = answer == "not-committed";
    ctx.history.push(Event::Reconciled { run: op.run_id.clone(), operation_key: op.key.clone(), answer });
    let now = host.ledger().now_ms();
    let (tries, since) = {
        let mut shared = ctx.shared();
        let tries = shared.reconciles.entry(op.key.clone()).or_insert((0, now));
        tries.0 += 1;
        (tries.0, now.saturating_sub(tries.1))
    };
    if not_taken {
        return refund_it_myself(ctx, host, op).await;
    }
    let Some(route) = route_of(&op.tool) else {
        return;
    };
    let order = crate::plan::order_in(&op.args).unwrap_or_default();
    // A person settles by hand only what reconciling could not, given time to (past the point an
    // empty lookup counts as proof: the send deadline, the timeout and the settle window, twice
    // over), and once nothing of it is still on its way.
    let provable =
        oncebox_runtime::clock::millis(SEND_BY) + ctx.plan.downstream.timeout_ms + ctx.plan.downstream.settle_window_ms;
    if tries < 6 || since < 2 * provable || ctx.world.pending(route, order) {
        return;
    }
    let Ok(Some(now)) = host.ledger().operation(&op.key).await else {
        return;
    };
    if now.status != OperationStatus::Unknown {
        return;
    }
    let committed = ctx.world.commits().into_iter().find(|c| c.route == route && c.order == order);
    let resolution = match &committed {
        Some(commit) => Resolution::Committed { output: commit.response.to_string() },
        None => Resolution::NotCommitted,
    };
    let result = host
        .resolve(&op.key, None, &resolution, "sim-operator", Some("read the provider's own record"))
        .await
        .map_or_else(|e| format!("refused: {e}"), |o| o.status.as_str().to_string());
    ctx.history.push(Event::Settled {
        run: op.run_id.clone(),
        operation_key: op.key.clone(),
        committed: committed.is_some(),
        result,
    });
    if committed.is_none() {
        refund_it_myself(ctx, host, op).await;
    }
}

/// A refund found not taken (by a reconcile, or a person's settlement) is reopened, for
/// compensate to send again. Now and then the person who looked refunds the charge themselves
/// instead, and says so: the word ends the reopened refund, and no compensate may send it too (a
/// compensate that resumed it meanwhile has it, and the word is refused).
async fn refund_it_myself(ctx: &Ctx, host: &Host, op: &OperationRecord) {
    let undone = op.step_id.strip_prefix(oncebox_runtime::saga::COMPENSATION_PREFIX);
    if let Some(undone) = undone.filter(|_| route_of(&op.tool) == Some("refunds"))
        && percent(ctx.plan.seed, &["refund-it-myself", &op.key]) < 50
    {
        let note = "the refund did not go: refunded it myself";
        super::word_then_refund(ctx, host, &op.run_id, undone.to_string(), note).await;
    }
}

/// One pass of the outbox relay; whether every message is delivered.
pub(super) async fn relay_pass(ctx: &Ctx, relay: Option<&Relay>) -> bool {
    let Some(relay) = relay else {
        ctx.history.push(Event::Relayed { result: "no relay".into() });
        return false;
    };
    match relay.deliver_pending().await {
        Ok(summary) => {
            let sends: u64 = summary.topics.iter().map(|t| t.sends).sum();
            if sends > 0 {
                let result = format!("{} delivered in {sends} sends", summary.delivered());
                ctx.history.push(Event::Relayed { result });
            }
            summary.all_delivered()
        }
        Err(e) => {
            ctx.history.push(Event::Relayed { result: format!("error: {e}") });
            false
        }
    }
}

/// After the callers are done: the operator settles and compensates until no run is open (or
/// [`LAST_PASS`] is over), and what is still on its way at the downstream lands.
pub(super) async fn last_pass(ctx: &Ctx, host: &Host) -> anyhow::Result<()> {
    let step = Duration::from_millis(ctx.plan.downstream.settle_window_ms.max(ctx.plan.operator.every_ms));
    let budget = match ctx.ledger {
        LedgerAt::File(_) => LAST_PASS,
        LedgerAt::Database(_) => LAST_PASS_REAL,
    };
    let rounds = (budget.as_millis() / step.as_millis().max(1)) as u32;
    let relay = host.outbox_relay();
    for _ in 0..rounds.max(1) {
        look(ctx, host, true).await;
        let delivered = relay_pass(ctx, relay.as_ref().ok()).await;
        // Steps a caller left (unknown, awaiting): called again, as the orchestrator would.
        let open = host.ledger().open_runs(None, host.ledger().now_ms()).await?;
        if open.is_empty() && delivered && !ctx.world.any_pending() && ctx.shared().to_compensate.is_empty() {
            return Ok(());
        }
        for (run, steps) in &open {
            let undoing = {
                let shared = ctx.shared();
                shared.to_compensate.contains(run) || shared.undone.contains(run)
            };
            if undoing {
                continue;
            }
            for open in steps {
                if let Some(op) = host.ledger().operation(&open.operation_key).await?
                    && matches!(op.status, OperationStatus::Claimed)
                {
                    let call =
                        Call::step(run, &op.step_id, &op.tool, args_of(ctx, run, &op.step_id).unwrap_or_default());
                    if !call.args.is_empty() {
                        ask(ctx, host, LAST_PASS_CALLER, call).await;
                    }
                }
            }
        }
        tokio::time::sleep(step).await;
    }
    Ok(())
}
