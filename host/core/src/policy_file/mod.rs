//! The operator's policy file, `oncebox.toml`: per-tool retry overrides and settings, what each
//! downstream HTTP host promises, where each outbox topic is delivered (`outbox.rs`), and how a
//! server asks again about unknown operations (`reconciler.rs`). Pure: parsing and checking only; `load` is the one read.
//!
//! Everything the file can get wrong without knowing a tool's class is refused at parse, so a bad
//! file stops the host before any call. What depends on the class (DESIGN section 5: an irreversible
//! tool is never retried) is refused by [`PolicyFile::effective`], when the tool is loaded. Every
//! refusal names the file and the line, because the operator fixes a file, not a data structure.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value as Json, json};
use toml::{Spanned, Value};

use crate::capabilities::{Grant, Grants};
use crate::delivery::Endpoint;
use crate::limits::{self, Limits};
use crate::policy::{ReplayClass, RetryPolicy};
use crate::targets::HttpTarget;

pub use crate::policy::MAX_ATTEMPTS_LIMIT;

/// The `RetryPolicy` fields a file may set, as the file spells them, in the struct's order.
const FIELDS: [&str; 7] = [
    "max_attempts",
    "initial_backoff",
    "max_backoff",
    "redispatch_in_doubt",
    "requires_approval",
    "attempt_deadline",
    "call_deadline",
];

/// A parsed and checked policy file. Cheap to clone; holds no handle on the file.
#[derive(Debug, Clone)]
pub struct PolicyFile {
    path: PathBuf,
    tools: BTreeMap<String, ToolSection>,
    hosts: BTreeMap<String, HttpTarget>,
    /// `[outbox.TOPIC]`, without the credentials (joined from `hosts` when asked for).
    outbox: BTreeMap<String, Endpoint>,
    /// `[reconciler]`, its defaults filled in.
    reconciler: crate::reconcile_schedule::Settings,
    /// `[notify]`, if the file has one.
    notify: Option<notify::Settings>,
}

/// A value and the 1-based line it came from, kept so that later refusals can point at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct At<T> {
    value: T,
    line: usize,
}

/// One `[tools.NAME]`, already checked for everything that does not depend on the class.
#[derive(Debug, Clone, Default)]
struct ToolSection {
    max_attempts: Option<At<u32>>,
    initial_backoff: Option<At<Duration>>,
    max_backoff: Option<At<Duration>>,
    redispatch_in_doubt: Option<At<bool>>,
    requires_approval: Option<At<bool>>,
    attempt_deadline: Option<At<Duration>>,
    call_deadline: Option<At<Duration>>,
    config: Config,
    grants: Grants,
    limits: Limits,
}

/// `[tools.NAME.config]`. Its `Debug` shows keys only: operators put credentials here, and a
/// policy file ends up in logs more easily than a secret store does.
#[derive(Clone, Default)]
struct Config(Vec<(String, String)>);

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter().map(|(k, _)| k)).finish()
    }
}

/// A tool's retry policy with, for each field, where its value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effective {
    pub policy: RetryPolicy,
    /// One entry per `RetryPolicy` field, named as in the file, in the struct's order.
    pub sources: Vec<(&'static str, Source)>,
}

/// Where one setting came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The class's default (DESIGN section 5): the file does not mention it.
    ClassDefault(ReplayClass),
    /// The policy file, at this 1-based line.
    File { path: PathBuf, line: usize },
    /// Set in code by the embedder (`HostBuilder::retry_policy`).
    Embedder,
}

/// Why a policy file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The file could not be read at all.
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The file says something impossible, unknown or forbidden, at this 1-based line.
    #[error("{path}:{line}: {reason}")]
    Invalid { path: PathBuf, line: usize, reason: String },
}

