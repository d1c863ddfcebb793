//! The checker: what must hold of every seed's history, judged by the downstream's own record of
//! what reached it and what it committed, not by what the host believes. Pure over [`Facts`]
//! (gathered once the seed is over), so that each invariant is tested on a history made by hand.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use oncebox_runtime::Host;
use oncebox_runtime::ledger::{
    ApprovalRecord, ApprovalState, Open, OperationRecord, OperationStatus, OutboxMessage, Tombstone, Why,
};
use oncebox_runtime::{LedgerError, Status};

use crate::history::{Entry, Event, History};
use crate::pause::Breach;
use crate::plan::{Job, Plan, SKUS};
use crate::world::{Commit, Delivery, Request, World, route_of};

/// What a seed left: the downstream's record, the history, and the ledger as a last reader sees it.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub requests: Vec<Request>,
    pub commits: Vec<Commit>,
    pub history: Vec<Entry>,
    pub operations: Vec<OperationRecord>,
    pub approvals: Vec<ApprovalRecord>,
    /// Operation keys every open run names (run_state's one rule).
    pub named_open: BTreeSet<String>,
    /// What keeps each open run open.
    pub open: BTreeMap<String, Vec<Open>>,
    /// Runs whose compensation was asked for and had not finished when the seed ended.
    pub compensating: BTreeSet<String>,
    /// Operation keys whose records `gc` removed (a tombstone stands for them).
    pub collected: BTreeSet<String>,
    /// Their tombstones.
    pub tombstones: Vec<Tombstone>,
    /// The retention the seed's gc ran with.
    pub gc_retention_ms: u64,
    /// How far the host's clock may have been stepped, all told (its stamps are that unsure).
    pub clock_slack_ms: u64,
    /// When the history began (world ms): an entry happened at this plus its `at_ms`.
    pub started_ms: u64,
    pub outbox: Vec<OutboxMessage>,
    /// What the outbox topic's endpoint took, in order.
    pub deliveries: Vec<Delivery>,
    /// Per order: the reservation's (sku, quantity), where one is held.
    pub reservations: BTreeMap<String, (String, u64)>,
    /// Per SKU: the units the reservations counter says are held.
    pub reserved: BTreeMap<String, u64>,
    /// The digest of the `fulfill` component loaded.
    pub fulfill_digest: Option<String>,
    /// The params and component of every request the ledger holds approved (opened): a decision
    /// recorded whose answer a crash lost (its person never heard, so the history has no
    /// `Decided` for it) is a decision all the same.
    pub ledger_approved: Vec<(Value, Option<String>)>,
    /// Orders of the order workflow (their refunds are compensations).
    pub workflow_orders: BTreeSet<String>,
    /// What paused owners wrote or sent once another had taken their step over (`pause.rs`).
    pub breaches: Vec<Breach>,
}

/// An invariant that did not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    /// The run and order it concerns (what the printed history is cut to).
    pub run: String,
    pub order: String,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({} / {}): {}", self.invariant, self.run, self.order, self.detail)
    }
}

