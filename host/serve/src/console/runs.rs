//! Runs, a run's timeline, and the unknowns to reconcile or settle.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use oncebox_runtime::ledger::{
    ApprovalRecord, AttemptRecord, EffectRecord, EffectStatus, Open, OperationRecord, Tombstone, Why, run_state,
};
use oncebox_runtime::recovery::RunRecovery;
use oncebox_runtime::saga;
use serde_json::Value;

use super::html::{
    self, Page, Viewer, approvals_table, badge, escape, hidden, json_pre, json_text_pre, link, micros, paths, time,
};
use super::{Refusal, flash, viewer};
use crate::api;
use crate::app::App;
use crate::page::PageQuery;

/// One run as the lists show it.
pub struct RunSummary {
    pub run_id: String,
    pub steps: usize,
    /// How many of its operations have each status.
    pub statuses: BTreeMap<&'static str, usize>,
    pub awaiting_approval: usize,
    pub last_ms: u64,
}

/// Every run the ledger knows, from its operations and its requests for approval (a step
/// awaiting approval has no operation yet), the most recently written first.
pub fn run_summaries(ops: &[OperationRecord], approvals: &[Value]) -> Vec<RunSummary> {
    let mut runs: BTreeMap<&str, RunSummary> = BTreeMap::new();
    let blank = |run_id: &str| RunSummary {
        run_id: run_id.to_string(),
        steps: 0,
        statuses: BTreeMap::new(),
        awaiting_approval: 0,
        last_ms: 0,
    };
    for op in ops {
        let run = runs.entry(op.run_id.as_str()).or_insert_with(|| blank(&op.run_id));
        run.steps += 1;
        *run.statuses.entry(op.status.as_str()).or_default() += 1;
        run.last_ms = run.last_ms.max(op.updated_ms);
    }
    for view in approvals {
        let Some(run_id) = view["run_id"].as_str() else { continue };
        let run = runs.entry(run_id).or_insert_with(|| blank(run_id));
        if view["state"] == "pending" && view["used"] != true {
            run.awaiting_approval += 1;
        }
        run.last_ms = run.last_ms.max(view["requested_ms"].as_u64().unwrap_or_default());
    }
    let mut list: Vec<RunSummary> = runs.into_values().collect();
    list.sort_by(|a, b| b.last_ms.cmp(&a.last_ms).then_with(|| a.run_id.cmp(&b.run_id)));
    list
}

pub fn runs_table(runs: &[RunSummary]) -> String {
    if runs.is_empty() {
        return "<p class=\"muted\">The ledger holds no run yet.</p>".into();
    }
    let mut out = String::from(
        "<table><tr><th>Run</th><th>Steps</th><th>Statuses</th><th>Awaiting approval</th><th>Last write</th></tr>",
    );
    for run in runs {
        let statuses: Vec<String> = run.statuses.iter().map(|(s, n)| format!("{} {n}", badge(s))).collect();
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            link(&paths::run(&run.run_id), &run.run_id),
            run.steps,
            statuses.join(" "),
            run.awaiting_approval,
            time(run.last_ms)
        );
    }
    out.push_str("</table>");
    out
}

/// One page of runs in key order (their ids' byte order), each summed up from its own records:
/// O(page x steps of a run), whatever the history; and the cursor of the next page.
pub async fn summaries_page(
    app: &App,
    query: &PageQuery,
    exact: bool,
) -> Result<(Vec<RunSummary>, Option<String>), crate::error::ApiError> {
    let ledger = app.host.ledger();
    let ids = ledger.runs_page(query.after(), query.limit().saturating_add(1)).await?;
    let (ids, next) = query.of(ids, |id| id.as_str());
    let mut summaries = Vec::with_capacity(ids.len());
    for id in ids {
        let ops = ledger.operations(Some(&id)).await?;
        summaries.extend(run_summaries(&ops, &api::approval_views(app, Some(&id), false, exact).await?));
    }
    Ok((summaries, next))
}