impl PolicyFile {
    /// Reads and parses the file at `path`.
    pub fn load(path: &Path) -> Result<PolicyFile, PolicyError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| PolicyError::Io { path: path.to_path_buf(), source })?;
        PolicyFile::parse(&text, path)
    }

    /// Parses `text`; `path` is used only to name the file in messages and sources.
    pub fn parse(text: &str, path: &Path) -> Result<PolicyFile, PolicyError> {
        let lines = Lines { text, path };
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            // toml's Display draws a snippet over several lines; the span gives our one-line form.
            let line = e.span().map_or(1, |span| lines.line(span.start));
            PolicyError::Invalid { path: path.to_path_buf(), line, reason: e.message().trim_end().to_string() }
        })?;
        let mut tools = BTreeMap::new();
        for (name, section) in raw.tools {
            tools.insert(name.into_inner(), lines.tool(section)?);
        }
        let mut hosts = BTreeMap::new();
        for (host, section) in raw.hosts {
            let target = lines.host(&host, section)?;
            hosts.insert(host.into_inner(), target);
        }
        let outbox = outbox::parse(&lines, raw.outbox)?;
        let reconciler = lines.reconciler(raw.reconciler)?;
        let notify = lines.notify(raw.notify)?;
        Ok(PolicyFile { path: path.to_path_buf(), tools, hosts, outbox, reconciler, notify })
    }

    /// No file: every tool gets its class defaults, every host `HttpTarget::default()`.
    pub fn empty() -> PolicyFile {
        PolicyFile {
            path: PathBuf::new(),
            tools: BTreeMap::new(),
            hosts: BTreeMap::new(),
            outbox: BTreeMap::new(),
            reconciler: crate::reconcile_schedule::Settings::default(),
            notify: None,
        }
    }

    /// The path the file was parsed as (empty for [`PolicyFile::empty`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Class defaults overridden by the file's [tools.NAME]; refuses what the class forbids.
    ///
    /// Also refuses a combination that only appears once the defaults are filled in (say
    /// `initial_backoff = "5s"` against a default `max_backoff` of 2 s): the file line that made it is
    /// named, because that is the line the operator must change.
    pub fn effective(&self, tool: &str, class: ReplayClass) -> Result<Effective, PolicyError> {
        let mut policy = RetryPolicy::for_class(class);
        let mut sources: Vec<(&'static str, Source)> =
            FIELDS.iter().map(|&field| (field, Source::ClassDefault(class))).collect();
        let Some(section) = self.tools.get(tool) else {
            return Ok(Effective { policy, sources });
        };
        let mut from_file = |field: &str, line: usize| {
            if let Some((_, source)) = sources.iter_mut().find(|(f, _)| *f == field) {
                *source = Source::File { path: self.path.clone(), line };
            }
        };
        if let Some(at) = section.max_attempts {
            policy.max_attempts = at.value;
            from_file("max_attempts", at.line);
        }
        if let Some(at) = section.redispatch_in_doubt {
            policy.redispatch_in_doubt = at.value;
            from_file("redispatch_in_doubt", at.line);
        }
        if let Some(at) = section.requires_approval {
            policy.requires_approval = at.value;
            from_file("requires_approval", at.line);
        }
        let durations = [
            ("initial_backoff", section.initial_backoff, &mut policy.initial_backoff),
            ("max_backoff", section.max_backoff, &mut policy.max_backoff),
            ("attempt_deadline", section.attempt_deadline, &mut policy.attempt_deadline),
            ("call_deadline", section.call_deadline, &mut policy.call_deadline),
        ];
        for (field, at, slot) in durations {
            if let Some(at) = at {
                *slot = at.value;
                from_file(field, at.line);
            }
        }
        // The one class check every source of policy passes (`RetryPolicy::check`). The line named
        // is the one the operator must change: the field's, or its partner's when the field is a
        // class default (say `initial_backoff = "5s"` against a default `max_backoff` of 2 s).
        if let Err(violation) = policy.check(class) {
            let line_of = |field: &str| match field {
                "max_attempts" => section.max_attempts.map(|at| at.line),
                "redispatch_in_doubt" => section.redispatch_in_doubt.map(|at| at.line),
                "requires_approval" => section.requires_approval.map(|at| at.line),
                "initial_backoff" => section.initial_backoff.map(|at| at.line),
                "max_backoff" => section.max_backoff.map(|at| at.line),
                "attempt_deadline" => section.attempt_deadline.map(|at| at.line),
                "call_deadline" => section.call_deadline.map(|at| at.line),
                _ => None,
            };
            let partner = match &violation {
                crate::policy::Violation::Order { big, .. } => line_of(big),
                _ => None,
            };
            let line = line_of(violation.field()).or(partner).unwrap_or(1);
            return Err(self.invalid(line, format!("{violation} for `{tool}` ({class}, its defaults filled in)")));
        }
        Ok(Effective { policy, sources })
    }

    /// [tools.NAME.config] as (key, value) pairs, sorted by key; empty when the file has none.
    pub fn config(&self, tool: &str) -> Vec<(String, String)> {
        self.tools.get(tool).map(|section| section.config.0.clone()).unwrap_or_default()
    }

    /// [tools.NAME.grants]: what the tool may reach. Nothing when the file does not say.
    pub fn grants(&self, tool: &str) -> Grants {
        self.tools.get(tool).map(|section| section.grants.clone()).unwrap_or_default()
    }

    /// [tools.NAME.limits] over the defaults of `limits.rs`.
    pub fn limits(&self, tool: &str) -> Limits {
        self.tools.get(tool).map(|section| section.limits).unwrap_or_default()
    }

    /// Every [hosts."H"] as (host, HttpTarget), defaults filled from HttpTarget::default().
    pub fn hosts(&self) -> Vec<(String, HttpTarget)> {
        self.hosts.iter().map(|(host, target)| (host.clone(), target.clone())).collect()
    }

    /// Tool names the file mentions (so the host can warn about a section for a tool never loaded).
    pub fn tool_names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    fn invalid(&self, line: usize, reason: String) -> PolicyError {
        PolicyError::Invalid { path: self.path.clone(), line, reason }
    }

    /// `[reconciler]`: whether a server asks again about unknown operations, and how often.
    pub fn reconciler(&self) -> crate::reconcile_schedule::Settings {
        self.reconciler
    }

    /// Every `[outbox.TOPIC]` as (topic, endpoint), in topic order, each with the credentials of
    /// `[hosts."HOST:PORT".headers]` for its endpoint's host.
    pub fn outbox_endpoints(&self) -> Vec<(String, Endpoint)> {
        let with_credentials = |endpoint: &Endpoint| {
            let mut endpoint = endpoint.clone();
            if let Some(target) = self.hosts.get(&endpoint.host_port()) {
                endpoint.headers.clone_from(&target.headers);
            }
            endpoint
        };
        let notify = self.notify.iter().flat_map(notify::Settings::topics);
        self.outbox.iter().map(|(topic, endpoint)| (topic.clone(), with_credentials(endpoint))).chain(notify).collect()
    }

    /// `[notify]`: where a person is told, and how it is signed; `None` if the file has none.
    pub fn notify(&self) -> Option<&notify::Settings> {
        self.notify.as_ref()
    }
}