impl Facts {
    pub async fn gather(
        plan: &Plan,
        world: &World,
        history: &History,
        host: &Host,
        compensating: BTreeSet<String>,
        breaches: Vec<Breach>,
    ) -> Result<Facts, LedgerError> {
        let ledger = host.ledger();
        let started_ms = history.start_ms();
        let history = history.entries();
        let mut collected = BTreeSet::new();
        let mut tombstones = Vec::new();
        // Every step of the workload, whether or not its caller heard an answer (a crash may
        // take the answer of a step that completed, and gc its record afterwards).
        let mut keys: Vec<String> = history
            .iter()
            .filter_map(|entry| match &entry.event {
                Event::Called { operation_key: Some(key), .. } => Some(key.clone()),
                _ => None,
            })
            .collect();
        for job in &plan.jobs {
            match job {
                Job::Order { run, .. } => {
                    for (step, tool) in [
                        ("1-stock", "stock"),
                        ("2-reserve", "reserve"),
                        ("3-charge", "charge"),
                        ("4-fulfill", "fulfill"),
                        ("5-notify", "notify"),
                    ] {
                        keys.push(oncebox_runtime::keys::operation_key(run, step, tool));
                    }
                }
                Job::Call { run, step, tool, .. } => keys.push(oncebox_runtime::keys::operation_key(run, step, tool)),
            }
        }
        for key in keys {
            if !collected.contains(&key)
                && let Some(tombstone) = ledger.tombstone(&key).await?
            {
                collected.insert(key);
                tombstones.push(tombstone);
            }
        }
        let open = ledger.open_runs(None, ledger.now_ms()).await?;
        let named_open = open.values().flatten().map(|open| open.operation_key.clone()).collect();
        let mut reservations = BTreeMap::new();
        for order in plan.order_ids() {
            if let Some(bytes) = ledger.kv_get("reservations", &format!("reservation/{order}")).await?
                && let Ok(held) = serde_json::from_slice::<Value>(&bytes)
            {
                let sku = held.get("sku").and_then(Value::as_str).unwrap_or_default().to_string();
                reservations.insert(order, (sku, held.get("quantity").and_then(Value::as_u64).unwrap_or(0)));
            }
        }
        let mut reserved = BTreeMap::new();
        for sku in SKUS {
            let count = ledger.kv_get("reservations", &format!("reserved/{sku}")).await?;
            let count = count.and_then(|bytes| serde_json::from_slice::<u64>(&bytes).ok()).unwrap_or(0);
            reserved.insert(sku.to_string(), count);
        }
        let workflow_orders = plan
            .jobs
            .iter()
            .filter_map(|job| match job {
                Job::Order { order, .. } => Some(order.clone()),
                Job::Call { .. } => None,
            })
            .collect();
        let approvals = ledger.approvals(None).await?;
        let ledger_approved = approvals
            .iter()
            .filter(|a| a.state == ApprovalState::Approved)
            .map(|a| (host.reveal(a).unwrap_or(Value::Null), a.component.clone()))
            .collect();
        Ok(Facts {
            requests: world.requests(),
            commits: world.commits(),
            history,
            operations: ledger.operations(None).await?,
            approvals,
            ledger_approved,
            named_open,
            open,
            compensating,
            collected,
            tombstones,
            gc_retention_ms: plan.gc_retention_ms,
            started_ms,
            // Each life's operator makes the plan's steps again.
            clock_slack_ms: plan.clock_jumps.iter().map(|(_, d)| d.unsigned_abs()).sum::<u64>()
                * (plan.crashes.len() as u64 + 1),
            outbox: ledger.outbox().await?,
            deliveries: world.deliveries(),
            reservations,
            reserved,
            fulfill_digest: host.digest("fulfill"),
            workflow_orders,
            breaches,
        })
    }
}

/// Every invariant over `facts`; empty when the seed kept every promise.
pub fn check(facts: &Facts) -> Vec<Violation> {
    let mut found = Vec::new();
    once_per_operation(facts, &mut found);
    failed_took_nothing(facts, &mut found);
    rejected_sent_nothing(facts, &mut found);
    irreversible_only_approved(facts, &mut found);
    compensations(facts, &mut found);
    undone_once(facts, &mut found);
    undone_stays_undone(facts, &mut found);
    compensation_finishes(facts, &mut found);
    irreversible_sent_once(facts, &mut found);
    irreversible_never_resent(facts, &mut found);
    acknowledged_survive(facts, &mut found);
    completed_took_effect(facts, &mut found);
    outbox_once(facts, &mut found);
    outbox_delivered_in_order(facts, &mut found);
    reservations_counted(facts, &mut found);
    nothing_stuck_silently(facts, &mut found);
    taken_over_owners_fenced(facts, &mut found);
    collected_only_what_was_over(facts, &mut found);
    found
}

