//! Who may do what (DESIGN section 8), in one place: the operator's credential, a bearer token
//! that never reaches the model, and the one allow-list of the `Host` names and origins this
//! server answers to, which the API, the console and MCP all ask.
//!
//! - On loopback with no `--public-url`, the machine's own processes may call tools, read and
//!   reconcile (which acts only on proof) without the token; every decision (approve, reject,
//!   settle by hand, compensate, which sends refunds) needs it.
//! - Beyond loopback, or behind `--public-url` (a proxy forwards strangers' requests to a loopback
//!   address, so the peer's address proves nothing), every request but `/healthz` needs it.
//! - A request a proxy forwarded (it carries `Forwarded`, `X-Forwarded-*`, `X-Real-IP` or `Via`)
//!   to a server started without `--public-url` needs it too: the proxy's peer is a stranger as
//!   far as this server can tell, whatever `Host` the proxy wrote.
//!
//! The console carries the operator in HTTP Basic authentication (any user name, the token as the
//! password), which its sign-in page asks the browser for (`console::login`). Not a cookie: a
//! browser sends a host's cookies to every port of that host (RFC 6265 section 8.5), so any
//! process listening on another port of `127.0.0.1` that the operator's browser visits would
//! receive a session and could decide with it; a browser keeps Basic credentials per origin,
//! port included. Each of the console's forms carries a CSRF token derived from the token.

use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, HeaderName};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::error::ApiError;

/// The headers a proxy adds to a request it forwards (RFC 7239, the de-facto `X-Forwarded-*`,
/// nginx's `X-Real-IP`, HTTP's `Via`). A proxy that adds none of them cannot be told from a
/// process on this machine: behind any proxy, start the server with `--public-url`.
const FORWARDING: [&str; 7] =
    ["forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-forwarded-port", "x-real-ip", "via"];

/// Why the sign-in page signed nobody in.
#[derive(Debug)]
pub enum SignInRefused {
    /// No credentials given yet: the browser is to ask for them.
    Asked,
    /// Not the operator's token.
    Wrong,
}

pub struct Auth {
    token: String,
    /// The callers' token, if the operator gave one: it may call, read and reconcile wherever the
    /// operator's may, and decide nothing (so an agent beyond loopback never holds the
    /// credential that approves).
    caller: Option<String>,
    /// Every request needs the token: the server listens beyond loopback or behind a proxy.
    everywhere: bool,
    /// The `Host` values a request may carry. Any other is a browser's request under a rebound
    /// DNS name, or a name the operator did not give.
    hosts: Hosts,
}

/// The one allow-list of hosts and origins.
#[derive(Debug)]
enum Hosts {
    /// Listening beyond loopback with no `--public-url`: the names the server is reached by are
    /// the operator's business, and every request carries the token, which a rebinding page
    /// cannot send. An origin is own when it names the request's own `Host`.
    Any,
    /// These `Host` values (`127.0.0.1:PORT`, `localhost:PORT`, `[::1]:PORT` on loopback, the
    /// listening address, the public URL's host), and the origins: `http://` or `https://` with
    /// one of them, and the public URL's origin.
    Listed { hosts: Vec<String>, origins: Vec<String> },
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth").field("everywhere", &self.everywhere).field("hosts", &self.hosts).finish_non_exhaustive()
    }
}

impl Auth {
    /// The server's credential; `listening` is where it serves HTTP (`None` on stdio), `public` the
    /// URL it is reached at if not `http://LISTEN` (a proxy's name).
    pub(crate) fn new(token: String, listening: Option<std::net::SocketAddr>, public: Option<&url::Url>) -> Auth {
        let Some(addr) = listening else {
            // stdio: no HTTP request ever reaches this server.
            let hosts = Hosts::Listed { hosts: Vec::new(), origins: Vec::new() };
            return Auth { token, caller: None, everywhere: false, hosts };
        };
        let beyond_loopback = !addr.ip().is_loopback();
        let everywhere = beyond_loopback || public.is_some();
        if beyond_loopback && public.is_none() {
            return Auth { token, caller: None, everywhere, hosts: Hosts::Any };
        }
        let port = addr.port();
        // A proxy in front of a loopback server often rewrites `Host` to the upstream's address
        // (nginx's default), and the machine's own health checks use it: the loopback names count.
        let mut hosts = vec![format!("127.0.0.1:{port}"), format!("localhost:{port}"), format!("[::1]:{port}")];
        if !addr.ip().is_unspecified() && !hosts.contains(&addr.to_string()) {
            hosts.push(addr.to_string());
        }
        let mut origins: Vec<String> =
            hosts.iter().flat_map(|h| [format!("http://{h}"), format!("https://{h}")]).collect();
        if let Some(url) = public
            && let Some(host) = url.host_str()
        {
            // As a `Host` header names it: the port only when it is not the scheme's default.
            hosts.push(match url.port() {
                Some(port) => format!("{host}:{port}"),
                None => host.to_string(),
            });
            origins.push(url.origin().ascii_serialization());
        }
        Auth { token, caller: None, everywhere, hosts: Hosts::Listed { hosts, origins } }
    }