impl Effective {
    /// Where `field` (spelled as in the file) came from.
    pub fn source(&self, field: &str) -> Option<&Source> {
        self.sources.iter().find(|(f, _)| *f == field).map(|(_, source)| source)
    }

    /// `{"policy": {...}, "sources": {...}}`, durations as humantime strings ("100ms"), sources as
    /// their Display ("default for compensatable", "oncebox.toml:12").
    pub fn to_json(&self) -> Json {
        let p = &self.policy;
        let duration = |d: Duration| Json::String(humantime::format_duration(d).to_string());
        let sources: Map<String, Json> =
            self.sources.iter().map(|(field, source)| (field.to_string(), Json::String(source.to_string()))).collect();
        json!({
            "policy": {
                "max_attempts": p.max_attempts,
                "initial_backoff": duration(p.initial_backoff),
                "max_backoff": duration(p.max_backoff),
                "redispatch_in_doubt": p.redispatch_in_doubt,
                "requires_approval": p.requires_approval,
                "attempt_deadline": duration(p.attempt_deadline),
                "call_deadline": duration(p.call_deadline),
            },
            "sources": sources,
        })
    }
}

// By hand because `RetryPolicy` is not `Serialize`, and durations read better as "100ms" than as
// serde's `{secs, nanos}`.
impl serde::Serialize for Effective {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(serializer)
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::ClassDefault(class) => write!(f, "default for {class}"),
            Source::File { path, line } => write!(f, "{}:{line}", path.display()),
            Source::Embedder => f.write_str("set by the embedder"),
        }
    }
}

