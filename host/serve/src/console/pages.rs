//! The overview, the requests for approval and the tools.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use oncebox_runtime::ledger::Why;
use serde_json::Value;

use super::html::{self, Page, Viewer, approvals_table, badge, escape, field, hidden, json_pre, link, paths, time};
use super::runs::summaries_page;
use super::{Refusal, flash, viewer};
use crate::api;
use crate::app::App;

pub async fn overview(State(app): State<Arc<App>>, headers: HeaderMap, uri: Uri) -> Result<Page, Refusal> {
    let viewer = viewer(&app, &headers, &uri)?;
    let pending = api::approval_views(&app, None, true, viewer.signed_in()).await?;
    // What is open from the index, the runs by the page: O(open + page), whatever the history.
    let ledger = app.host.ledger();
    let unknown = ledger.open_operations(ledger.now_ms(), |why| *why == Why::Unknown).await?;
    let first = crate::page::PageQuery { limit: Some(10), after: None };
    let (runs, more) = summaries_page(&app, &first, viewer.signed_in()).await?;
    let tools = app.host.tools();
    let errors = app.loaded.errors();
    let mut body = String::from("<div class=\"counts\">");
    for (path, count, label) in [
        (paths::APPROVALS, pending.len(), "pending approvals"),
        (paths::UNKNOWNS, unknown.len(), "unknowns to reconcile"),
        ("/tools", tools.len(), "tools loaded"),
        ("/tools", errors.len(), "load errors"),
    ] {
        let _ = write!(body, "<a href=\"{path}\" data-count=\"{path}\"><b>{count}</b>{label}</a>");
    }
    body.push_str("</div><h2>Pending approvals</h2>");
    body.push_str(&approvals_table(&pending, "Nothing awaits approval."));
    body.push_str("<h2>Unknowns to reconcile</h2>");
    if unknown.is_empty() {
        body.push_str("<p class=\"muted\">No operation's outcome is unknown.</p>");
    } else {
        body.push_str("<table><tr><th>Run</th><th>Step</th><th>Tool</th><th>Since</th></tr>");
        for op in &unknown {
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                link(&paths::run(&op.run_id), &op.run_id),
                escape(&op.step_id),
                escape(&op.tool),
                time(op.updated_ms)
            );
        }
        let _ = write!(body, "</table><p>{}</p>", link(paths::UNKNOWNS, "Reconcile or settle them"));
    }
    body.push_str("<h2>Runs</h2>");
    body.push_str(&super::runs::runs_table(&runs));
    if more.is_some() {
        let _ = write!(body, "<p>{}</p>", link(paths::RUNS, "Every run, by the page"));
    }
    body.push_str("<h2>Tools</h2><table><tr><th>Tool</th><th>Class</th><th>Description</th></tr>");
    for (manifest, _) in &tools {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&manifest.name),
            escape(manifest.class.as_str()),
            escape(&manifest.description)
        );
    }
    body.push_str("</table>");
    Ok(Page::ok(html::page("Overview", &viewer, flash(&uri), &body)))
}

pub async fn approvals(State(app): State<Arc<App>>, headers: HeaderMap, uri: Uri) -> Result<Page, Refusal> {
    let viewer = viewer(&app, &headers, &uri)?;
    let all = api::approval_views(&app, None, false, viewer.signed_in()).await?;
    let (pending, decided): (Vec<_>, Vec<_>) =
        all.into_iter().partition(|v| field(v, "state") == "pending" && v["used"] != true);
    let mut body = String::new();
    if pending.is_empty() {
        body.push_str("<p class=\"muted\">Nothing awaits approval.</p>");
    }
    for view in &pending {
        body.push_str(&approval_card(view, &viewer, paths::APPROVALS));
    }
    body.push_str("<h2>Decided or used</h2>");
    body.push_str(&approvals_table(&decided, "No request was decided yet."));
    Ok(Page::ok(html::page("Approvals", &viewer, flash(&uri), &body)))
}