    /// With the callers' token `caller` (see [`Auth::may_call`]).
    pub(crate) fn with_caller(self, caller: Option<String>) -> Auth {
        Auth { caller, ..self }
    }

    /// Whether a request must name this server in `Host`: wherever the allow-list is a list.
    pub fn requires_host(&self) -> bool {
        matches!(self.hosts, Hosts::Listed { .. })
    }

    /// Whether `host` (a `Host` header's value) names this server.
    pub fn is_own_host(&self, host: &str) -> bool {
        match &self.hosts {
            Hosts::Any => true,
            Hosts::Listed { hosts, .. } => hosts.iter().any(|h| h.eq_ignore_ascii_case(host)),
        }
    }

    /// Whether `origin` (an `Origin` header's value) is this server's own; `host` is the request's
    /// `Host`, which an origin must name when the server answers to any name.
    pub fn is_own_origin(&self, origin: &str, host: Option<&str>) -> bool {
        match &self.hosts {
            Hosts::Any => host.is_some_and(|host| {
                let authority = origin.strip_prefix("https://").or_else(|| origin.strip_prefix("http://"));
                authority.is_some_and(|a| a.eq_ignore_ascii_case(host))
            }),
            Hosts::Listed { origins, .. } => origins.iter().any(|o| o.eq_ignore_ascii_case(origin)),
        }
    }

    /// A request may call tools, read (sensitive values masked) and reconcile: on loopback,
    /// anyone; elsewhere, or through a proxy, the operator or a caller (the callers' token).
    pub fn may_call(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        match self.stranger(headers) {
            Some(_) if self.is_caller(headers) => Ok(()),
            Some(why) => self.operator(headers).map_err(|_| ApiError::Unauthorized(why)),
            None => Ok(()),
        }
    }

    /// Whether the request carries the callers' token as its bearer token.
    fn is_caller(&self, headers: &HeaderMap) -> bool {
        let given = self.credential(headers, "bearer");
        self.caller.as_deref().is_some_and(|caller| given.is_some_and(|given| same(given.trim(), caller)))
    }

    /// A request may read the console's pages: always on loopback, signed in (or with the token)
    /// elsewhere or through a proxy. The API and MCP take the bearer token only.
    pub fn may_read_console(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        match self.stranger(headers) {
            Some(why) => self.console_operator(headers).map_err(|_| ApiError::Unauthorized(why)),
            None => Ok(()),
        }
    }

    /// A request may hand the server a body: on loopback, anyone; elsewhere, or through a proxy,
    /// only the operator (the token, or the console's sign-in) or a caller. A stranger's body is
    /// refused before a byte of it is read (`guard`), so that strangers cannot make the server
    /// hold bodies of `--max-body` each for the body timeout.
    pub fn may_send_body(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if self.is_caller(headers) { Ok(()) } else { self.may_read_console(headers) }
    }

    /// Why a request counts as a stranger's until it shows the token, if it does: the server is
    /// reached beyond loopback, or a proxy forwarded the request.
    fn stranger(&self, headers: &HeaderMap) -> Option<String> {
        if self.everywhere {
            return Some(NEEDS_TO_CALL.into());
        }
        let header = FORWARDING.iter().find(|name| headers.contains_key(HeaderName::from_static(name)))?;
        Some(format!(
            "this request came through a proxy (it carries `{header}`), and this server was started without \
             --public-url, so it cannot tell the proxy's callers from its own machine: start it with --public-url \
             URL (then every request needs the operator's token), or send `Authorization: Bearer TOKEN`"
        ))
    }

    /// A request comes from the operator: `Authorization: Bearer TOKEN`. (The console's sign-in
    /// counts only on the console's own routes, with their CSRF token: `console_operator`.)
    pub fn operator(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if self.has_bearer(headers) { Ok(()) } else { Err(ApiError::Unauthorized(NEEDS_TOKEN.into())) }
    }

    /// The operator on a console route: the bearer token, or the browser's Basic credentials
    /// (`signed_in`). The route checks the form's CSRF token as well.
    pub fn console_operator(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if self.signed_in(headers) { Ok(()) } else { self.operator(headers) }
    }

