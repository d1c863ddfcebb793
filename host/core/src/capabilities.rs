//! What one tool may reach beyond its own state: HTTP origins, other KV namespaces, outbox topics,
//! embedder providers and directories. Nothing is granted by default (DESIGN section 8, after
//! Spin's `allowed_outbound_hosts` and Wassette's per-component policy). Pure: grants are resolved
//! when a tool is loaded and checked on every call by the effects; this module only says yes or no,
//! and, for a no, which policy key would say yes.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// What one loaded tool may do: its grants and its limits, resolved when it is loaded (from the
/// policy file and the embedder) and checked on every call.
#[derive(Debug, Clone, Default)]
pub struct Sandbox {
    /// The tool's name: its own KV namespace, and the name denials and logs use.
    pub tool: String,
    pub grants: Grants,
    pub limits: crate::limits::Limits,
}

/// Everything granted to one tool. `Default` grants nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// Origins the tool may send HTTP requests (reads and effects) to.
    pub http: Vec<HttpGrant>,
    /// KV namespaces besides the tool's own (which is named after the tool and always granted).
    pub kv: Vec<String>,
    /// Outbox topics the tool may enqueue to.
    pub outbox: Vec<String>,
    /// Embedder effect providers the tool may call.
    pub providers: Vec<String>,
    /// Host directories the tool sees, through cap-std (wasmtime-wasi's preopens).
    pub dirs: Vec<DirGrant>,
}

/// One grant, as the CLI's `--grant KIND=VALUE` and `HostBuilder::grant` (oncebox-runtime) spell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    Http(HttpGrant),
    Kv(String),
    Outbox(String),
    Provider(String),
    Dir(DirGrant),
}

/// An HTTP origin: scheme, host and port. The host is exact, or `*.suffix` (any subdomain of
/// `suffix`, not `suffix` itself), or `*` (any host); a wildcard exists only where it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGrant {
    scheme: String,
    host: HostPattern,
    port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Exact(String),
    SubdomainOf(String),
    Any,
}

/// A host directory and where the tool sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirGrant {
    pub host: PathBuf,
    pub guest: String,
    pub writable: bool,
}

/// A refused use of a capability: what was wanted and the policy key that would grant it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    /// The policy key under `[tools.NAME.grants]`: `http`, `kv`, `outbox` or `providers`.
    pub key: &'static str,
    /// The value that key would need to hold.
    pub value: String,
}

impl Denied {
    /// The guest-visible message: names the tool, the capability and how an operator grants it.
    pub fn message(&self, tool: &str) -> String {
        let what = match self.key {
            "http" => format!("send HTTP requests to {}", self.value),
            "kv" => format!("use the KV namespace `{}`", self.value),
            "outbox" => format!("enqueue to the outbox topic `{}`", self.value),
            _ => format!("call the effect provider `{}`", self.value),
        };
        format!(
            "capability denied: tool `{tool}` may not {what}; an operator grants it with \
             `{} = [\"{}\"]` under [tools.{tool}.grants] in the policy file",
            self.key, self.value
        )
    }
}

impl Grants {
    /// As `oncebox policy show` prints them, in the policy file's own spelling.
    pub fn to_json(&self) -> serde_json::Value {
        let dirs: Vec<String> = self
            .dirs
            .iter()
            .map(|d| format!("{}:{}:{}", d.host.display(), d.guest, if d.writable { "rw" } else { "ro" }))
            .collect();
        serde_json::json!({
            "http": self.http.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "kv": self.kv,
            "outbox": self.outbox,
            "providers": self.providers,
            "dirs": dirs,
        })
    }

    /// Adds `grant` (once: granting twice changes nothing).
    pub fn add(&mut self, grant: Grant) {
        fn push<T: PartialEq>(list: &mut Vec<T>, item: T) {
            if !list.contains(&item) {
                list.push(item);
            }
        }
        match grant {
            Grant::Http(g) => push(&mut self.http, g),
            Grant::Kv(ns) => push(&mut self.kv, ns),
            Grant::Outbox(topic) => push(&mut self.outbox, topic),
            Grant::Provider(name) => push(&mut self.providers, name),
            Grant::Dir(dir) => push(&mut self.dirs, dir),
        }
    }