/// The link to the next page of a listing, if there is one.
pub fn next_page(path: &str, next: Option<&str>, limit: usize) -> String {
    next.map(|next| {
        format!(
            "<p><a href=\"{}?after={}&amp;limit={limit}\" rel=\"next\">Next page</a></p>",
            escape(path),
            escape(&html::encode(next))
        )
    })
    .unwrap_or_default()
}

pub async fn runs(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    uri: Uri,
    Query(query): Query<PageQuery>,
) -> Result<Page, Refusal> {
    let viewer = viewer(&app, &headers, &uri)?;
    let (runs, next) = summaries_page(&app, &query, viewer.signed_in()).await?;
    let body = format!("{}{}", runs_table(&runs), next_page(paths::RUNS, next.as_deref(), query.limit()));
    Ok(Page::ok(html::page("Runs", &viewer, flash(&uri), &body)))
}

pub async fn run(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    uri: Uri,
    Path(run_id): Path<String>,
) -> Result<Page, Refusal> {
    let viewer = viewer(&app, &headers, &uri)?;
    let ledger = app.host.ledger();
    // What keeps the run open, by the ledger's one rule (recovery sorts it): read first, so that a
    // step claimed before it is seen, in flight or recorded.
    let report = oncebox_runtime::recovery::report(ledger, Some(&run_id)).await?;
    let recovery = report.get(&run_id).cloned().unwrap_or_default();
    let mut ops = ledger.operations(Some(&run_id)).await?;
    let approvals = api::approval_views(&app, Some(&run_id), false, viewer.signed_in()).await?;
    let expired = ledger.tombstones(&run_id).await?;
    if ops.is_empty() && approvals.is_empty() && recovery.open.is_empty() && expired.is_empty() {
        return Err(Refusal::Error(StatusCode::NOT_FOUND, format!("no run {run_id} in the ledger")));
    }
    ops.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then_with(|| a.step_id.cmp(&b.step_id)));
    let back = paths::run(&run_id);
    let mut body = String::new();
    let summary = run_summaries(&ops, &approvals);
    body.push_str(&runs_table(&summary));
    body.push_str(&open_table(&recovery.open));
    if recovery.open.iter().any(|open| open.why == Why::Unknown) {
        body.push_str(&reconcile_form(&run_id, &viewer, &back));
    }
    body.push_str(&decisions(&recovery));
    body.push_str("<h2>Requests for approval</h2>");
    body.push_str(&approvals_table(&approvals, "No step of this run asked for approval."));
    let requests = ledger.approvals(Some(&run_id)).await?;
    let now_ms = ledger.now_ms();
    let records = RunRecords { run_id: &run_id, ops: &ops, requests: &requests, expired: &expired, now_ms };
    body.push_str(&compensation(&records, &recovery.open, &viewer));
    body.push_str("<h2>Timeline</h2><ol class=\"timeline\">");
    for op in &ops {
        let attempts = ledger.attempts(&op.key).await?;
        let effects = ledger.effects(&op.key).await?;
        body.push_str(&step_item(op, &attempts, &effects));
    }
    body.push_str("</ol>");
    body.push_str(&removed_table(&expired));
    Ok(Page::ok(html::page(&format!("Run {run_id}"), &viewer, flash(&uri), &body)))
}

/// What keeps the run open, as the ledger's one rule says.
fn open_table(open: &[Open]) -> String {
    if open.is_empty() {
        return "<p class=\"muted\">Nothing keeps this run open: every step ended.</p>".into();
    }
    let mut out = String::from(
        "<h2>What keeps this run open</h2><table class=\"open\"><tr><th>Step</th><th>Tool</th><th>Why</th></tr>",
    );
    for reason in open {
        let detail = match &reason.why {
            Why::InFlight { owner, lease_until_ms, recorded } => format!(
                " <span class=\"muted\">{} holds it until {}{}</span>",
                escape(owner),
                time(*lease_until_ms),
                if *recorded { "" } else { ", nothing of it recorded yet" }
            ),
            Why::Abandoned { owner, .. } => {
                format!(" <span class=\"muted\">{} is gone: the step's next call takes it over</span>", escape(owner))
            }
            Why::AwaitingApproval { standing } => format!(" <span class=\"muted\">{}</span>", standing.as_str()),
            Why::Unknown | Why::CompensationOutstanding => String::new(),
        };
        let _ = write!(
            out,
            "<tr data-reason=\"{reason_name}\"><td>{}</td><td>{}</td><td>{}{detail}</td></tr>",
            escape(&reason.step_id),
            escape(&reason.tool),
            badge(reason.why.as_str()),
            reason_name = reason.why.as_str(),
        );
    }
    out.push_str("</table>");
    out
}