/// `gc` removes only what is over and no one may still need: an operation that ended (completed
/// or failed; a rejected request), at least the retention before, of a run that nothing kept
/// open when it was removed (no step of it claimed or unknown then: a saga, a reconcile or a
/// caller's repeat may still need every record of such a run). Judged by the records a last
/// reader sees: a step of the run that began before the removal and ended after it (or never)
/// was open at the removal.
fn collected_only_what_was_over(facts: &Facts, found: &mut Vec<Violation>) {
    for stone in &facts.tombstones {
        let order = facts.operations.iter().find(|op| op.run_id == stone.run_id).map(order_of).unwrap_or_default();
        let ended = matches!(stone.status, OperationStatus::Completed | OperationStatus::Failed) || stone.rejected;
        if !ended {
            let detail = format!("{} was removed while {}", stone.step_id, stone.status.as_str());
            found.push(violation("collected-while-open", &stone.run_id, &order, detail));
        }
        if stone.ended_ms.saturating_add(facts.gc_retention_ms) > stone.removed_ms.saturating_add(facts.clock_slack_ms)
        {
            let detail = format!(
                "{} ended at {} and was removed at {}, inside the retention of {} ms",
                stone.step_id, stone.ended_ms, stone.removed_ms, facts.gc_retention_ms
            );
            found.push(violation("collected-too-soon", &stone.run_id, &order, detail));
        }
        // A rejected request goes whatever its run (`retention::gc`): its tombstone answers as
        // the request did, and nothing of it ran (sim/README.md: a finding).
        let open_then = facts.operations.iter().filter(|_| !stone.rejected).find(|op| {
            let over = matches!(op.status, OperationStatus::Completed | OperationStatus::Failed);
            let slack = facts.clock_slack_ms;
            op.run_id == stone.run_id
                && op.created_ms.saturating_add(slack) < stone.removed_ms
                && (!over || op.updated_ms > stone.removed_ms.saturating_add(slack))
        });
        if let Some(op) = open_then {
            let detail = format!(
                "{} was removed at {} while {} of its run was open (begun at {}, {} since {})",
                stone.step_id,
                stone.removed_ms,
                op.step_id,
                op.created_ms,
                op.status.as_str(),
                op.updated_ms
            );
            found.push(violation("collected-while-open", &stone.run_id, &order, detail));
        }
    }
}

/// An owner paused past its lease, whose step another took over, is fenced when it resumes: the
/// store refuses every write it makes with its old fence, and nothing it wrote ahead leaves
/// (its send deadline has passed: `late`).
fn taken_over_owners_fenced(facts: &Facts, found: &mut Vec<Violation>) {
    for breach in &facts.breaches {
        let invariant = if breach.what == "sent" { "taken-over-owner-sent" } else { "taken-over-owner-wrote" };
        let order = breach.order.clone().unwrap_or_default();
        let detail = format!("{}/{} resumed after a take-over: {}", breach.run, breach.step, breach.detail);
        found.push(violation(invariant, &breach.run, &order, detail));
    }
}

/// The order a run of the workload concerns, by the plan's names (`run-N`: `o-N`; a single
/// call's `call-N`: `x-N`).
pub(crate) fn order_of_run(run: &str) -> String {
    match (run.strip_prefix("run-"), run.strip_prefix("call-")) {
        (Some(n), _) => format!("o-{n}"),
        (_, Some(n)) => format!("x-{n}"),
        _ => String::new(),
    }
}

fn order_of(op: &OperationRecord) -> String {
    crate::plan::order_in(&op.args).unwrap_or_default().to_string()
}

/// What the host's effects committed for `route` and `order` (not a person at the dashboard).
fn commits<'a>(facts: &'a Facts, route: &str, order: &str) -> Vec<&'a Commit> {
    facts.commits.iter().filter(|c| c.route == route && c.order == order && !c.by_hand()).collect()
}

/// How many refunds `order` had, the host's and those a person made at the dashboard (after the
/// host named the step for a person to undo by hand).
fn refunds(facts: &Facts, order: &str) -> usize {
    facts.commits.iter().filter(|c| c.route == "refunds" && c.order == order).count()
}

fn violation(invariant: &'static str, run: &str, order: &str, detail: String) -> Violation {
    Violation { invariant, run: run.to_string(), order: order.to_string(), detail }
}

