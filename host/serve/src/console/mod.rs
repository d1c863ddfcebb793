//! The operator console: server-rendered pages over the same `App` the API uses, and forms that
//! decide through the API's own helpers (`api::decide`, `api::settle`), so each rule lives once.
//!
//! - `html`: escaping, the frame, the style. `pages`: overview, approvals, tools. `runs`: runs
//!   and the unknowns to reconcile. `actions`: the POST forms.
//!
//! Who may do what: reading is `auth.may_read_console` (open on loopback, signed in beyond it);
//! deciding (approve, reject, settle, reconcile) needs the operator (the session cookie the
//! sign-in form sets), a CSRF token in the form, and a request that is not cross-site.

mod actions;
mod html;
mod pages;
pub(crate) mod runs;

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::FormRejection;
use axum::extract::{Form, State};
use axum::http::header::{HOST, LOCATION, ORIGIN, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use super::app::App;
use super::auth::{SESSION_COOKIE, SignInRefused};
use super::error::ApiError;
use super::sessions::SESSION_TTL;
use html::{Page, Viewer, escape, hidden};

pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/", get(pages::overview))
        .route("/approvals", get(pages::approvals))
        .route("/approvals/{key}", get(pages::approval))
        .route("/approvals/{key}/approve", post(actions::approve))
        .route("/approvals/{key}/reject", post(actions::reject))
        .route("/unknowns", get(runs::unknowns))
        .route("/unknowns/{key}/settle", post(actions::settle))
        .route("/runs", get(runs::runs))
        .route("/runs/{run_id}", get(runs::run))
        .route("/runs/{run_id}/reconcile", post(actions::reconcile))
        .route("/runs/{run_id}/undone-by-hand/{key}", post(actions::undone_by_hand))
        .route("/tools", get(pages::tools))
        .route(super::guard::SIGN_IN, get(login_form).post(login))
        .route("/logout", post(actions::logout))
}

/// Why a console request got no page of its own: an error page with its one-line message and
/// status, or (reading beyond loopback without a session) the way to the sign-in form.
#[derive(Debug)]
pub enum Refusal {
    Error(StatusCode, String),
    SignIn { next: String },
}

impl Refusal {
    fn forbidden(message: impl Into<String>) -> Refusal {
        Refusal::Error(StatusCode::FORBIDDEN, message.into())
    }
}

impl From<ApiError> for Refusal {
    fn from(error: ApiError) -> Self {
        if error.status().is_server_error() {
            tracing::error!(error = %error, "console request failed");
        }
        Refusal::Error(error.status(), error.to_string())
    }
}

impl From<oncebox_runtime::LedgerError> for Refusal {
    fn from(error: oncebox_runtime::LedgerError) -> Self {
        Refusal::from(ApiError::from(error))
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::Error(status, message) => {
                let body = format!(
                    "<p class=\"error\" data-testid=\"error\">{}</p><p><a href=\"/\">Back to the overview</a></p>",
                    escape(&message)
                );
                let title = status.canonical_reason().unwrap_or("Refused");
                Page { status, html: html::page(title, &Viewer::default(), None, &body) }.into_response()
            }
            Refusal::SignIn { next } => see_other(&format!("/login?next={}", html::encode(&next))),
        }
    }
}

/// A 303 to a local path (after a POST, so a reload does not send it again).
fn see_other(location: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(LOCATION, value);
    }
    response
}

/// What a page says after a redirect: named by a code in the query, never by text from it, so
/// that a link nobody's decision made cannot put words in the console's banner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flash {
    SignedIn,
    Approved,
    Rejected,
    Settled,
    Reconciled,
    UndoneByHand,
}

impl Flash {
    const ALL: [Flash; 6] =
        [Flash::SignedIn, Flash::Approved, Flash::Rejected, Flash::Settled, Flash::Reconciled, Flash::UndoneByHand];