/// What recovery says a person must decide for the run, with the commands that do it.
fn decisions(run: &RunRecovery) -> String {
    if run.decide.is_empty() {
        return "<p class=\"muted\">Nothing in this run needs a person.</p>".into();
    }
    let mut out =
        String::from("<h2>What a person must decide</h2><table><tr><th>Step</th><th>What</th><th>Command</th></tr>");
    for decision in &run.decide {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            escape(&decision.step_id),
            escape(&decision.what),
            escape(&decision.command)
        );
    }
    out.push_str("</table>");
    out
}

/// Where undoing the run stands: each completed compensatable step and its compensation, and
/// those whose records retention removed before the run was undone (nothing can be made to undo
/// them: `compensate` names them for a person). A step no compensation will ever undo (one that
/// failed or was rejected, or whose record went) has the form a signed-in person records their
/// undo by hand with (`api::undone`).
fn compensation(run: &RunRecords, open: &[Open], viewer: &Viewer) -> String {
    let (ops, expired) = (run.ops, run.expired);
    let undoable: Vec<&OperationRecord> = ops.iter().filter(|op| run_state::undoable(op)).collect();
    let gone: Vec<&Tombstone> = expired
        .iter()
        .filter(|t| run_state::undoable_removed(t) && run_state::undone_by(&t.operation_key, ops, expired).is_none())
        .collect();
    let mut out = String::from("<h2>Compensation</h2>");
    if !gone.is_empty() {
        out.push_str(
            "<p>Retention removed the records of completed steps below before this run was undone: their \
             compensations cannot be made from them. If the run must be undone, a person undoes them by hand \
             (<code>compensate</code> names them <code>undo-by-hand</code>) and records it here.</p>",
        );
        out.push_str(
            "<table class=\"expired\"><tr><th>Step</th><th>Tool</th><th>Ended</th><th>Record removed</th>\
             <th></th></tr>",
        );
        for stone in &gone {
            let _ = write!(
                out,
                "<tr data-key=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&stone.operation_key),
                escape(&stone.step_id),
                escape(&stone.tool),
                time(stone.ended_ms),
                time(stone.removed_ms),
                undone_form(run, &stone.operation_key, viewer)
            );
        }
        out.push_str("</table>");
    }
    if undoable.is_empty() {
        if gone.is_empty() {
            out.push_str("<p class=\"muted\">No completed compensatable step on record: nothing to undo.</p>");
        }
        return out;
    }
    if open.iter().any(|o| o.why == Why::CompensationOutstanding) {
        out.push_str("<p>Compensation started and is not done: run it again once what blocks it is settled.</p>");
    }
    out.push_str("<table><tr><th>Step</th><th>Tool</th><th>Compensation</th><th></th></tr>");
    for op in undoable {
        let step = saga::compensation_step(op);
        let state = match run_state::undone_by(&op.key, ops, expired) {
            Some(undone) if undone.by_hand() => "undone by hand",
            Some(_) => "compensated",
            None => match ops.iter().find(|c| c.step_id == step) {
                Some(begun) => begun.status.as_str(),
                // Ended otherwise and removed since (failed, or its request rejected): as the
                // saga reads it, not begun again.
                None => expired
                    .iter()
                    .find(|t| t.step_id == step)
                    .map_or("not started", |t| if t.rejected { "rejected" } else { t.status.as_str() }),
            },
        };
        let state = if state == "completed" { "compensated" } else { state };
        let _ = write!(
            out,
            "<tr data-key=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&op.key),
            escape(&op.step_id),
            escape(&op.tool),
            badge(state),
            undone_form(run, &op.key, viewer)
        );
    }
    out.push_str("</table>");
    out
}

