//! The operator console: server-rendered pages over the same `App` the API uses, and forms that
//! decide through the API's own helpers (`api::decide`, `api::settle`), so each rule lives once.
//!
//! - `html`: escaping, the frame, the style. `pages`: overview, approvals, tools. `runs`: runs
//!   and the unknowns to reconcile. `actions`: the POST forms.
//!
//! Who may do what: reading is `auth.may_read_console` (open on loopback, signed in beyond it);
//! deciding (approve, reject, settle, reconcile) needs the operator (the browser's Basic
//! credentials, which the sign-in page asks for: `auth`), a CSRF token in the form, and a request
//! that is not cross-site.

mod actions;
mod html;
mod pages;
pub(crate) mod runs;

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::FormRejection;
use axum::extract::{Form, State};
use axum::http::header::{HOST, LOCATION, ORIGIN, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::app::App;
use super::auth::SignInRefused;
use super::error::ApiError;
use html::{Page, Viewer, escape};

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
        .route("/login", get(login))
}

/// Why a console request got no page of its own: an error page with its one-line message and
/// status, or (reading beyond loopback without signing in) the way to the sign-in page.
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
            "deciding needs the operator: sign in at /login with the operator's token as the password".into(),
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

/// The browser's challenge: its own sign-in dialog, for this server's origin only.
pub(crate) const CHALLENGE: &str = "Basic realm=\"oncebox console\", charset=\"UTF-8\"";

/// The sign-in page: with the browser's Basic credentials holding the token, back to `next`;
/// without them, 401 and the challenge, so the browser asks for them (the page below shows if
/// the person cancels). Reading, and answering the challenge, are no decision: nothing here
/// changes the ledger, so no CSRF token is asked.
async fn login(State(app): State<Arc<App>>, headers: HeaderMap, uri: Uri) -> Response {
    let next = url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "next")
        .map_or_else(|| "/".to_string(), |(_, v)| v.into_owned());
    let next = local_path(&next);
    let why = match app.auth.sign_in(&headers) {
        Ok(()) => return with_flash(next, Flash::SignedIn),
        Err(SignInRefused::Asked) => None,
        Err(SignInRefused::Wrong) => Some("That is not the operator's token."),
    };
    let body = login_body(next, why);
    let status = StatusCode::UNAUTHORIZED;
    let mut response = Page { status, html: html::page("Sign in", &Viewer::default(), None, &body) }.into_response();
    response.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static(CHALLENGE));
    response
}

fn login_body(next: &str, error: Option<&str>) -> String {
    let error = error.map(|e| format!("<p class=\"error\">{}</p>", escape(e))).unwrap_or_default();
    format!(
        "{error}<section class=\"card\"><p>Your browser asks for a user name and a password: any user name, \
         and the operator's token as the password (the token <code>oncebox serve</code> was given with \
         --token-file or $ONCEBOX_TOKEN, or printed on its stderr). It sends them to this server's address \
         and port only, with every page, until it is closed.</p>\
         <p><a href=\"/login?next={}\">Sign in</a></p></section>\
         <p class=\"muted\">Reading on loopback needs no sign-in; deciding always does.</p>",
        escape(&html::encode(next))
    )
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