    /// Adds everything `other` grants.
    pub fn merge(&mut self, other: &Grants) {
        let http = other.http.iter().cloned().map(Grant::Http);
        let kv = other.kv.iter().cloned().map(Grant::Kv);
        let outbox = other.outbox.iter().cloned().map(Grant::Outbox);
        let providers = other.providers.iter().cloned().map(Grant::Provider);
        let dirs = other.dirs.iter().cloned().map(Grant::Dir);
        for grant in http.chain(kv).chain(outbox).chain(providers).chain(dirs) {
            self.add(grant);
        }
    }

    /// Whether the tool may send a request to `url` (already parsed, so its host is normalised
    /// the way the request will resolve it).
    pub fn check_http(&self, url: &url::Url) -> Result<(), Denied> {
        let scheme = url.scheme();
        let host = url.host_str().unwrap_or_default();
        let port = url.port_or_known_default().unwrap_or(0);
        if self.http.iter().any(|g| g.allows(scheme, host, port)) {
            return Ok(());
        }
        Err(Denied { key: "http", value: format!("{scheme}://{host}:{port}") })
    }

    /// The namespace a KV access goes to: the tool's own when none is named, else a granted one.
    pub fn kv_namespace(&self, tool: &str, requested: Option<&str>) -> Result<String, Denied> {
        match requested {
            None => Ok(tool.to_string()),
            Some(ns) if ns == tool || self.kv.iter().any(|g| g == ns) => Ok(ns.to_string()),
            Some(ns) => Err(Denied { key: "kv", value: ns.to_string() }),
        }
    }

    /// A topic under `oncebox/` is the host's own (signed notifications): never a tool's, whatever
    /// granted it.
    pub fn check_outbox(&self, topic: &str) -> Result<(), Denied> {
        if !crate::notice::reserved(topic) && self.outbox.iter().any(|t| t == topic) {
            return Ok(());
        }
        Err(Denied { key: "outbox", value: topic.to_string() })
    }

    pub fn check_provider(&self, name: &str) -> Result<(), Denied> {
        if self.providers.iter().any(|p| p == name) {
            return Ok(());
        }
        Err(Denied { key: "providers", value: name.to_string() })
    }
}

impl HttpGrant {
    fn allows(&self, scheme: &str, host: &str, port: u16) -> bool {
        if self.scheme != scheme || self.port != port {
            return false;
        }
        match &self.host {
            HostPattern::Exact(h) => h == host,
            HostPattern::SubdomainOf(suffix) => {
                host.strip_suffix(suffix.as_str()).is_some_and(|head| head.len() > 1 && head.ends_with('.'))
            }
            HostPattern::Any => true,
        }
    }
}

impl FromStr for HttpGrant {
    type Err = String;

    /// `scheme://host[:port]`, with nothing after the origin (a grant is an origin, not a URL
    /// prefix: paths are the downstream's business). The port defaults to the scheme's.
    fn from_str(text: &str) -> Result<Self, String> {
        let hint = "write an origin such as \"https://api.example.com\" or \"http://127.0.0.1:8080\"";
        let (scheme, rest) = text.split_once("://").ok_or_else(|| format!("`{text}` has no scheme; {hint}"))?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return Err(format!("`{text}`: only http and https can be granted"));
        }
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#', '@']) {
            return Err(format!("`{text}` is more than an origin (path, query or userinfo); {hint}"));
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((host, port)) if !port.contains(']') => {
                (host, Some(port.parse::<u16>().map_err(|_| format!("`{text}`: `{port}` is not a port"))?))
            }
            _ => (rest, None),
        };
        let default_port = if scheme == "https" { 443 } else { 80 };
        let port = port.unwrap_or(default_port);
        let pattern = if host == "*" {
            HostPattern::Any
        } else if let Some(suffix) = host.strip_prefix("*.") {
            HostPattern::SubdomainOf(normalise_host(&scheme, suffix, text)?)
        } else if host.contains('*') {
            return Err(format!("`{text}`: a wildcard may only be a whole leading label, as in \"*.example.com\""));
        } else {
            HostPattern::Exact(normalise_host(&scheme, host, text)?)
        };
        Ok(HttpGrant { scheme, host: pattern, port })
    }
}