/// What the run page read of a run, for the sections drawn from more than one of its records.
struct RunRecords<'a> {
    run_id: &'a str,
    ops: &'a [OperationRecord],
    requests: &'a [ApprovalRecord],
    expired: &'a [Tombstone],
    /// When the page read them: a compensation claimed by an owner that is gone is ended by the word.
    now_ms: u64,
}

/// The form a person records that they undid step `key` by hand with, for a step no compensation
/// will ever undo, or whose compensation's owner is gone (by the ledger's rule: [`run_state::by_hand`]
/// says `Beside` or `EndAbandoned`); empty otherwise, and for a viewer not signed in. The word is
/// checked again when it is recorded, with the claims in flight this page does not read.
fn undone_form(run: &RunRecords, key: &str, viewer: &Viewer) -> String {
    let word = run_state::by_hand(key, run.ops, &[], run.requests, run.expired, run.now_ms);
    let taken = matches!(word, Ok(run_state::ByHand::Beside | run_state::ByHand::EndAbandoned(_)));
    if !viewer.signed_in() || !taken {
        return String::new();
    }
    format!(
        "<form method=\"post\" action=\"{run}/undone-by-hand/{key}\" class=\"undone\">{csrf}\
         <label>Undone by <input type=\"text\" name=\"by\" required></label>\
         <label>How <input type=\"text\" name=\"note\" placeholder=\"refund reference\"></label>\
         <button type=\"submit\">Record undone by hand</button></form>",
        run = escape(&paths::run(run.run_id)),
        key = escape(&html::encode(key)),
        csrf = html::csrf_field(viewer),
    )
}

/// The steps whose records retention removed: which, how they ended, and when they went.
fn removed_table(expired: &[Tombstone]) -> String {
    if expired.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<h2>Removed by retention</h2><table class=\"removed\"><tr><th>Step</th><th>Tool</th><th>Ended</th>\
         <th>At</th><th>Removed at</th></tr>",
    );
    for stone in expired {
        let ended = if stone.rejected { "rejected" } else { stone.status.as_str() };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&stone.step_id),
            escape(&stone.tool),
            badge(ended),
            time(stone.ended_ms),
            time(stone.removed_ms)
        );
    }
    out.push_str("</table>");
    out
}

/// One operation on the timeline: its status, attempts and effects.
fn step_item(op: &OperationRecord, attempts: &[AttemptRecord], effects: &[EffectRecord]) -> String {
    let undoes = op
        .step_id
        .strip_prefix(saga::COMPENSATION_PREFIX)
        .filter(|_| saga::is_compensation(op))
        .map(|key| format!("<dt>Undoes</dt><dd><code>{}</code></dd>", escape(key)))
        .unwrap_or_default();
    let mut out = format!(
        "<li class=\"step\" data-step=\"{step}\"><h3>{step} <span class=\"muted\">{tool} · {class}</span> {status}</h3><dl>\
         <dt>Operation key</dt><dd><code>{key}</code></dd>{undoes}<dt>Started</dt><dd>{created}</dd>\
         <dt>Last write</dt><dd>{updated}</dd><dt>Took</dt><dd>{took}</dd><dt>Attempts</dt><dd>{attempts}</dd></dl>\
         <h3>Args</h3>{args}",
        step = escape(&op.step_id),
        tool = escape(&op.tool),
        class = escape(op.class.as_str()),
        status = badge(op.status.as_str()),
        key = escape(&op.key),
        created = time(op.created_ms),
        updated = time(op.updated_ms),
        took = micros(op.updated_ms.saturating_sub(op.created_ms).saturating_mul(1000)),
        attempts = op.attempts,
        args = json_pre("args", &op.args),
    );
    if let Some(output) = &op.output {
        let _ = write!(out, "<h3>Output</h3>{}", json_text_pre("output", output));
    }
    if let Some(error) = &op.error {
        let _ = write!(out, "<p class=\"error\">{}: {}</p>", escape(&error.class), escape(&error.message));
    }
    if let Some(note) = &op.reconciled {
        let _ = write!(
            out,
            "<p class=\"reconciled\" data-testid=\"reconciled\">The reconciler asked {} time(s); the last, at {}: {}{}</p>",
            note.tries,
            time(note.last_ms),
            escape(&note.result),
            note.reason.as_deref().map(|r| format!(" ({})", escape(r))).unwrap_or_default()
        );
    }
    out.push_str(&attempts_table(attempts));
    out.push_str(&effects_table(effects));
    out.push_str("</li>");
    out
}