/// The run an order's operations belong to (the workload gives each order one run).
fn run_of(facts: &Facts, order: &str) -> String {
    let op = facts.operations.iter().find(|op| order_of(op) == order);
    op.map(|op| op.run_id.clone()).unwrap_or_default()
}

/// Every route and order belongs to one operation (the workload keeps them apart), so two commits
/// for one route and order are one effect committed twice.
fn once_per_operation(facts: &Facts, found: &mut Vec<Violation>) {
    let mut counts: BTreeMap<(&str, &str), Vec<&Commit>> = BTreeMap::new();
    // A person's refund at the dashboard is no operation's (`compensations` counts it).
    for commit in facts.commits.iter().filter(|c| !c.by_hand()) {
        counts.entry((&commit.route, &commit.order)).or_default().push(commit);
    }
    for ((route, order), commits) in counts {
        if commits.len() > 1 {
            let keys: Vec<&str> = commits.iter().map(|c| c.key.get(..12).unwrap_or(&c.key)).collect();
            let detail = format!("{route} committed {} times for {order} (keys {keys:?})", commits.len());
            found.push(violation("committed-twice", &run_of(facts, order), order, detail));
        }
    }
}

/// `failed` means nothing of the operation took effect.
fn failed_took_nothing(facts: &Facts, found: &mut Vec<Violation>) {
    for op in facts.operations.iter().filter(|op| op.status == OperationStatus::Failed) {
        let order = order_of(op);
        if op.tool == "reserve" && facts.reservations.contains_key(&order) {
            let detail = format!("reserve {} is failed, yet the order's reservation is held", op.step_id);
            found.push(violation("failed-but-committed", &op.run_id, &order, detail));
        }
        let Some(route) = route_of(&op.tool) else { continue };
        let landed = commits(facts, route, &order);
        if !landed.is_empty() {
            let detail =
                format!("{} {} is failed, yet {route} committed it ({} time(s))", op.tool, op.step_id, landed.len());
            found.push(violation("failed-but-committed", &op.run_id, &order, detail));
        }
    }
}

/// `rejected` means nothing was sent, ever, for that step.
fn rejected_sent_nothing(facts: &Facts, found: &mut Vec<Violation>) {
    let mut rejected: BTreeSet<(String, String)> = facts
        .approvals
        .iter()
        .filter(|a| a.state == ApprovalState::Rejected)
        .map(|a| (a.run_id.clone(), a.step_id.clone()))
        .collect();
    for entry in &facts.history {
        match &entry.event {
            Event::Decided { run, step, approve: false, result, .. } if result == "rejected" => {
                rejected.insert((run.clone(), step.clone()));
            }
            Event::Called { run, step, status: Status::Rejected, .. } => {
                rejected.insert((run.clone(), step.clone()));
            }
            _ => {}
        }
    }
    for (run, step) in rejected {
        let Some(order) = order_of_step(facts, &run, &step) else { continue };
        let sent: Vec<&Request> =
            facts.requests.iter().filter(|r| r.route == "fulfillments" && r.order == order && r.reached()).collect();
        if !sent.is_empty() {
            let detail = format!("{step} was rejected, yet {} request(s) reached fulfillments", sent.len());
            found.push(violation("rejected-but-dispatched", &run, &order, detail));
        }
    }
}

/// The order a run's step is about, from what callers were told.
fn order_of_step(facts: &Facts, run: &str, step: &str) -> Option<String> {
    facts.history.iter().find_map(|entry| match &entry.event {
        Event::Called { run: r, step: s, order, .. } if r == run && s == step => order.clone(),
        Event::Decided { run: r, step: s, params, .. } if r == run && s == step => {
            params.get("order_id").and_then(Value::as_str).map(str::to_string)
        }
        _ => None,
    })
}

