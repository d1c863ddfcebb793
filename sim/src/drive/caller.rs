//! The orchestrators: each works through its jobs, calling a step until it has an answer it can
//! act on, and compensating a run whose step failed; they start no step of a run once someone asked
//! to undo it (what they started, a stale retry may call again once it is undone: see
//! `call_again_after_undo`).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::{Value, json};

use oncebox_runtime::{Call, Host, Status};

use super::{Ctx, LAST_PASS_CALLER, MAX_ASKS, OTHER_WORKER, compensate, same_everywhere};
use crate::history::Event;
use crate::plan::{Job, charge_args, fulfill_args, notify_args};

/// One caller: its jobs, from the first it has not finished (after a crash it starts that one
/// again: its steps that completed are answered from the ledger).
pub(super) async fn caller(ctx: Ctx, host: Host, c: usize) {
    let jobs: Vec<Job> = ctx.plan.jobs.iter().filter(|j| j.callers().contains(&c)).cloned().collect();
    let first = ctx.shared().next_job[c];
    for job in jobs.into_iter().skip(first) {
        match &job {
            Job::Order { .. } => order(&ctx, &host, c, &job).await,
            Job::Call { run, step, tool, args, repeats, conflicting, .. } => {
                for n in 0..*repeats {
                    let args = if *conflicting && n + 1 == *repeats { conflict(args) } else { args.clone() };
                    ask(&ctx, &host, c, Call::step(run, step, tool, args.to_string())).await;
                }
            }
        }
        ctx.shared().next_job[c] += 1;
    }
}

/// The order workflow, as an orchestrator runs it.
async fn order(ctx: &Ctx, host: &Host, c: usize, job: &Job) {
    let Job::Order { run, order, sku, quantity, amount_cents, cancel, .. } = job else {
        return;
    };
    let steps: Vec<(&str, &str, Value)> = vec![
        ("1-stock", "stock", json!({"sku": sku})),
        ("2-reserve", "reserve", json!({"order_id": order, "sku": sku, "quantity": quantity})),
        ("3-charge", "charge", charge_args(order, *amount_cents)),
        ("4-fulfill", "fulfill", fulfill_args(order, sku, *quantity)),
        ("5-notify", "notify", notify_args(order)),
    ];
    for (step, tool, args) in steps {
        // Once someone asked to undo the run, its orchestrators start none of its steps.
        if ctx.shared().to_compensate.contains(run) || ctx.shared().undone.contains(run) {
            return;
        }
        if *cancel && tool == "fulfill" {
            compensate(ctx, host, run, &format!("caller {c}")).await;
            return;
        }
        let status = ask(ctx, host, c, Call::step(run, step, tool, args.to_string())).await;
        match status {
            Some(Status::Completed) => {}
            // Nothing to undo before the first write.
            _ if tool == "stock" => return,
            _ => {
                compensate(ctx, host, run, &format!("caller {c}")).await;
                return;
            }
        }
    }
}