fn attempts_table(attempts: &[AttemptRecord]) -> String {
    if attempts.is_empty() {
        return "<p class=\"muted\">No attempt recorded.</p>".into();
    }
    let mut out = String::from(
        "<table class=\"attempts\"><tr><th>Attempt</th><th>Started</th><th>Took</th><th>Outcome</th><th>Source</th>\
         <th>Downstream accepted</th><th>Effects</th></tr>",
    );
    for a in attempts {
        let effects: Vec<String> =
            a.effects.iter().map(|e| format!("{}: {}", e.label, effect_status(e.status))).collect();
        let accepted = a.downstream_accepted.map_or("—", |yes| if yes { "yes" } else { "no" });
        let message = a.message.as_deref().map(|m| format!("<br><span class=\"muted\">{}</span>", escape(m)));
        let _ = write!(
            out,
            "<tr><td>{} of {}</td><td>{}</td><td>{}</td><td>{}{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            a.attempt,
            a.max_attempts,
            time(a.started_ms),
            micros(a.duration_us),
            badge(&a.outcome),
            message.unwrap_or_default(),
            escape(a.source.as_str()),
            accepted,
            escape(&effects.join(", ")),
        );
    }
    out.push_str("</table>");
    out
}

fn effects_table(effects: &[EffectRecord]) -> String {
    if effects.is_empty() {
        return "<p class=\"muted\">No effect recorded.</p>".into();
    }
    let mut out = String::from(
        "<table class=\"effects\"><tr><th>Effect</th><th>Status</th><th>Target</th><th>Sent</th><th>First sent</th>\
         <th>Last sent</th><th>Last write</th><th>Key</th></tr>",
    );
    for e in effects {
        let settled = e.resolution.as_ref().map(|r| {
            format!(
                "<br><span class=\"muted\">settled {} by {}, {}</span>",
                escape(&r.verdict),
                escape(&r.by),
                time(r.at_ms)
            )
        });
        let _ = write!(
            out,
            "<tr><td>{} #{} <span class=\"muted\">{}</span></td><td>{}{}</td><td>{}</td><td>{}×</td><td>{}</td><td>{}</td>\
             <td>{}</td><td><code>{}</code></td></tr>",
            escape(&e.label),
            e.occurrence,
            escape(&e.kind),
            badge(&effect_status(e.status)),
            settled.unwrap_or_default(),
            escape(&e.target),
            e.dispatches,
            time(e.first_dispatched_ms),
            time(e.last_dispatch_ms()),
            time(e.updated_ms),
            escape(&e.key),
        );
    }
    out.push_str("</table>");
    out
}