pub async fn approval(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    uri: Uri,
    Path(key): Path<String>,
) -> Result<Page, Refusal> {
    let viewer = viewer(&app, &headers, &uri)?;
    let views = api::approval_views(&app, None, false, viewer.signed_in()).await?;
    let view = views
        .iter()
        .find(|v| v["operation_key"] == key.as_str())
        .ok_or_else(|| Refusal::Error(StatusCode::NOT_FOUND, format!("no request for approval of {key}")))?;
    let back = paths::approval(&key);
    let body = approval_card(view, &viewer, &back);
    Ok(Page::ok(html::page("Approval", &viewer, flash(&uri), &body)))
}

/// What the viewer sees of the params: exactly what will be sent (the operator, signed in, sees
/// sensitive values unsealed), or the sensitive values masked.
fn params_note(view: &Value) -> String {
    if let Some(why) = view["params_error"].as_str() {
        return format!("Sensitive values show as [redacted]: {why}.");
    }
    if view["params_exact"] == true {
        "Exactly what will be sent, sensitive values included; the fingerprint covers these values.".into()
    } else {
        "Sensitive values show as [redacted]: sign in as the operator to see exactly what will be sent.".into()
    }
}

/// One request for approval: what it is, its params (exact for the operator, sensitive values
/// masked for anyone else), the fingerprint, and (while pending) the form that decides on
/// exactly that fingerprint.
fn approval_card(view: &Value, viewer: &Viewer, back: &str) -> String {
    let key = field(view, "operation_key");
    let fingerprint = field(view, "fingerprint");
    let used = view["used"] == true;
    let state = if used { "used" } else { field(view, "state") };
    let consequence = match field(view, "consequence") {
        "" => String::new(),
        c => format!("<p class=\"consequence\" data-testid=\"consequence\"><b>Cannot be undone:</b> {}</p>", escape(c)),
    };
    let mut out = format!(
        "<section class=\"card approval\" data-key=\"{ekey}\"><h2>{tool} {badge}</h2>{consequence}<dl>\
         <dt>Run</dt><dd>{run}</dd><dt>Step</dt><dd>{step}</dd><dt>Operation key</dt><dd><code>{ekey}</code></dd>\
         <dt>Tool says</dt><dd>{description}</dd><dt>Requested</dt><dd>{requested}</dd></dl>\
         <h3>Params</h3><p class=\"muted\">{seen}</p>{params}\
         <p>Fingerprint of these params: <code class=\"fingerprint\" data-testid=\"fingerprint\">{fp}</code></p>\
         <p>Component that will run: <code class=\"component\" data-testid=\"component\">{component}</code></p>",
        ekey = escape(key),
        tool = escape(field(view, "tool")),
        badge = badge(state),
        run = link(&paths::run(field(view, "run_id")), field(view, "run_id")),
        step = escape(field(view, "step_id")),
        description = escape(field(view, "description")),
        requested = time(view["requested_ms"].as_u64().unwrap_or_default()),
        seen = escape(&params_note(view)),
        params = json_pre("params", &view["params"]),
        fp = escape(fingerprint),
        component = escape(field(view, "component")),
    );
    // An expired approval lets nothing through until a person decides again: the same form.
    if state == "pending" || state == "expired" {
        let exact = view["params_exact"] == true;
        out.push_str(&decision_form(key, fingerprint, field(view, "component"), exact, viewer, back));
    } else {
        let by = field(view, "decided_by");
        if !by.is_empty() {
            let _ = write!(out, "<p>Decided by <b>{}</b>", escape(by));
            match field(view, "note") {
                "" => out.push_str("</p>"),
                note => {
                    let _ = write!(out, ": {}</p>", escape(note));
                }
            }
        }
        if used {
            out.push_str("<p class=\"muted\">Its call went through: the step answers from its record.</p>");
        }
    }
    out.push_str("</section>");
    out
}