/// An irreversible request leaves only with a person's approval of its exact params, for the
/// component that sends it.
fn irreversible_only_approved(facts: &Facts, found: &mut Vec<Violation>) {
    for request in facts.requests.iter().filter(|r| r.route == "fulfillments") {
        // Only a decision made before the request left counts.
        let sent_at = facts.history.iter().position(|entry| {
            matches!(&entry.event, Event::Dispatch { route, order, nth, .. }
                if route == "fulfillments" && *order == request.order && *nth == request.nth)
        });
        let before = sent_at.map_or(&facts.history[..], |at| &facts.history[..at]);
        let approved = before.iter().any(|entry| match &entry.event {
            Event::Decided { approve: true, params, component, result, .. } => {
                result == "approved" && *params == request.body && *component == facts.fulfill_digest
            }
            _ => false,
        });
        let recorded = facts
            .ledger_approved
            .iter()
            .any(|(params, component)| *params == request.body && *component == facts.fulfill_digest);
        // A decision whose answer a crash lost is known by its record only, which gc removes
        // with the operation it let run: the tombstone of a fulfillment of this order that ran
        // (not a rejected request's: nothing ran under it), removed after this request left (a
        // record removed before it cannot have been what let it leave).
        let collected = facts.tombstones.iter().any(|t| {
            t.tool == "fulfill"
                && !t.rejected
                && order_of_run(&t.run_id) == request.order
                && request.at_ms <= t.removed_ms.saturating_add(facts.clock_slack_ms)
        });
        if !approved && !recorded && !collected {
            let detail = format!("a fulfillment was sent with params no approval named: {}", request.body);
            found.push(violation(
                "irreversible-without-approval",
                &run_of(facts, &request.order),
                &request.order,
                detail,
            ));
        }
    }
}

/// Every compensation at most once, and only of what took effect.
fn compensations(facts: &Facts, found: &mut Vec<Violation>) {
    for order in &facts.workflow_orders {
        let (refunds, payments) = (refunds(facts, order), commits(facts, "payments", order).len());
        if refunds > payments {
            let detail = format!("{refunds} refund(s) for {payments} payment(s)");
            found.push(violation("compensation-without-effect", &run_of(facts, order), order, detail));
        }
    }
    let mut releases: BTreeMap<String, u32> = BTreeMap::new();
    for op in &facts.operations {
        let released = op.output.as_deref().and_then(|o| serde_json::from_str::<Value>(o).ok());
        let released = released.and_then(|o| o.get("released").and_then(Value::as_u64)).unwrap_or(0);
        if op.tool == "release" && op.status == OperationStatus::Completed && released > 0 {
            *releases.entry(order_of(op)).or_default() += 1;
        }
    }
    for (order, n) in releases.into_iter().filter(|(_, n)| *n > 1) {
        found.push(violation(
            "compensated-twice",
            &run_of(facts, &order),
            &order,
            format!("the reservation was released {n} times"),
        ));
    }
}

/// A step is undone once: its compensation's step has at most one completed operation, on record
/// or removed by retention, whatever ran it (a compensation tool, or a person's word that they
/// undid it by hand). Two would be two refunds, or a word beside a refund, or two people's words
/// each taken (and each person refunding).
fn undone_once(facts: &Facts, found: &mut Vec<Violation>) {
    let mut undone: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    let completed = OperationStatus::Completed;
    let recorded =
        facts.operations.iter().filter(|op| op.status == completed).map(|op| (&op.run_id, &op.step_id, &op.key));
    let removed = facts
        .tombstones
        .iter()
        .filter(|t| t.status == completed && !t.rejected)
        .map(|t| (&t.run_id, &t.step_id, &t.operation_key));
    for (run, step, key) in recorded.chain(removed) {
        if step.starts_with(oncebox_runtime::saga::COMPENSATION_PREFIX) {
            let keys = undone.entry((run.as_str(), step.as_str())).or_default();
            if !keys.contains(&key.as_str()) {
                keys.push(key);
            }
        }
    }
    for ((run, step), keys) in undone.into_iter().filter(|(_, keys)| keys.len() > 1) {
        let detail = format!("{step} undone by {} operations: {}", keys.len(), keys.join(", "));
        found.push(violation("undone-twice", run, "", detail));
    }
}