/// An effect's status as the ledger spells it (`dispatched`, `retryable`).
fn effect_status(status: EffectStatus) -> String {
    serde_json::to_value(status).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

fn reconcile_form(run_id: &str, viewer: &Viewer, back: &str) -> String {
    if !viewer.signed_in() {
        return format!(
            "<p><a href=\"/login?next={}\">Sign in</a> to reconcile or settle.</p>",
            escape(&html::encode(back))
        );
    }
    format!(
        "<form method=\"post\" action=\"{}/reconcile\" class=\"reconcile\">{}{}\
         <button type=\"submit\" class=\"primary\">Reconcile run {}</button> \
         <span class=\"muted\">asks each unknown step's tool what happened, under the rule of evidence</span></form>",
        escape(&paths::run(run_id)),
        html::csrf_field(viewer),
        hidden("back", back),
        escape(run_id)
    )
}

/// The unknown operations, a page of them in key order: read from the index of open work, O(open),
/// and drawn O(page).
pub async fn unknowns(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    uri: Uri,
    Query(query): Query<PageQuery>,
) -> Result<Page, Refusal> {
    let viewer = viewer(&app, &headers, &uri)?;
    let ledger = app.host.ledger();
    let ops = ledger.open_operations(ledger.now_ms(), |why| *why == Why::Unknown).await?;
    let (unknown, next) = query.of(ops, |op| op.key.as_str());
    let mut body = String::new();
    if unknown.is_empty() {
        body.push_str("<p class=\"muted\">No operation's outcome is unknown: nothing to reconcile.</p>");
    }
    for op in &unknown {
        let effects = ledger.effects(&op.key).await?;
        body.push_str(&unknown_card(op, &effects, &viewer));
    }
    body.push_str(&next_page(paths::UNKNOWNS, next.as_deref(), query.limit()));
    Ok(Page::ok(html::page("Unknowns", &viewer, flash(&uri), &body)))
}

/// An unknown operation: what is in doubt, the Reconcile button and the settle-by-hand form.
fn unknown_card(op: &OperationRecord, effects: &[EffectRecord], viewer: &Viewer) -> String {
    let in_doubt: Vec<EffectRecord> = effects.iter().filter(|e| e.status.in_doubt()).cloned().collect();
    let error = op
        .error
        .as_ref()
        .map(|e| format!("<p class=\"error\">{}: {}</p>", escape(&e.class), escape(&e.message)))
        .unwrap_or_default();
    let mut out = format!(
        "<section class=\"card unknown\" data-key=\"{key}\"><h2>{step} <span class=\"muted\">{tool}</span> {status}</h2>\
         <dl><dt>Run</dt><dd>{run}</dd><dt>Operation key</dt><dd><code>{key}</code></dd><dt>Since</dt><dd>{since}</dd></dl>\
         {error}<h3>In doubt</h3>{effects}",
        key = escape(&op.key),
        step = escape(&op.step_id),
        tool = escape(&op.tool),
        status = badge(op.status.as_str()),
        run = link(&paths::run(&op.run_id), &op.run_id),
        since = time(op.updated_ms),
        effects = effects_table(&in_doubt),
    );
    out.push_str(&reconcile_form(&op.run_id, viewer, paths::UNKNOWNS));
    if viewer.signed_in() {
        out.push_str(&settle_form(op, &in_doubt, viewer));
    }
    out.push_str("</section>");
    out
}

/// Settling by a person's word: committed (with the output the tool would have returned) or not
/// committed; recorded with who and why (`api::settle`).
fn settle_form(op: &OperationRecord, in_doubt: &[EffectRecord], viewer: &Viewer) -> String {
    let effect = if in_doubt.len() > 1 {
        let options: String = in_doubt
            .iter()
            .map(|e| format!("<option value=\"{}\">{} #{}</option>", escape(&e.key), escape(&e.label), e.occurrence))
            .collect();
        format!("<label>Effect <select name=\"effect\">{options}</select></label>")
    } else {
        String::new()
    };
    format!(
        "<form method=\"post\" action=\"{key}/settle\" class=\"settle\"><h3>Settle by hand</h3>{csrf}{effect}\
         <label><input type=\"radio\" name=\"verdict\" value=\"committed\" required> It took place: the output was</label>\
         <textarea name=\"output\" rows=\"3\" placeholder='{{\"id\": \"...\"}}'></textarea>\
         <label><input type=\"radio\" name=\"verdict\" value=\"not-committed\"> It did not take place \
         (the next call of the step runs it again, with the same keys)</label>\
         <label>Decided by <input type=\"text\" name=\"by\" required></label>\
         <label>Note <input type=\"text\" name=\"note\"></label>\
         <button type=\"submit\" class=\"primary\">Settle</button></form>",
        key = escape(&paths::unknown(&op.key)),
        csrf = html::csrf_field(viewer),
    )
}