/// Approve and Reject in one form: both carry the fingerprint shown, so the decision binds to
/// what the person read (`api::decide` refuses another fingerprint). Approve only beside the
/// exact params (`exact`): where the sensitive values could not be unsealed (a missing key file),
/// a person may reject what they cannot read, never approve it.
fn decision_form(key: &str, fingerprint: &str, component: &str, exact: bool, viewer: &Viewer, back: &str) -> String {
    if !viewer.signed_in() {
        return format!(
            "<p><a href=\"/login?next={}\">Sign in</a> to approve or reject.</p>",
            escape(&html::encode(back))
        );
    }
    let action = paths::approval(key);
    format!(
        "<form method=\"post\" action=\"{action}/{default}\" class=\"decide\">{fp}{component}{csrf}{back}\
         <label>Decided by <input type=\"text\" name=\"by\" required placeholder=\"your name\"></label>\
         <label>Note <input type=\"text\" name=\"note\" placeholder=\"why (recorded)\"></label>\
         <label>Approval expires in (seconds, optional) <input type=\"text\" name=\"expires_in\" inputmode=\"numeric\"></label>\
         {approve}<button type=\"submit\" class=\"reject\" formaction=\"{action}/reject\">Reject</button></form>",
        default = if exact { "approve" } else { "reject" },
        approve = if exact {
            "<button type=\"submit\" class=\"approve\">Approve</button>"
        } else {
            "<p class=\"muted\" data-testid=\"no-approve\">Approving needs the exact params, shown above only \
             once their sensitive values can be unsealed.</p>"
        },
        action = escape(&action),
        fp = hidden("fingerprint", fingerprint),
        component = hidden("component", component),
        csrf = html::csrf_field(viewer),
        back = hidden("back", back),
    )
}

pub async fn tools(State(app): State<Arc<App>>, headers: HeaderMap, uri: Uri) -> Result<Page, Refusal> {
    let viewer = viewer(&app, &headers, &uri)?;
    app.loaded.ready().await;
    let mut body =
        format!("<p class=\"muted\">From <code>{}</code>.</p>", escape(&app.loaded.dir().display().to_string()));
    for (manifest, path) in app.host.tools() {
        let sandbox = app.host.sandbox(&manifest.name);
        let grants = sandbox.as_ref().map_or(Value::Null, |s| s.grants.to_json());
        let limits = sandbox.as_ref().map_or(Value::Null, |s| serde_json::to_value(s.limits).unwrap_or_default());
        let consequence = manifest
            .consequence
            .as_deref()
            .map(|c| format!("<dt>Consequence</dt><dd>{}</dd>", escape(c)))
            .unwrap_or_default();
        let compensated = manifest
            .compensated_by
            .as_deref()
            .map(|c| format!("<dt>Compensated by</dt><dd>{}</dd>", escape(c)))
            .unwrap_or_default();
        let _ = write!(
            body,
            "<section class=\"card tool\"><h2>{name} <span class=\"muted\">{version}</span> {class}</h2><dl>\
             <dt>Description</dt><dd>{description}</dd>{consequence}{compensated}\
             <dt>Sensitive</dt><dd>{sensitive}</dd><dt>File</dt><dd><code>{file}</code></dd></dl>\
             <h3>Grants</h3>{grants}<h3>Limits</h3>{limits}</section>",
            name = escape(&manifest.name),
            version = escape(&manifest.version),
            class = badge(manifest.class.as_str()),
            description = escape(&manifest.description),
            sensitive = escape(&manifest.sensitive.join(", ")),
            file = escape(&path.display().to_string()),
            grants = json_pre("grants", &grants),
            limits = json_pre("limits", &limits),
        );
    }
    body.push_str("<h2>Load errors</h2>");
    let errors = app.loaded.errors();
    if errors.is_empty() {
        body.push_str("<p class=\"muted\">Every file in the directory loaded.</p>");
    } else {
        body.push_str("<table><tr><th>File</th><th>Error</th></tr>");
        for error in &errors {
            let file = error["file"].as_str().map_or_else(|| error["file"].to_string(), str::to_string);
            let _ = write!(
                body,
                "<tr><td><code>{}</code></td><td>{}</td></tr>",
                escape(&file),
                escape(field(error, "error"))
            );
        }
        body.push_str("</table>");
    }
    Ok(Page::ok(html::page("Tools", &viewer, flash(&uri), &body)))
}