impl serde::Serialize for Source {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

// The file as toml sees it. Values are `toml::Value` rather than typed so that a wrong type is
// refused with a message naming the field, not serde's "invalid type: integer, expected a string".
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    tools: BTreeMap<Spanned<String>, RawTool>,
    #[serde(default)]
    hosts: BTreeMap<Spanned<String>, RawHost>,
    #[serde(default)]
    outbox: BTreeMap<Spanned<String>, outbox::RawOutbox>,
    reconciler: Option<reconciler::RawReconciler>,
    notify: Option<Spanned<notify::RawNotify>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTool {
    max_attempts: Option<Spanned<Value>>,
    initial_backoff: Option<Spanned<Value>>,
    max_backoff: Option<Spanned<Value>>,
    redispatch_in_doubt: Option<Spanned<Value>>,
    requires_approval: Option<Spanned<Value>>,
    attempt_deadline: Option<Spanned<Value>>,
    call_deadline: Option<Spanned<Value>>,
    #[serde(default)]
    config: BTreeMap<Spanned<String>, Spanned<Value>>,
    #[serde(default)]
    grants: RawGrants,
    #[serde(default)]
    limits: BTreeMap<Spanned<String>, Spanned<Value>>,
}

/// `[tools.NAME.grants]`: each a list of strings, in the syntax of `capabilities.rs`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawGrants {
    http: Option<Spanned<Value>>,
    kv: Option<Spanned<Value>>,
    outbox: Option<Spanned<Value>>,
    providers: Option<Spanned<Value>>,
    dirs: Option<Spanned<Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    honours_keys: Option<Spanned<Value>>,
    key_retention: Option<Spanned<Value>>,
    timeout: Option<Spanned<Value>>,
    settle_window: Option<Spanned<Value>>,
    /// Credentials the host attaches at dispatch, e.g. `authorization = "Bearer ..."`.
    #[serde(default)]
    headers: BTreeMap<Spanned<String>, Spanned<Value>>,
}

/// The text being parsed, to turn byte offsets into lines and refusals into errors.
struct Lines<'a> {
    text: &'a str,
    path: &'a Path,
}