    fn has_bearer(&self, headers: &HeaderMap) -> bool {
        self.credential(headers, "bearer").is_some_and(|given| same(given.trim(), &self.token))
    }

    /// Whether the request carries the console's sign-in: `Authorization: Basic` with the token
    /// as its password (whatever the user name).
    fn signed_in(&self, headers: &HeaderMap) -> bool {
        self.basic_password(headers).is_some_and(|given| same(&given, &self.token))
    }

    /// The sign-in page's check: the browser's Basic credentials hold the token, or why not.
    /// Wrong tokens are not counted: every page checks the credentials a browser sends, as the
    /// API checks its bearer token, so a bound here would stop no guesser and would let anyone
    /// who reaches `/login` keep the operator out. A token no one guesses online is the defence
    /// (48 random hex characters when `serve` makes it).
    pub fn sign_in(&self, headers: &HeaderMap) -> Result<(), SignInRefused> {
        let Some(given) = self.basic_password(headers) else { return Err(SignInRefused::Asked) };
        if same(&given, &self.token) { Ok(()) } else { Err(SignInRefused::Wrong) }
    }

    /// The CSRF token of the operator's forms, derived from the token: shown to the operator
    /// (signed in, or a client that sends the bearer token) only; `None` for anyone else, who is
    /// shown no form.
    pub fn csrf(&self, headers: &HeaderMap) -> Option<String> {
        (self.signed_in(headers) || self.has_bearer(headers)).then(|| self.derive("console-csrf"))
    }

    /// Whether `given` is the CSRF token of this request's operator.
    pub fn is_csrf(&self, headers: &HeaderMap, given: &str) -> bool {
        self.csrf(headers).is_some_and(|csrf| same(given, &csrf))
    }

    /// The credentials of `Authorization: SCHEME CREDENTIALS`, if that is the scheme given.
    fn credential<'h>(&self, headers: &'h HeaderMap, scheme: &str) -> Option<&'h str> {
        let (given, credentials) = headers.get(AUTHORIZATION)?.to_str().ok()?.split_once(' ')?;
        given.eq_ignore_ascii_case(scheme).then_some(credentials)
    }

    /// The password of `Authorization: Basic base64(user:password)`.
    fn basic_password(&self, headers: &HeaderMap) -> Option<String> {
        let decoded =
            base64::engine::general_purpose::STANDARD.decode(self.credential(headers, "basic")?.trim()).ok()?;
        let text = String::from_utf8(decoded).ok()?;
        text.split_once(':').map(|(_, password)| password.trim().to_string())
    }

    fn derive(&self, purpose: &str) -> String {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.token.as_bytes()).expect("HMAC takes any key length");
        mac.update(purpose.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }
}

const NEEDS_TOKEN: &str = "this needs the operator's token: `Authorization: Bearer TOKEN` (the token `oncebox serve` \
     was given with --token-file or $ONCEBOX_TOKEN)";
