//! The operator's credential: a bearer token, never the model's. On loopback the API and MCP are
//! open to the machine's own processes and only decisions (approve, reject, settle) need the
//! token; on any other address every request but `/healthz` needs it. The console carries it in
//! a session cookie set by its sign-in form, and each of its forms carries a CSRF token.

use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::error::ApiError;

/// The console's session cookie.
pub const SESSION_COOKIE: &str = "oncebox_session";

#[derive(Debug)]
pub struct Auth {
    token: String,
    /// Every request needs the token (the server listens beyond loopback).
    everywhere: bool,
}

impl Auth {
    pub fn new(token: String, everywhere: bool) -> Auth {
        Auth { token, everywhere }
    }

    /// Whether every request needs the token (the server listens beyond loopback).
    pub fn everywhere(&self) -> bool {
        self.everywhere
    }

    /// A request may read and call: always on loopback, with the token elsewhere.
    pub fn may_call(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if self.everywhere { self.operator(headers) } else { Ok(()) }
    }

    /// A request comes from the operator: `Authorization: Bearer TOKEN`, or the console's cookie.
    pub fn operator(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let bearer = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|given| same(given.trim(), &self.token));
        if bearer || self.has_session(headers) {
            Ok(())
        } else {
            Err(ApiError::Unauthorized(
                "this needs the operator's token: `Authorization: Bearer TOKEN` (the token `oncebox serve` was given \
                 with --token-file or $ONCEBOX_TOKEN)"
                    .into(),
            ))
        }
    }

    /// Whether the password given to the console's sign-in form is the token.
    pub fn is_token(&self, given: &str) -> bool {
        same(given.trim(), &self.token)
    }

    /// The session cookie's value: derived from the token, so it proves the token was given and
    /// a restart with the same token keeps the operator signed in.
    pub fn session(&self) -> String {
        self.derive("console-session")
    }

    /// The CSRF token every console form carries: a cross-site page cannot read it.
    pub fn csrf(&self) -> String {
        self.derive("console-csrf")
    }

    pub fn is_csrf(&self, given: &str) -> bool {
        same(given, &self.csrf())
    }

    pub fn has_session(&self, headers: &HeaderMap) -> bool {
        let session = self.session();
        headers.get_all(COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).any(|pair| {
            pair.trim().split_once('=').is_some_and(|(name, value)| name == SESSION_COOKIE && same(value, &session))
        })
    }

    fn derive(&self, purpose: &str) -> String {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.token.as_bytes()).expect("HMAC takes any key length");
        mac.update(purpose.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }
}

/// Compares in time that does not depend on where the strings differ.
fn same(given: &str, expected: &str) -> bool {
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A new random token, for a server started without one.
pub fn generate() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes)?;
    Ok(hex::encode(bytes))
}