/// A run whose compensation reported done is undone at the end, by the downstream's record and
/// the reservations held: every payment refunded, no reservation left. (Its orchestrators start no
/// step once compensation is asked for; a stale retry may call again a step they started, which
/// its record must answer. So a step that took effect later was in flight when compensation said
/// it was done, or ran again on that retry instead of being answered.)
fn undone_stays_undone(facts: &Facts, found: &mut Vec<Violation>) {
    let done: BTreeSet<&str> = facts
        .history
        .iter()
        .filter_map(|entry| match &entry.event {
            Event::Compensated { run, result, .. } if result.starts_with("Done") => Some(run.as_str()),
            _ => None,
        })
        .collect();
    for run in done {
        let Some(order) = facts.history.iter().find_map(|entry| match &entry.event {
            Event::Called { run: r, order: Some(order), .. } if r == run => Some(order.clone()),
            _ => None,
        }) else {
            continue;
        };
        // No excuse for a step that gc removed before the saga looked: the saga reads the run's
        // tombstones and names such a step (undo by hand) instead of saying done.
        let (payments, refunds) = (commits(facts, "payments", &order).len(), refunds(facts, &order));
        if payments > refunds {
            let detail = format!("compensation said done, yet {payments} payment(s) stand against {refunds} refund(s)");
            found.push(violation("compensation-incomplete", run, &order, detail));
        }
        if facts.reservations.contains_key(&order) {
            let detail = "compensation said done, yet the order's reservation is still held".to_string();
            found.push(violation("compensation-incomplete", run, &order, detail));
        }
    }
}

/// A compensation asked for finishes unless something needs a person or an answer: a claim whose
/// owner is gone is taken over, never waited on for ever.
fn compensation_finishes(facts: &Facts, found: &mut Vec<Violation>) {
    for run in &facts.compensating {
        let Some(reasons) = facts.open.get(run) else { continue };
        if !reasons.is_empty() && reasons.iter().all(|open| matches!(open.why, Why::Abandoned { .. })) {
            let steps: Vec<&str> = reasons.iter().map(|open| open.step_id.as_str()).collect();
            let detail = format!("compensation waited to the end on abandoned claims only: {steps:?}");
            found.push(violation("compensation-stalled", run, "", detail));
        }
    }
}

/// An irreversible request leaves once: never resent, and never sent again on anyone's word
/// (its approval was for one dispatch; a new intent is a new step and a new approval).
fn irreversible_sent_once(facts: &Facts, found: &mut Vec<Violation>) {
    let mut sent: BTreeMap<&str, u32> = BTreeMap::new();
    for request in facts.requests.iter().filter(|r| r.route == "fulfillments" && r.reached()) {
        *sent.entry(request.order.as_str()).or_default() += 1;
    }
    for (order, n) in sent.into_iter().filter(|(_, n)| *n > 1) {
        let detail = format!("an irreversible fulfillment was sent {n} times");
        found.push(violation("irreversible-sent-twice", &run_of(facts, order), order, detail));
    }
}

/// An irreversible request leaves the host once under its key, a send proven not taken (a refused
/// connection) included: whoever takes its step over judges the stopped attempt from what it left
/// and sends nothing again (DESIGN section 7); sending it again takes a new step and a new approval.
fn irreversible_never_resent(facts: &Facts, found: &mut Vec<Violation>) {
    let mut sent: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    for request in facts.requests.iter().filter(|r| r.route == "fulfillments") {
        *sent.entry((request.order.as_str(), request.key.as_str())).or_default() += 1;
    }
    for ((order, key), n) in sent.into_iter().filter(|(_, n)| *n > 1) {
        let detail =
            format!("an irreversible fulfillment left {n} times under its key {key}, refused connections included");
        found.push(violation("irreversible-resent", &run_of(facts, order), order, detail));
    }
}