impl Lines<'_> {
    fn line(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end].iter().filter(|&&b| b == b'\n').count() + 1
    }

    fn invalid(&self, span: Range<usize>, reason: String) -> PolicyError {
        PolicyError::Invalid { path: self.path.to_path_buf(), line: self.line(span.start), reason }
    }

    fn tool(&self, raw: RawTool) -> Result<ToolSection, PolicyError> {
        let section = ToolSection {
            max_attempts: raw.max_attempts.map(|v| self.attempts(v)).transpose()?,
            initial_backoff: raw.initial_backoff.map(|v| self.positive("initial_backoff", v)).transpose()?,
            max_backoff: raw.max_backoff.map(|v| self.positive("max_backoff", v)).transpose()?,
            redispatch_in_doubt: raw.redispatch_in_doubt.map(|v| self.boolean("redispatch_in_doubt", v)).transpose()?,
            requires_approval: raw.requires_approval.map(|v| self.boolean("requires_approval", v)).transpose()?,
            attempt_deadline: raw.attempt_deadline.map(|v| self.positive("attempt_deadline", v)).transpose()?,
            call_deadline: raw.call_deadline.map(|v| self.positive("call_deadline", v)).transpose()?,
            config: Config(
                raw.config.into_iter().map(|(key, value)| self.config_value(key, value)).collect::<Result<_, _>>()?,
            ),
            grants: self.grants(raw.grants)?,
            limits: self.limits(raw.limits)?,
        };
        ordered(self.path, ("initial_backoff", section.initial_backoff), ("max_backoff", section.max_backoff))?;
        ordered(self.path, ("attempt_deadline", section.attempt_deadline), ("call_deadline", section.call_deadline))?;
        Ok(section)
    }

    fn grants(&self, raw: RawGrants) -> Result<Grants, PolicyError> {
        let mut grants = Grants::default();
        let lists = [
            ("http", raw.http),
            ("kv", raw.kv),
            ("outbox", raw.outbox),
            ("providers", raw.providers),
            ("dirs", raw.dirs),
        ];
        for (field, list) in lists {
            for (span, text) in self.strings(field, list)? {
                let kind = match field {
                    "providers" => "provider",
                    "dirs" => "dir",
                    other => other,
                };
                if kind == "outbox" && crate::notice::reserved(&text) {
                    let reserved = crate::notice::RESERVED_TOPICS;
                    return Err(self.invalid(
                        span,
                        format!("outbox topic `{text}`: topics under `{reserved}` are the host's own"),
                    ));
                }
                let text = if kind == "dir" { self.relative_to_file(&text) } else { text };
                let grant: Grant = format!("{kind}={text}").parse().map_err(|reason| self.invalid(span, reason))?;
                grants.add(grant);
            }
        }
        Ok(grants)
    }

    /// A directory grant's host path, relative paths read from the policy file's directory (the
    /// operator wrote them next to the file, not next to wherever the host happens to start).
    fn relative_to_file(&self, grant: &str) -> String {
        let base = self.path.parent().filter(|p| !p.as_os_str().is_empty());
        match base {
            Some(base) if !grant.starts_with('/') => base.join(grant).display().to_string(),
            _ => grant.to_string(),
        }
    }

    /// A list of strings, each with its span.
    fn strings(&self, field: &str, value: Option<Spanned<Value>>) -> Result<Vec<(Range<usize>, String)>, PolicyError> {
        let Some(value) = value else { return Ok(Vec::new()) };
        let span = value.span();
        let Value::Array(items) = value.into_inner() else {
            return Err(
                self.invalid(span, format!("grant `{field}` must be a list of strings, as in {field} = [\"...\"]"))
            );
        };
        items
            .into_iter()
            .map(|item| match item {
                Value::String(text) => Ok((span.clone(), text)),
                other => {
                    Err(self.invalid(span.clone(), format!("grant `{field}` holds {}, not a string", other.type_str())))
                }
            })
            .collect()
    }

    fn limits(&self, raw: BTreeMap<Spanned<String>, Spanned<Value>>) -> Result<Limits, PolicyError> {
        let mut result = Limits::default();
        for (field, value) in raw {
            let span = value.span();
            let is_size =
                limits::FIELDS.iter().find(|(name, _)| name == field.get_ref()).is_some_and(|(_, size)| *size);
            let n = match value.into_inner() {
                Value::Integer(n) => u64::try_from(n).map_err(|_| {
                    self.invalid(span.clone(), format!("limit `{}` cannot be negative", field.get_ref()))
                })?,
                Value::String(text) if is_size => limits::parse_size(&text)
                    .map_err(|reason| self.invalid(span.clone(), format!("limit `{}`: {reason}", field.get_ref())))?,
                other => {
                    let want = if is_size { "a size such as \"64MiB\" or a number of bytes" } else { "an integer" };
                    return Err(self.invalid(
                        span,
                        format!("limit `{}` must be {want}, not {}", field.get_ref(), other.type_str()),
                    ));
                }
            };
            result.set(field.get_ref(), n).map_err(|reason| self.invalid(field.span(), reason))?;
        }
        Ok(result)
    }

    fn host(&self, name: &Spanned<String>, raw: RawHost) -> Result<HttpTarget, PolicyError> {
        if !is_host_port(name.get_ref()) {
            // The effect path looks hosts up as `host:port`; any other key would silently never match.
            return Err(self.invalid(
                name.span(),
                format!("host `{}` must be written `host:port`, as in \"127.0.0.1:8080\"", name.get_ref()),
            ));
        }
        let mut target = HttpTarget::default();
        let honours_keys = raw.honours_keys.map(|v| self.boolean("honours_keys", v)).transpose()?;
        if let Some(at) = honours_keys {
            target.honours_keys = at.value;
        }
        if let Some(value) = raw.key_retention {
            if !target.honours_keys {
                return Err(self.invalid(
                    value.span(),
                    format!(
                        "`key_retention` for `{}` needs `honours_keys = true`: a downstream that ignores keys \
                         retains none",
                        name.get_ref()
                    ),
                ));
            }
            // Zero is allowed: a downstream that honours keys but forgets them at once never allows a resend.
            target.key_retention = self.duration("key_retention", value)?.value;
        }
        if let Some(value) = raw.timeout {
            target.timeout = self.positive("timeout", value)?.value;
        }
        if let Some(value) = raw.settle_window {
            // Zero is allowed: a downstream whose lookups are exact the moment it answers.
            target.settle_window = self.duration("settle_window", value)?.value;
        }
        for (name, value) in raw.headers {
            let span = value.span();
            match value.into_inner() {
                Value::String(value) => target.headers.push((name.into_inner().to_ascii_lowercase(), value)),
                other => {
                    return Err(self.invalid(
                        span,
                        format!("header `{}` must be a string, not {}", name.get_ref(), other.type_str()),
                    ));
                }
            }
        }
        Ok(target)
    }

    fn attempts(&self, value: Spanned<Value>) -> Result<At<u32>, PolicyError> {
        let span = value.span();
        let n = match value.into_inner() {
            Value::Integer(n) => n,
            other => {
                return Err(self.invalid(span, format!("`max_attempts` must be an integer, not {}", other.type_str())));
            }
        };
        match u32::try_from(n) {
            Ok(0) => Err(self.invalid(
                span,
                "`max_attempts = 0`: the first attempt counts, so it must be at least 1 (1 disables retries)".into(),
            )),
            Ok(n) if n <= MAX_ATTEMPTS_LIMIT => Ok(At { value: n, line: self.line(span.start) }),
            _ => Err(self.invalid(
                span,
                format!("`max_attempts = {n}`: must be from 1 to {MAX_ATTEMPTS_LIMIT}, the first attempt included"),
            )),
        }
    }

    fn boolean(&self, field: &str, value: Spanned<Value>) -> Result<At<bool>, PolicyError> {
        let span = value.span();
        match value.into_inner() {
            Value::Boolean(b) => Ok(At { value: b, line: self.line(span.start) }),
            other => Err(self.invalid(span, format!("`{field}` must be true or false, not {}", other.type_str()))),
        }
    }

    /// A humantime duration, zero allowed.
    fn duration(&self, field: &str, value: Spanned<Value>) -> Result<At<Duration>, PolicyError> {
        let span = value.span();
        let text = match value.into_inner() {
            Value::String(text) => text,
            other => {
                return Err(self.invalid(
                    span,
                    format!(
                        "`{field}` must be a duration string such as \"250ms\" or \"2s\", not {}",
                        other.type_str()
                    ),
                ));
            }
        };
        if text.trim_start().starts_with('-') {
            return Err(self.invalid(span, format!("`{field} = \"{text}\"`: a duration cannot be negative")));
        }
        match humantime::parse_duration(&text) {
            Ok(d) => Ok(At { value: d, line: self.line(span.start) }),
            Err(e) => Err(self.invalid(
                span,
                format!("`{field} = \"{text}\"` is not a duration ({e}); write e.g. \"250ms\", \"2s\", \"24h\""),
            )),
        }
    }

    /// A duration that must be more than zero: a zero backoff spins, a zero deadline or timeout
    /// fails every attempt before it starts.
    fn positive(&self, field: &str, value: Spanned<Value>) -> Result<At<Duration>, PolicyError> {
        let span = value.span();
        let at = self.duration(field, value)?;
        if at.value.is_zero() {
            return Err(self.invalid(span, format!("`{field}` must be more than zero")));
        }
        Ok(at)
    }

    fn config_value(&self, key: Spanned<String>, value: Spanned<Value>) -> Result<(String, String), PolicyError> {
        let span = value.span();
        match value.into_inner() {
            Value::String(s) => Ok((key.into_inner(), s)),
            // A tool reads config as strings; converting silently would hide a quoting mistake.
            other => Err(self.invalid(
                span,
                format!("config `{}` must be a string (quote it), not {}", key.get_ref(), other.type_str()),
            )),
        }
    }
}

/// Refuses `small > big` when the file gives both, at the line of `small`.
fn ordered(
    path: &Path,
    (small, small_at): (&str, Option<At<Duration>>),
    (big, big_at): (&str, Option<At<Duration>>),
) -> Result<(), PolicyError> {
    match (small_at, big_at) {
        (Some(s), Some(b)) if s.value > b.value => Err(PolicyError::Invalid {
            path: path.to_path_buf(),
            line: s.line,
            reason: format!(
                "`{small}` ({}) exceeds `{big}` ({}, line {})",
                humantime::format_duration(s.value),
                humantime::format_duration(b.value),
                b.line
            ),
        }),
        _ => Ok(()),
    }
}

/// `host:port` as the effect path builds it from a URL: a non-empty host, a numeric port, no
/// scheme or path.
fn is_host_port(key: &str) -> bool {
    match key.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok(),
        None => false,
    }
}

pub mod notify;
mod outbox;
mod reconciler;
#[cfg(test)]
mod tests;