    fn code(self) -> &'static str {
        match self {
            Flash::SignedIn => "signed-in",
            Flash::Approved => "approved",
            Flash::Rejected => "rejected",
            Flash::Settled => "settled",
            Flash::Reconciled => "reconciled",
            Flash::UndoneByHand => "undone-by-hand",
        }
    }

    fn message(self) -> &'static str {
        match self {
            Flash::SignedIn => "Signed in as the operator.",
            Flash::Approved => {
                "Approved: the next call of this step with exactly these params runs, once. The request below shows \
                 who decided."
            }
            Flash::Rejected => "Rejected: this step will not run; a rejection is final.",
            Flash::Settled => "Settled by your word: the operation's state below is what the ledger now holds.",
            Flash::Reconciled => {
                "Reconciled: what the authorities proved is recorded below; what they could not prove waits for a \
                 person under Unknowns."
            }
            Flash::UndoneByHand => {
                "Recorded: the step counts as undone by your word, and nothing will be dispatched for it. Run \
                 compensate again to go on with the steps before it."
            }
        }
    }
}

/// A 303 back to `path` with a message for the page to show.
fn with_flash(path: &str, flash: Flash) -> Response {
    let separator = if path.contains('?') { '&' } else { '?' };
    see_other(&format!("{path}{separator}flash={}", flash.code()))
}

/// Only a local path: never another site (`//host`), so `next` and `back` cannot redirect away.
fn local_path(path: &str) -> &str {
    // No control characters or whitespace either: browsers strip a tab from `/\t/evil.example`
    // and follow `//evil.example`.
    let local = path.starts_with('/')
        && !path.starts_with("//")
        && !path.contains('\\')
        && !path.chars().any(|c| c.is_control() || c.is_whitespace());
    if local { path } else { "/" }
}

/// A reader of the console's pages: anyone on loopback, the operator beyond it.
fn viewer(app: &App, headers: &HeaderMap, uri: &Uri) -> Result<Viewer, Refusal> {
    if app.auth.may_read_console(headers).is_err() {
        let next = uri.path_and_query().map_or("/", |p| p.as_str());
        return Err(Refusal::SignIn { next: next.to_string() });
    }
    Ok(Viewer { csrf: app.auth.csrf(headers) })
}

/// The message of the flash code a redirect put in the query, if it names one; any other text
/// shows nothing.
fn flash(uri: &Uri) -> Option<&'static str> {
    let query = uri.query()?;
    let (_, code) = url::form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "flash")?;
    Flash::ALL.into_iter().find(|f| f.code() == code).map(Flash::message)
}

/// Refuses a request another site made the browser send: `Sec-Fetch-Site: cross-site`, or an
/// `Origin` other than the server's own. A browser sends `Origin` with every POST form.
fn same_origin(app: &App, headers: &HeaderMap) -> Result<(), Refusal> {
    if headers.get("sec-fetch-site").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site")) {
        return Err(Refusal::forbidden("refused: this form was sent from another site (Sec-Fetch-Site: cross-site)"));
    }
    let Some(origin) = headers.get(ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or_default();
    let host = headers.get(HOST).and_then(|h| h.to_str().ok());
    if app.auth.is_own_origin(origin, host) {
        Ok(())
    } else {
        Err(Refusal::forbidden(format!(
            "refused: this form was sent from {origin}, not from the console at {}",
            app.base_url
        )))
    }
}

/// The checks of every deciding form, in this order: not cross-site, the operator, the form's
/// CSRF token. Only then is the form itself looked at.
fn decider<T>(app: &App, headers: &HeaderMap, form: Result<Form<T>, FormRejection>) -> Result<T, Refusal>
where
    T: HasCsrf,
{
    same_origin(app, headers)?;
    if app.auth.console_operator(headers).is_err() {
        return Err(Refusal::Error(
            StatusCode::UNAUTHORIZED,
            "deciding needs the operator: sign in at /login with the operator's token".into(),
        ));
    }
    let Form(form) = form.map_err(|e| Refusal::Error(e.status(), format!("the form: {}", e.body_text())))?;
    if !app.auth.is_csrf(headers, form.csrf()) {
        return Err(Refusal::forbidden(
            "refused: the form's CSRF token is missing or wrong; reload the page and try again",
        ));
    }
    Ok(form)
}