/// What a stranger is told: a caller sends the callers' token, which decides nothing.
const NEEDS_TO_CALL: &str = "this needs a token: `Authorization: Bearer TOKEN`, the callers' token (`oncebox serve \
     --caller-token-file`, for agents and orchestrators: it calls, reads and reconciles) or the operator's";

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

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(listen: &str, public: Option<&str>) -> Auth {
        let public = public.map(|u| url::Url::parse(u).expect("url"));
        Auth::new("t".repeat(16), Some(listen.parse().expect("addr")), public.as_ref())
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, format!("Bearer {token}").parse().expect("header"));
        headers
    }

    #[test]
    fn loopback_takes_calls_without_the_token_and_decisions_only_with_it() {
        let auth = auth("127.0.0.1:7420", None);
        assert!(auth.may_call(&HeaderMap::new()).is_ok());
        assert!(auth.operator(&HeaderMap::new()).is_err());
        assert!(auth.operator(&bearer(&"t".repeat(16))).is_ok());
        assert!(auth.operator(&bearer("wrong")).is_err());
        assert!(auth.is_own_host("localhost:7420") && auth.is_own_host("127.0.0.1:7420"));
        assert!(!auth.is_own_host("evil.example") && !auth.is_own_host("localhost:7421"));
        assert!(auth.is_own_origin("http://localhost:7420", Some("evil.example")));
        assert!(!auth.is_own_origin("http://evil.example", Some("localhost:7420")));
    }

    #[test]
    fn a_forwarded_request_to_a_loopback_server_needs_the_token_whatever_its_host() {
        // nginx's default `proxy_pass` writes the upstream's own loopback address into `Host`.
        let auth = auth("127.0.0.1:7420", None);
        for header in FORWARDING {
            let mut headers = HeaderMap::new();
            headers.insert(HeaderName::from_static(header), "203.0.113.9".parse().expect("header"));
            let refused = auth.may_call(&headers).expect_err(header).to_string();
            assert!(refused.contains("--public-url") && refused.contains(header), "{refused}");
            assert!(auth.may_read_console(&headers).is_err(), "{header}");
            headers.insert(AUTHORIZATION, format!("Bearer {}", "t".repeat(16)).parse().expect("header"));
            assert!(auth.may_call(&headers).is_ok(), "{header} with the token");
        }
    }

    fn basic(user_and_password: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let encoded = base64::engine::general_purpose::STANDARD.encode(user_and_password);
        headers.insert(AUTHORIZATION, format!("Basic {encoded}").parse().expect("header"));
        headers
    }

    #[test]
    fn the_console_s_sign_in_is_the_token_as_a_basic_password_and_its_csrf_token_is_derived_from_it() {
        let auth = auth("127.0.0.1:7420", None);
        let token = "t".repeat(16);
        assert!(matches!(auth.sign_in(&HeaderMap::new()), Err(SignInRefused::Asked)));
        assert!(matches!(auth.sign_in(&basic("operator:wrong")), Err(SignInRefused::Wrong)));
        assert!(auth.sign_in(&basic(&format!("anyone:{token}"))).is_ok(), "any user name");
        assert!(auth.console_operator(&basic(&format!("operator:{token}"))).is_ok());
        assert!(auth.console_operator(&basic("operator:wrong")).is_err());
        assert!(auth.console_operator(&basic(&token)).is_err(), "no colon: no password");
        assert!(auth.operator(&basic(&format!("operator:{token}"))).is_err(), "the API takes the bearer token only");
        let csrf = auth.csrf(&basic(&format!("operator:{token}"))).expect("signed in");
        assert_eq!(auth.csrf(&bearer(&token)), Some(csrf.clone()), "the operator's, however they came");
        assert!(auth.csrf(&HeaderMap::new()).is_none() && auth.csrf(&basic("operator:wrong")).is_none());
        assert!(!auth.is_csrf(&HeaderMap::new(), &csrf), "a form without the sign-in decides nothing");
    }

    #[test]
    fn the_callers_token_calls_and_reads_beyond_loopback_and_decides_nothing() {
        let caller = "c".repeat(16);
        let served = auth("127.0.0.1:7420", Some("https://ops.example")).with_caller(Some(caller.clone()));
        assert!(served.may_call(&bearer(&caller)).is_ok() && served.may_send_body(&bearer(&caller)).is_ok());
        assert!(served.operator(&bearer(&caller)).is_err(), "no decision");
        assert!(served.may_read_console(&bearer(&caller)).is_err() && served.csrf(&bearer(&caller)).is_none());
        assert!(served.console_operator(&basic(&format!("x:{caller}"))).is_err(), "no console sign-in either");
        assert!(served.may_call(&bearer("c-but-not-the-callers")).is_err());
        assert!(served.may_call(&bearer(&"t".repeat(16))).is_ok(), "the operator's still calls");
        let without = auth("127.0.0.1:7420", Some("https://ops.example"));
        assert!(without.may_call(&bearer(&caller)).is_err(), "none given: no caller");
    }

    #[test]
    fn behind_a_public_url_every_request_needs_the_token() {
        // A proxy forwards strangers to a loopback address: the peer proves nothing.
        let auth = auth("127.0.0.1:7420", Some("https://ops.example"));
        assert!(auth.everywhere);
        assert!(auth.may_call(&HeaderMap::new()).is_err());
        assert!(auth.may_read_console(&HeaderMap::new()).is_err());
        assert!(auth.may_call(&bearer(&"t".repeat(16))).is_ok());
        assert!(auth.is_own_host("ops.example") && auth.is_own_host("127.0.0.1:7420"));
        assert!(!auth.is_own_host("evil.example"));
        assert!(auth.is_own_origin("https://ops.example", Some("ops.example")));
        assert!(!auth.is_own_origin("http://ops.example:8080", Some("ops.example")));
    }

    #[test]
    fn beyond_loopback_any_name_with_the_token_and_an_origin_of_that_name() {
        let auth = auth("0.0.0.0:7420", None);
        assert!(auth.everywhere && auth.may_call(&HeaderMap::new()).is_err());
        assert!(auth.is_own_host("10.0.0.5:7420"));
        assert!(auth.is_own_origin("http://10.0.0.5:7420", Some("10.0.0.5:7420")));
        assert!(!auth.is_own_origin("http://evil.example", Some("10.0.0.5:7420")));
        assert!(!auth.is_own_origin("http://10.0.0.5:7420", None));
    }
}
