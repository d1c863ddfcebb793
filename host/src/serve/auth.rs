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

pub struct Auth {
    token: String,
    /// Every request needs the token (the server listens beyond loopback).
    everywhere: bool,
    /// On loopback, the `Host` values a request may carry (`127.0.0.1:PORT`, `localhost:PORT`,
    /// `[::1]:PORT`): any other is a browser's request under a rebound DNS name.
    local_hosts: Vec<String>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth").field("everywhere", &self.everywhere).finish_non_exhaustive()
    }
}

impl Auth {
    /// The server's credential; `listening` is where it serves HTTP (`None` on stdio), `public` the
    /// URL it is reached at if not `http://LISTEN` (a proxy's name).
    pub fn new(token: String, listening: Option<std::net::SocketAddr>, public: Option<&url::Url>) -> Auth {
        let everywhere = listening.is_some_and(|addr| !addr.ip().is_loopback());
        let mut local_hosts = match listening {
            Some(addr) if !everywhere => {
                let port = addr.port();
                vec![
                    format!("127.0.0.1:{port}"),
                    format!("localhost:{port}"),
                    format!("[::1]:{port}"),
                    addr.to_string(),
                ]
            }
            _ => Vec::new(),
        };
        if let Some(url) = public
            && let Some(host) = url.host_str()
        {
            // As a `Host` header names it: the port only when it is not the scheme's default.
            local_hosts.push(match url.port() {
                Some(port) => format!("{host}:{port}"),
                None => host.to_string(),
            });
        }
        Auth { token, everywhere, local_hosts }
    }

    /// On loopback, whether `host` (a `Host` header's value) names this server.
    pub fn is_local_host(&self, host: &str) -> bool {
        self.everywhere || self.local_hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
    }

    /// On loopback, whether `origin` (an `Origin` header's value) is this server's own.
    pub fn is_own_origin(&self, origin: &str) -> bool {
        let own = |h: &String| {
            origin.eq_ignore_ascii_case(&format!("http://{h}")) || origin.eq_ignore_ascii_case(&format!("https://{h}"))
        };
        self.everywhere || self.local_hosts.iter().any(own)
    }

    /// Whether every request needs the token (the server listens beyond loopback).
    pub fn everywhere(&self) -> bool {
        self.everywhere
    }

    /// A request may read and call: always on loopback, with the token elsewhere.
    pub fn may_call(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if self.everywhere { self.operator(headers) } else { Ok(()) }
    }

    /// A request may read the console's pages: always on loopback, signed in (or with the token)
    /// elsewhere. The API and MCP never take the cookie.
    pub fn may_read_console(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if self.everywhere { self.console_operator(headers) } else { Ok(()) }
    }

    /// A request comes from the operator: `Authorization: Bearer TOKEN`. (The console's session
    /// cookie counts only on the console's own routes, with their CSRF token: `console_operator`.)
    pub fn operator(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if self.has_bearer(headers) {
            Ok(())
        } else {
            Err(ApiError::Unauthorized(
                "this needs the operator's token: `Authorization: Bearer TOKEN` (the token `oncebox serve` was given \
                 with --token-file or $ONCEBOX_TOKEN)"
                    .into(),
            ))
        }
    }

    /// The operator on a console route: the bearer token or the session cookie. The route checks
    /// the form's CSRF token as well.
    pub fn console_operator(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if self.has_session(headers) { Ok(()) } else { self.operator(headers) }
    }

    fn has_bearer(&self, headers: &HeaderMap) -> bool {
        headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .is_some_and(|(scheme, given)| scheme.eq_ignore_ascii_case("bearer") && same(given.trim(), &self.token))
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