/// A form that carries the CSRF token.
trait HasCsrf {
    fn csrf(&self) -> &str;
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    next: String,
}

async fn login_form(State(app): State<Arc<App>>, headers: HeaderMap, uri: Uri) -> Page {
    let next = url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "next")
        .map_or_else(|| "/".to_string(), |(_, v)| v.into_owned());
    let viewer = Viewer { csrf: app.auth.csrf(&headers) };
    let body = login_body(&viewer, local_path(&next), None);
    Page::ok(html::page("Sign in", &viewer, flash(&uri), &body))
}

fn login_body(viewer: &Viewer, next: &str, error: Option<&str>) -> String {
    let error = error.map(|e| format!("<p class=\"error\">{}</p>", escape(e))).unwrap_or_default();
    let signed_in = if viewer.signed_in() {
        format!(
            "<p>You are signed in as the operator.</p><form method=\"post\" action=\"/logout\">{}\
             <button type=\"submit\">Sign out</button></form>",
            html::csrf_field(viewer)
        )
    } else {
        String::new()
    };
    format!(
        "{error}{signed_in}<form method=\"post\" action=\"/login\" class=\"card\">{}\
         <label>Operator token <input type=\"password\" name=\"token\" autocomplete=\"current-password\" required></label>\
         <button type=\"submit\" class=\"primary\">Sign in</button></form>\
         <p class=\"muted\">The token <code>oncebox serve</code> was given with --token-file or $ONCEBOX_TOKEN \
         (or printed on its stderr). Reading on loopback needs no sign-in; deciding always does.</p>",
        hidden("next", next)
    )
}

/// Checks the token and sets the session cookie. Login is no decision, but it still refuses a
/// cross-site post (so another site cannot sign the browser in).
async fn login(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    if let Err(refusal) = same_origin(&app, &headers) {
        return refusal.into_response();
    }
    let Ok(Form(form)) = form else {
        return Refusal::Error(StatusCode::BAD_REQUEST, "the sign-in form is malformed".into()).into_response();
    };
    let next = local_path(&form.next);
    let session = match app.auth.sign_in(&form.token) {
        Ok(session) => session,
        Err(refused) => {
            let (status, why) = match refused {
                SignInRefused::Wrong => (StatusCode::UNAUTHORIZED, "That is not the operator's token.".to_string()),
                SignInRefused::Closed(wait) => (
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "Too many wrong tokens were given here in the last minute: sign-in takes none for {} s.",
                        wait.as_secs().max(1)
                    ),
                ),
                SignInRefused::Random(e) => {
                    tracing::error!(error = %e, "no randomness for a console session");
                    (StatusCode::INTERNAL_SERVER_ERROR, format!("No session could be made (no randomness: {e})."))
                }
            };
            let body = login_body(&Viewer::default(), next, Some(&why));
            return Page { status, html: html::page("Sign in", &Viewer::default(), None, &body) }.into_response();
        }
    };
    let mut response = with_flash(next, Flash::SignedIn);
    // Behind an https public URL the browser must never send the session over plain HTTP.
    let secure = if app.base_url.starts_with("https://") { "; Secure" } else { "" };
    let cookie = format!(
        "{SESSION_COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{secure}",
        SESSION_TTL.as_secs()
    );
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(SET_COOKIE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flash_is_a_code_and_any_other_text_shows_nothing() {
        for flash in Flash::ALL {
            let uri: Uri = format!("/runs?flash={}", flash.code()).parse().expect("uri");
            assert_eq!(super::flash(&uri), Some(flash.message()));
        }
        let forged: Uri = "/runs?flash=Your%20account%20is%20locked".parse().expect("uri");
        assert_eq!(super::flash(&forged), None);
    }

    #[test]
    fn a_redirect_stays_on_the_console() {
        assert_eq!(local_path("/approvals/k"), "/approvals/k");
        assert_eq!(local_path("//evil.example/x"), "/");
        assert_eq!(local_path("https://evil.example"), "/");
        assert_eq!(local_path("/\\evil.example"), "/");
    }
}