/// What a caller was told is final stays so: the same answer on every ask, and the ledger's
/// record after every crash (unless `gc` removed it, leaving its tombstone).
fn acknowledged_survive(facts: &Facts, found: &mut Vec<Violation>) {
    let mut first: BTreeMap<&str, (Status, &Option<Value>, &Entry)> = BTreeMap::new();
    let mut ran: BTreeMap<&str, (Status, u64)> = BTreeMap::new();
    let ops: BTreeMap<&str, &OperationRecord> = facts.operations.iter().map(|op| (op.key.as_str(), op)).collect();
    for entry in &facts.history {
        let Event::Called { run, order, tool, status, operation_key: Some(key), output, replayed, .. } = &entry.event
        else {
            continue;
        };
        let order = order.clone().unwrap_or_default();
        // An operation ends once: of all the answers that it completed or failed, one at most
        // comes from running it (the others, from its record). A second means it ran again: its
        // record was lost. (Two callers racing may hear the replay before the run's own answer.
        // A read-only tool's step may read again.)
        if matches!(status, Status::Completed | Status::Failed) && !*replayed && tool != "stock" {
            if let Some(when) = ran.get(key.as_str())
                && !facts.collected.contains(key)
            {
                let detail = format!(
                    "ran to {} at {} ms, and ran again to {} at {} ms",
                    when.0.as_str(),
                    when.1,
                    status.as_str(),
                    entry.at_ms
                );
                found.push(violation("acknowledged-rerun", run, &order, detail));
            }
            ran.insert(key, (*status, entry.at_ms));
        }
        if !matches!(status, Status::Completed | Status::Failed | Status::Rejected) {
            continue;
        }
        match first.get(key.as_str()) {
            Some((was, was_output, when)) if (*was, *was_output) != (*status, output) => {
                let detail = format!(
                    "answered {} {} at {} ms, then {} {}",
                    was.as_str(),
                    show(was_output),
                    when.at_ms,
                    status.as_str(),
                    show(output)
                );
                found.push(violation("acknowledged-changed", run, &order, detail));
            }
            Some(_) => {}
            None => {
                first.insert(key, (*status, output, entry));
            }
        }
        if facts.collected.contains(key) || *status == Status::Rejected {
            continue;
        }
        let kept = ops
            .get(key.as_str())
            .map(|op| (op.status, op.output.as_deref().and_then(|o| serde_json::from_str::<Value>(o).ok())));
        let expected = if *status == Status::Completed { OperationStatus::Completed } else { OperationStatus::Failed };
        let holds = match &kept {
            Some((kept, kept_output)) => *kept == expected && (*status != Status::Completed || kept_output == output),
            None => false,
        };
        if !holds {
            let now = kept.map_or("no record".to_string(), |(s, o)| format!("{} {}", s.as_str(), show(&o)));
            let detail = format!("a caller was told {} {}; the ledger now holds {now}", status.as_str(), show(output));
            found.push(violation("acknowledged-lost", run, &order, detail));
        }
    }
}

fn show(value: &Option<Value>) -> String {
    value.as_ref().map_or(String::new(), Value::to_string)
}

/// `completed` means it took effect, and the result recorded is the downstream's.
fn completed_took_effect(facts: &Facts, found: &mut Vec<Violation>) {
    for op in facts.operations.iter().filter(|op| op.status == OperationStatus::Completed) {
        let Some(route) = route_of(&op.tool) else { continue };
        let order = order_of(op);
        let output = op.output.as_deref().and_then(|o| serde_json::from_str::<Value>(o).ok());
        let id = output.as_ref().and_then(|o| o.get("id")).cloned();
        let landed = commits(facts, route, &order);
        if !landed.iter().any(|c| c.response.get("id") == id.as_ref()) {
            let detail = format!(
                "{} {} is completed with {}, which {route} never committed",
                op.tool,
                op.step_id,
                show(&output)
            );
            found.push(violation("completed-without-effect", &op.run_id, &order, detail));
        }
    }
}