/// The host as the URL parser will present it in a request (lowercase, IDNA, IPv4 canonical), so a
/// grant and a request can be compared as strings.
fn normalise_host(scheme: &str, host: &str, text: &str) -> Result<String, String> {
    let parsed = url::Url::parse(&format!("{scheme}://{host}/")).map_err(|e| format!("`{text}`: {e}"))?;
    parsed.host_str().map(str::to_string).ok_or_else(|| format!("`{text}` has no host"))
}

impl fmt::Display for HttpGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match &self.host {
            HostPattern::Exact(h) => h.clone(),
            HostPattern::SubdomainOf(s) => format!("*.{s}"),
            HostPattern::Any => "*".into(),
        };
        write!(f, "{}://{host}:{}", self.scheme, self.port)
    }
}

impl FromStr for DirGrant {
    type Err = String;

    /// `HOST_PATH:GUEST_PATH[:ro|rw]`, read-only unless `rw` is written.
    fn from_str(text: &str) -> Result<Self, String> {
        let mut parts: Vec<&str> = text.split(':').collect();
        let writable = match parts.last() {
            Some(&"rw") => true,
            Some(&"ro") => false,
            _ => {
                parts.push("ro");
                false
            }
        };
        parts.pop();
        match parts.as_slice() {
            [host, guest] if !host.is_empty() && guest.starts_with('/') => {
                Ok(DirGrant { host: PathBuf::from(host), guest: guest.to_string(), writable })
            }
            _ => Err(format!(
                "`{text}`: write HOST_DIR:GUEST_DIR[:ro|rw], the guest path absolute, as in \"./data:/data:ro\""
            )),
        }
    }
}

impl FromStr for Grant {
    type Err = String;