/// Calls a step until it has an answer a caller can act on: completed, failed, rejected, a
/// conflict, expired; or leaves it (unknown, awaiting, in progress) after [`MAX_ASKS`].
pub(super) async fn ask(ctx: &Ctx, host: &Host, c: usize, call: Call) -> Option<Status> {
    let order =
        serde_json::from_str::<Value>(&call.args).ok().and_then(|a| crate::plan::order_in(&a).map(str::to_string));
    let (run, step) = (call.run_id.clone().unwrap_or_default(), call.step_id.clone().unwrap_or_default());
    let mut last = None;
    for asked in 0..MAX_ASKS {
        let undoing = {
            let shared = ctx.shared();
            shared.to_compensate.contains(&run) || shared.undone.contains(&run)
        };
        if undoing && c != LAST_PASS_CALLER {
            return last;
        }
        {
            let mut shared = ctx.shared();
            shared.calls += 1;
            // Started and not yet known completed: what an orchestrator's retry may call again.
            let left = shared.left.entry(run.clone()).or_default();
            if !left.iter().any(|c| c.step_id == call.step_id) {
                left.push(call.clone());
            }
        }
        // A call that may stop dead past its lease, while another worker takes its step over.
        let (ctx2, host2, call2) = (ctx.clone(), host.clone(), call.clone());
        let on_pause = Box::new(move |after: Duration| {
            let worker = tokio::spawn(again_after(ctx2.clone(), host2, call2, after));
            ctx2.shared().workers.push(worker.abort_handle());
        });
        let owner = ctx.fences.owner(&run, &step, order.clone(), on_pause);
        let answered = match &ctx.hosts {
            None => crate::pause::frozen(owner, host.call(call.clone())).await.map_err(|e| e.to_string()),
            // Behind the balancer: each ask of a caller goes to the next live host.
            Some(hosts) => {
                let call = call.clone();
                let work = |host: Host| async move { crate::pause::frozen(owner, host.call(call)).await };
                match hosts.on(c + asked as usize, work).await {
                    Some(Ok(answered)) => answered.map_err(|e| e.to_string()),
                    Some(Err(died)) => Err(died.to_string()),
                    None => Err("no host is up".to_string()),
                }
            }
        };
        let wait = match answered {
            Ok(outcome) => {
                ctx.history.push(Event::Called {
                    caller: format!("caller {c}"),
                    run: run.clone(),
                    step: step.clone(),
                    tool: call.tool.clone(),
                    order: order.clone(),
                    status: outcome.status,
                    replayed: outcome.replayed,
                    operation_key: outcome.operation_key.clone(),
                    output: outcome.output.clone(),
                    error: outcome.error.as_ref().map(|e| same_everywhere(ctx, &e.message)),
                });
                last = Some(outcome.status);
                if outcome.status == Status::Completed
                    && let Some(left) = ctx.shared().left.get_mut(&run)
                {
                    left.retain(|c| c.step_id != call.step_id);
                }
                match outcome.status {
                    Status::AwaitingApproval | Status::InProgress => {
                        Duration::from_millis(ctx.plan.operator.every_ms * 2)
                    }
                    Status::Unknown => Duration::from_millis(ctx.plan.downstream.settle_window_ms / 2),
                    _ => return last,
                }
            }
            Err(e) => {
                ctx.history.push(Event::CallError {
                    caller: format!("caller {c}"),
                    run: run.clone(),
                    step: step.clone(),
                    tool: call.tool.clone(),
                    error: same_everywhere(ctx, &e),
                });
                Duration::from_millis(100)
            }
        };
        tokio::time::sleep(wait).await;
    }
    last
}

/// Another worker of the orchestrator, whose call of a step stopped dead: it calls the step
/// `after` (once the paused call's lease has run out), and takes it over.
fn again_after(ctx: Ctx, host: Host, call: Call, after: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        tokio::time::sleep(after).await;
        ask(&ctx, &host, OTHER_WORKER, call).await;
    })
}

/// The same step with other args: a caller that re-plans under an old step id.
fn conflict(args: &Value) -> Value {
    let mut other = args.clone();
    if let Some(fields) = other.as_object_mut() {
        for (name, value) in fields.iter_mut() {
            match name.as_str() {
                "amount_cents" | "quantity" => *value = json!(value.as_u64().unwrap_or(0) + 1),
                "template" => *value = json!("cancelled"),
                "sku" => *value = json!(format!("{}-other", value.as_str().unwrap_or_default())),
                "address" => *value = json!("elsewhere"),
                _ => {}
            }
        }
    }
    other
}

/// The args a run's step was called with, from the plan (the ledger keeps them redacted).
pub(super) fn args_of(ctx: &Ctx, run_id: &str, step_id: &str) -> Option<String> {
    ctx.plan.jobs.iter().find_map(|job| match job {
        Job::Call { run, step, args, .. } if run == run_id && step == step_id => Some(args.to_string()),
        Job::Order { run, order, sku, quantity, amount_cents, .. } if run == run_id => {
            let args = match step_id {
                "1-stock" => json!({"sku": sku}),
                "2-reserve" => json!({"order_id": order, "sku": sku, "quantity": quantity}),
                "3-charge" => charge_args(order, *amount_cents),
                "4-fulfill" => fulfill_args(order, sku, *quantity),
                "5-notify" => notify_args(order),
                _ => return None,
            };
            Some(args.to_string())
        }
        _ => None,
    })
}
