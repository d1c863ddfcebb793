//! The console's POST forms. Each passes `decider` (not cross-site, the operator, the CSRF
//! token) before it reads its fields, decides through the API's helper, and answers 303 back to
//! the page with a flash message; a refusal is an error page with its status.

use std::sync::Arc;

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;

use super::html::paths;
use super::{Flash, HasCsrf, Refusal, decider, local_path, with_flash};
use crate::api::{self, DecideBody, ResolveBody, UndoneBody};
use crate::app::App;

/// A form field left empty is a field not given.
fn given(text: &str) -> Option<String> {
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

#[derive(Debug, Deserialize)]
pub struct DecideForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    fingerprint: String,
    /// The component digest the page showed: the decision binds it too.
    #[serde(default)]
    component: String,
    #[serde(default)]
    by: String,
    #[serde(default)]
    note: String,
    #[serde(default)]
    expires_in: String,
    #[serde(default)]
    back: String,
}

impl HasCsrf for DecideForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

impl DecideForm {
    fn body(&self) -> Result<DecideBody, Refusal> {
        let expires_in = match given(&self.expires_in) {
            Some(text) => Some(text.parse::<f64>().map_err(|_| {
                Refusal::Error(StatusCode::BAD_REQUEST, format!("`expires in` {text:?}: give a number of seconds"))
            })?),
            None => None,
        };
        Ok(DecideBody {
            fingerprint: self.fingerprint.clone(),
            component: given(&self.component),
            by: self.by.clone(),
            note: given(&self.note),
            expires_in,
        })
    }
}

pub async fn approve(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(key): Path<String>,
    form: Result<Form<DecideForm>, FormRejection>,
) -> Result<Response, Refusal> {
    decide(&app, &headers, &key, form, true).await
}

pub async fn reject(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(key): Path<String>,
    form: Result<Form<DecideForm>, FormRejection>,
) -> Result<Response, Refusal> {
    decide(&app, &headers, &key, form, false).await
}

async fn decide(
    app: &App,
    headers: &HeaderMap,
    key: &str,
    form: Result<Form<DecideForm>, FormRejection>,
    approve: bool,
) -> Result<Response, Refusal> {
    let form = decider(app, headers, form)?;
    api::decide(app, key, form.body()?, approve).await?;
    Ok(with_flash(local_path(&form.back), if approve { Flash::Approved } else { Flash::Rejected }))
}

#[derive(Debug, Deserialize)]
pub struct SettleForm {
    #[serde(default)]
    csrf: String,
    /// `committed` or `not-committed`.
    #[serde(default)]
    verdict: String,
    /// With `committed`: the operation's output, JSON.
    #[serde(default)]
    output: String,
    #[serde(default)]
    effect: String,
    #[serde(default)]
    by: String,
    #[serde(default)]
    note: String,
}

impl HasCsrf for SettleForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

impl SettleForm {
    fn body(&self) -> Result<ResolveBody, Refusal> {
        let bad = |message: String| Refusal::Error(StatusCode::BAD_REQUEST, message);
        let committed = match self.verdict.as_str() {
            "committed" => {
                let text =
                    given(&self.output).ok_or_else(|| bad("committed: give the output it produced, as JSON".into()))?;
                Some(serde_json::from_str(&text).map_err(|e| bad(format!("the output is not JSON: {e}")))?)
            }
            "not-committed" => None,
            other => return Err(bad(format!("choose committed or not committed (got {other:?})"))),
        };
        Ok(ResolveBody {
            not_committed: committed.is_none(),
            committed,
            effect: given(&self.effect),
            by: self.by.clone(),
            note: given(&self.note),
        })
    }
}

pub async fn settle(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(key): Path<String>,
    form: Result<Form<SettleForm>, FormRejection>,
) -> Result<Response, Refusal> {
    let form = decider(&app, &headers, form)?;
    api::settle(&app, &key, form.body()?).await?;
    Ok(with_flash(paths::UNKNOWNS, Flash::Settled))
}

#[derive(Debug, Deserialize)]
pub struct UndoneForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    by: String,
    #[serde(default)]
    note: String,
}

impl HasCsrf for UndoneForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

/// A person's word that they undid a step of the run by hand (`api::undone`), back to the run.
pub async fn undone_by_hand(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path((run_id, key)): Path<(String, String)>,
    form: Result<Form<UndoneForm>, FormRejection>,
) -> Result<Response, Refusal> {
    let form = decider(&app, &headers, form)?;
    api::undone(&app, &key, Some(&run_id), UndoneBody { by: form.by.clone(), note: given(&form.note) }).await?;
    Ok(with_flash(&paths::run(&run_id), Flash::UndoneByHand))
}

#[derive(Debug, Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    back: String,
}

impl HasCsrf for CsrfForm {
    fn csrf(&self) -> &str {
        &self.csrf
    }
}

pub async fn reconcile(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(run_id): Path<String>,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Result<Response, Refusal> {
    let form = decider(&app, &headers, form)?;
    app.host
        .reconcile_run(&run_id)
        .await
        .map_err(|e| Refusal::from(crate::error::ApiError::from_call(e, "reconcile")))?;
    Ok(with_flash(local_path(&form.back), Flash::Reconciled))
}