/// Each completed `notify` enqueued its message once; nothing else enqueued one.
fn outbox_once(facts: &Facts, found: &mut Vec<Violation>) {
    let mut enqueued: BTreeMap<String, u32> = BTreeMap::new();
    for message in &facts.outbox {
        *enqueued.entry(order_of_message(message)).or_default() += 1;
    }
    // A message gc removed since: gc removes only what the relay delivered, so the endpoint took
    // it, under its key (once per key, however many times it was sent). A pending message gc
    // removed (a broken gc) is found here as a completed notify that enqueued nothing.
    let kept: BTreeSet<&str> = facts.outbox.iter().map(|m| m.effect_key.as_str()).collect();
    let removed: BTreeMap<&str, &str> = facts
        .deliveries
        .iter()
        .filter(|d| !kept.contains(d.key.as_str()))
        .map(|d| (d.key.as_str(), d.order.as_str()))
        .collect();
    for order in removed.into_values() {
        *enqueued.entry(order.to_string()).or_default() += 1;
    }
    let mut completed: BTreeSet<String> = facts
        .operations
        .iter()
        .filter(|op| op.tool == "notify" && op.status == OperationStatus::Completed)
        .map(order_of)
        .collect();
    // A completed notify that gc removed since (its tombstone says it completed).
    for stone in facts.tombstones.iter().filter(|t| t.tool == "notify" && t.status == OperationStatus::Completed) {
        completed.insert(order_of_run(&stone.run_id));
    }
    for order in &completed {
        let n = enqueued.get(order).copied().unwrap_or(0);
        if n != 1 {
            found.push(violation("outbox", "", order, format!("a completed notify enqueued {n} message(s)")));
        }
    }
    for (order, n) in enqueued.iter().filter(|(order, _)| !completed.contains(*order)) {
        found.push(violation("outbox", "", order, format!("{n} message(s) enqueued by no completed notify")));
    }
}

/// Every message enqueued reached its endpoint, and the endpoint took them in the order they
/// were enqueued (the latest may come again, after a lost answer; an earlier one never follows a
/// later one).
fn outbox_delivered_in_order(facts: &Facts, found: &mut Vec<Violation>) {
    let seq_of: BTreeMap<&str, &OutboxMessage> = facts.outbox.iter().map(|m| (m.effect_key.as_str(), m)).collect();
    for message in &facts.outbox {
        if !facts.deliveries.iter().any(|d| d.key == message.effect_key) {
            let detail = format!("message {} of topic {} never reached its endpoint", message.seq, message.topic);
            found.push(violation("outbox-lost", "", &order_of_message(message), detail));
        }
    }
    let mut latest: BTreeMap<&str, u64> = BTreeMap::new();
    for delivery in &facts.deliveries {
        let Some(message) = seq_of.get(delivery.key.as_str()) else { continue };
        let topic = message.topic.as_str();
        if let Some(&seen) = latest.get(topic)
            && message.seq < seen
        {
            let detail = format!("message {} of topic {topic} reached its endpoint after message {seen}", message.seq);
            found.push(violation("outbox-out-of-order", "", &delivery.order, detail));
        }
        let seen = latest.entry(topic).or_insert(message.seq);
        *seen = (*seen).max(message.seq);
    }
}

fn order_of_message(message: &OutboxMessage) -> String {
    let payload = serde_json::from_str::<Value>(&message.payload).ok();
    payload.and_then(|p| p.get("order_id").and_then(Value::as_str).map(str::to_string)).unwrap_or_default()
}

/// Local effects are exactly once: the per-SKU counter holds what the reservations hold.
fn reservations_counted(facts: &Facts, found: &mut Vec<Violation>) {
    for (sku, counted) in &facts.reserved {
        let held: u64 = facts.reservations.values().filter(|(s, _)| s == sku).map(|(_, q)| q).sum();
        if held != *counted {
            let detail =
                format!("the counter of {sku} says {counted} units are reserved; the reservations hold {held}");
            found.push(violation("kv-exactly-once", "", "", detail));
        }
    }
}

/// Every operation that is not over is named by its run's open reasons (what to do next).
fn nothing_stuck_silently(facts: &Facts, found: &mut Vec<Violation>) {
    for op in &facts.operations {
        let over = matches!(op.status, OperationStatus::Completed | OperationStatus::Failed);
        if !over && !facts.named_open.contains(&op.key) {
            let detail = format!(
                "{} {} is {} and its run names nothing to do about it",
                op.tool,
                op.step_id,
                op.status.as_str()
            );
            found.push(violation("stuck-silently", &op.run_id, &order_of(op), detail));
        }
    }
}

#[cfg(test)]
mod tests;