    /// `http=ORIGIN`, `kv=NAMESPACE`, `outbox=TOPIC`, `provider=NAME` or `dir=HOST:GUEST[:ro|rw]`.
    fn from_str(text: &str) -> Result<Self, String> {
        let (kind, value) = text
            .split_once('=')
            .ok_or_else(|| format!("`{text}`: write KIND=VALUE, KIND one of http, kv, outbox, provider, dir"))?;
        let name = |what: &str| -> Result<String, String> {
            if value.is_empty() || value.len() > 128 || value.chars().any(char::is_control) {
                return Err(format!("`{text}`: a {what} name is 1-128 printable characters"));
            }
            Ok(value.to_string())
        };
        Ok(match kind {
            "http" => Grant::Http(value.parse()?),
            "kv" => Grant::Kv(name("namespace")?),
            "outbox" => {
                let topic = name("topic")?;
                if crate::notice::reserved(&topic) {
                    let reserved = crate::notice::RESERVED_TOPICS;
                    return Err(format!("outbox topic `{topic}`: topics under `{reserved}` are the host's own"));
                }
                Grant::Outbox(topic)
            }
            "provider" => Grant::Provider(name("provider")?),
            "dir" => Grant::Dir(value.parse()?),
            other => return Err(format!("`{other}` is not a capability: http, kv, outbox, provider or dir")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> url::Url {
        url::Url::parse(s).expect("test URL")
    }

    fn http(grants: &[&str]) -> Grants {
        let mut g = Grants::default();
        for text in grants {
            g.add(Grant::Http(text.parse().expect("valid grant")));
        }
        g
    }

    #[test]
    fn no_grant_reaches_a_topic_the_host_signs() {
        let refused = "outbox=oncebox/notify https://hooks.example.com/x".parse::<Grant>();
        assert!(refused.is_err_and(|e| e.contains("the host's own")));
        // Granted anyway (an embedder's Grant::Outbox): still refused where it is checked.
        let mut g = Grants::default();
        g.add(Grant::Outbox("oncebox/notify https://hooks.example.com/x".into()));
        assert!(g.check_outbox("oncebox/notify https://hooks.example.com/x").is_err());
    }

    #[test]
    fn nothing_is_granted_by_default() {
        let g = Grants::default();
        assert_eq!(g.check_http(&url("http://127.0.0.1:8080/x")).map_err(|d| d.key), Err("http"));
        assert_eq!(g.check_outbox("email").map_err(|d| d.value), Err("email".to_string()));
        assert_eq!(g.check_provider("bank").map_err(|d| d.key), Err("providers"));
        assert_eq!(g.kv_namespace("reserve", Some("stock")).map_err(|d| d.key), Err("kv"));
    }

    #[test]
    fn an_origin_grant_matches_scheme_host_and_port_exactly() {
        let g = http(&["http://127.0.0.1:8080"]);
        assert!(g.check_http(&url("http://127.0.0.1:8080/v1/payments?x=1")).is_ok());
        for other in ["https://127.0.0.1:8080/", "http://127.0.0.1:8081/", "http://localhost:8080/"] {
            assert!(g.check_http(&url(other)).is_err(), "{other}");
        }
        // The URL parser's normal form is what is compared: a decimal IPv4 is the same host.
        assert!(g.check_http(&url("http://2130706433:8080/")).is_ok());
    }

    #[test]
    fn default_ports_and_case_are_normalised() {
        let g = http(&["https://API.Example.com"]);
        assert!(g.check_http(&url("https://api.example.com/charges")).is_ok());
        assert!(g.check_http(&url("https://api.example.com:443/")).is_ok());
        assert!(g.check_http(&url("https://api.example.com:8443/")).is_err());
        assert!(g.check_http(&url("http://api.example.com/")).is_err());
    }

    #[test]
    fn wildcards_exist_only_where_written() {
        let g = http(&["https://*.example.com"]);
        assert!(g.check_http(&url("https://a.example.com/")).is_ok());
        assert!(g.check_http(&url("https://a.b.example.com/")).is_ok());
        assert!(g.check_http(&url("https://example.com/")).is_err());
        assert!(g.check_http(&url("https://evilexample.com/")).is_err());
        assert!(g.check_http(&url("https://example.com.evil.net/")).is_err());
        assert!(http(&["http://*:80"]).check_http(&url("http://anything.net/")).is_ok());
    }

    #[test]
    fn a_denial_names_the_key_and_value_that_would_grant_it() {
        let denied = Grants::default().check_http(&url("https://evil.example/steal")).expect_err("denied");
        let message = denied.message("charge");
        assert!(message.contains("`http = [\"https://evil.example:443\"]`"), "{message}");
        assert!(message.contains("[tools.charge.grants]"), "{message}");
    }

    #[test]
    fn grants_that_are_more_than_an_origin_are_refused() {
        for bad in [
            "api.example.com",
            "ftp://example.com",
            "https://example.com/v1",
            "https://user@example.com",
            "https://ex*ample.com",
            "https://example.com:99999",
        ] {
            assert!(bad.parse::<HttpGrant>().is_err(), "{bad}");
        }
        assert_eq!(
            "https://example.com/".parse::<HttpGrant>().map(|g| g.to_string()),
            Ok("https://example.com:443".into())
        );
    }

    #[test]
    fn a_tool_always_has_its_own_namespace_and_only_granted_others() {
        let mut g = Grants::default();
        g.add(Grant::Kv("reservations".into()));
        assert_eq!(g.kv_namespace("reserve", None), Ok("reserve".into()));
        assert_eq!(g.kv_namespace("reserve", Some("reserve")), Ok("reserve".into()));
        assert_eq!(g.kv_namespace("reserve", Some("reservations")), Ok("reservations".into()));
        assert!(g.kv_namespace("reserve", Some("payments")).is_err());
    }

    #[test]
    fn cli_grants_parse() {
        assert_eq!("kv=orders".parse(), Ok(Grant::Kv("orders".into())));
        assert_eq!(
            "dir=/srv/data:/data".parse(),
            Ok(Grant::Dir(DirGrant { host: "/srv/data".into(), guest: "/data".into(), writable: false }))
        );
        assert_eq!(
            "dir=/tmp/x:/scratch:rw".parse(),
            Ok(Grant::Dir(DirGrant { host: "/tmp/x".into(), guest: "/scratch".into(), writable: true }))
        );
        for bad in ["kv", "disk=/x", "dir=/x", "dir=/x:relative", "outbox="] {
            assert!(bad.parse::<Grant>().is_err(), "{bad}");
        }
    }
}
