//! The script that stands in for every downstream: what it answers, by effect label and
//! occurrence, and what reached it. It lives across a harness's restarts, as a real downstream
//! outlives the host that crashed.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;

use oncebox_runtime::HttpTarget;
use oncebox_runtime::hooks::{Exchange, Outgoing};

/// A fault the script can answer an effect with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// The downstream commits; the response is lost on its way back.
    LostResponse,
    /// The downstream commits, then answers 502 (a gateway that failed after its origin did the work).
    #[serde(rename = "commit-then-5xx")]
    CommitThen5xx,
    /// The downstream commits and answers after the host's timeout.
    LateAnswer,
    /// The connection is refused before any byte is written: nothing committed.
    Transient,
    /// 429 with `Retry-After-Ms: 10`: nothing committed.
    RateLimited,
    /// 400: the downstream refuses, nothing committed.
    Permanent,
}

impl Fault {
    /// Every fault, in the order a report lists them.
    pub const ALL: [Fault; 6] = [
        Fault::LostResponse,
        Fault::CommitThen5xx,
        Fault::LateAnswer,
        Fault::Transient,
        Fault::RateLimited,
        Fault::Permanent,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::LostResponse => "lost-response",
            Fault::CommitThen5xx => "commit-then-5xx",
            Fault::LateAnswer => "late-answer",
            Fault::Transient => "transient",
            Fault::RateLimited => "rate-limited",
            Fault::Permanent => "permanent",
        }
    }

    /// Whether the downstream did the work before the fault.
    fn commits(self) -> bool {
        matches!(self, Fault::LostResponse | Fault::CommitThen5xx | Fault::LateAnswer)
    }
}

/// How one effect (by label, and optionally occurrence and dispatch) is answered.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub label: String,
    /// Which use of the label in an attempt (0 = the first); any when absent.
    #[serde(default)]
    pub occurrence: Option<u32>,
    /// Which dispatch of that effect this rule answers (1 = the first); every one when absent.
    #[serde(default)]
    pub dispatch: Option<u32>,
    /// The answer's status (default 200) and body (default: the request's body, echoed).
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub body: Option<String>,
    /// A fault instead of an answer.
    #[serde(default)]
    pub fault: Option<Fault>,
    /// How long the downstream takes to answer ("50ms"); past the host's timeout it is late.
    #[serde(default)]
    pub delay: Option<String>,
}

/// How reads (GETs, reconcile lookups) whose URL contains `url_contains` are answered.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadRule {
    pub url_contains: String,
    #[serde(default = "ok")]
    pub status: u16,
    #[serde(default)]
    pub body: String,
}

fn ok() -> u16 {
    200
}

/// What the script says of itself as a downstream.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// It deduplicates by `Idempotency-Key`: a resent key gets the first commit's answer, and the
    /// host may resend an effect in doubt. Default true, as with Stripe.
    pub honours_keys: bool,
    /// How long the host waits for its answer ("200ms").
    pub timeout: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { honours_keys: true, timeout: "200ms".into() }
    }
}

/// The script: `oncebox test --script FILE.toml`.
///
/// ```toml
/// [downstream]
/// honours_keys = true     # it deduplicates by Idempotency-Key (default)
/// timeout = "200ms"       # how long the host waits for an answer
///
/// [[effect]]
/// label = "charge"
/// status = 201
/// body = '{"id": "pay_1", "status": "succeeded"}'
///
/// [[effect]]
/// label = "charge"
/// dispatch = 1            # only the first dispatch
/// fault = "lost-response" # lost-response, commit-then-5xx, late-answer, transient, rate-limited, permanent
///
/// [[read]]
/// url_contains = "/stock/"
/// body = '{"available": 3}'
/// ```
///
/// An effect no rule names is answered 200 with its own request body. A read no rule names is a
/// lookup by key: a URL that contains the key of an effect the script committed gets 200 and that
/// commit's body, any other 404 (so `Reconciliation::lookup` works against it unchanged).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    #[serde(default)]
    pub downstream: Settings,
    #[serde(default, rename = "effect")]
    pub effects: Vec<Rule>,
    #[serde(default, rename = "read")]
    pub reads: Vec<ReadRule>,
}

/// A script that cannot be used, with the reason.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {reason}")]
pub struct ScriptError {
    what: String,
    reason: String,
}

impl Script {
    pub fn parse(text: &str) -> Result<Script, ScriptError> {
        let script: Script =
            toml::from_str(text).map_err(|e| ScriptError { what: "script".into(), reason: e.to_string() })?;
        script.timeout()?;
        for rule in &script.effects {
            rule.delay()?;
        }
        Ok(script)
    }

    pub fn load(path: &Path) -> Result<Script, ScriptError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ScriptError { what: path.display().to_string(), reason: e.to_string() })?;
        Script::parse(&text).map_err(|e| ScriptError { what: path.display().to_string(), reason: e.to_string() })
    }

    /// The host's timeout for the script's answers.
    pub fn timeout(&self) -> Result<Duration, ScriptError> {
        humantime::parse_duration(&self.downstream.timeout).map_err(|e| ScriptError {
            what: format!("downstream.timeout = {:?}", self.downstream.timeout),
            reason: e.to_string(),
        })
    }

    /// What the host is told of every downstream: what the script says, and a settle window of
    /// zero, since the script commits synchronously (an empty lookup is proof once the request's
    /// timeout has passed).
    pub(crate) fn target(&self) -> HttpTarget {
        HttpTarget {
            honours_keys: self.downstream.honours_keys,
            key_retention: Duration::from_secs(24 * 3600),
            timeout: self.timeout().unwrap_or(Duration::from_millis(200)),
            settle_window: Duration::ZERO,
            headers: Vec::new(),
        }
    }
}

impl Rule {
    fn delay(&self) -> Result<Duration, ScriptError> {
        self.delay.as_deref().map_or(Ok(Duration::ZERO), |text| {
            humantime::parse_duration(text).map_err(|e| ScriptError {
                what: format!("effect `{}`: delay = {text:?}", self.label),
                reason: e.to_string(),
            })
        })
    }
}

/// One request that reached the script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatch {
    /// The `Idempotency-Key` it carried.
    pub key: String,
    pub label: String,
    pub occurrence: u32,
    pub method: String,
    pub url: String,
    pub body: Vec<u8>,
    /// The work was done by this request (not a replay of an earlier commit of its key).
    pub landed: bool,
    /// The host could not know what became of it: the answer was lost, late or a 5xx, or the
    /// host crashed before recording it.
    pub in_doubt: bool,
    /// What the script answered, in a few words.
    pub answer: String,
}

impl Dispatch {
    /// The same request, whatever key it carried: how a duplicate under another key is found.
    pub fn same_request(&self, other: &Dispatch) -> bool {
        self.method == other.method && self.url == other.url && self.body == other.body
    }
}

/// Something the harness did between dispatches that changes what a resend means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    Dispatch(usize),
    /// A reconcile proved that the effect in doubt was not taken: a resend of it is no longer silent.
    ProvenNotTaken,
}

#[derive(Debug, Default)]
struct State {
    dispatches: Vec<Dispatch>,
    events: Vec<Event>,
    /// Per (label, occurrence): how many dispatches reached the script.
    counts: HashMap<(String, u32), u32>,
    /// Effects in the order they first reached the script: their ordinals.
    order: Vec<(String, u32)>,
    /// The answer of each key's commit, replayed to a resend where keys are honoured.
    commits: HashMap<String, (u16, Vec<u8>)>,
}

/// The scripted downstream: the script, and what reached it.
#[derive(Debug, Clone)]
pub(crate) struct Downstream {
    pub script: Arc<Script>,
    /// A fault for the first dispatch of one effect (by ordinal), over the script.
    pub injected: Option<(usize, Fault)>,
    state: Arc<Mutex<State>>,
}

impl Downstream {
    pub fn new(script: Arc<Script>, injected: Option<(usize, Fault)>) -> Self {
        Downstream { script, injected, state: Arc::new(Mutex::new(State::default())) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn dispatches(&self) -> Vec<Dispatch> {
        self.state().dispatches.clone()
    }

    pub fn events(&self) -> Vec<Event> {
        self.state().events.clone()
    }

    pub fn note(&self, event: Event) {
        self.state().events.push(event);
    }

    /// The host crashed before it recorded the answer to `key`'s last dispatch.
    pub fn answer_lost(&self, key: &str) {
        if let Some(last) = self.state().dispatches.iter_mut().rev().find(|d| d.key == key) {
            last.in_doubt = true;
        }
    }

    /// Answers an effect, and records it.
    pub async fn http(&self, key: String, label: String, occurrence: u32, request: Outgoing) -> Exchange {
        let timeout = self.script.target().timeout;
        let (exchange, delay) = {
            let mut state = self.state();
            let effect = (label.clone(), occurrence);
            if !state.order.contains(&effect) {
                state.order.push(effect.clone());
            }
            let ordinal = state.order.iter().position(|e| *e == effect).unwrap_or_default();
            let count = state.counts.entry(effect).or_insert(0);
            *count += 1;
            let nth = *count;
            let replay = if self.script.downstream.honours_keys { state.commits.get(&key).cloned() } else { None };
            let (exchange, landed, in_doubt, answer, delay) = match replay {
                Some((status, body)) => {
                    let answer = format!("{status} (replayed for its key)");
                    (Exchange::Answered { status, headers: Vec::new(), body }, false, false, answer, Duration::ZERO)
                }
                None => self.answer(&label, occurrence, (ordinal, nth), &request),
            };
            if landed {
                // What a resend with this key is answered, where keys are honoured, and what a lookup
                // by the key finds: the commit's answer, even when the fault lost it on the way.
                let committed = match &exchange {
                    Exchange::Answered { status, body, .. } if (200..400).contains(status) => (*status, body.clone()),
                    _ => (200, self.body_for(&label, occurrence, nth, &request)),
                };
                state.commits.insert(key.clone(), committed);
            }
            // An answer later than the host waits is no answer: the host cannot tell what happened.
            let late = delay >= timeout;
            let index = state.dispatches.len();
            state.dispatches.push(Dispatch {
                key,
                label,
                occurrence,
                method: request.method,
                url: request.url,
                body: request.body,
                landed,
                in_doubt: in_doubt || late,
                answer: if late && !answer.ends_with("late-answer") { format!("{answer}, late") } else { answer },
            });
            state.events.push(Event::Dispatch(index));
            (exchange, delay)
        };
        if delay >= timeout {
            tokio::time::sleep(timeout).await;
            return Exchange::SentNoAnswer("answered after the host's timeout".into());
        }
        tokio::time::sleep(delay).await;
        exchange
    }

    /// The rule for this dispatch: (exchange, landed, in doubt, answer in words, delay).
    fn answer(
        &self,
        label: &str,
        occurrence: u32,
        (ordinal, nth): (usize, u32),
        request: &Outgoing,
    ) -> (Exchange, bool, bool, String, Duration) {
        let rule = self.rule(label, occurrence, nth);
        let fault = match &self.injected {
            Some((aimed, fault)) if *aimed == ordinal && nth == 1 => Some(*fault),
            _ => rule.and_then(|r| r.fault),
        };
        let delay = rule.and_then(|r| r.delay().ok()).unwrap_or_default();
        let body = self.body_for(label, occurrence, nth, request);
        let status = rule.and_then(|r| r.status).unwrap_or(200);
        let Some(fault) = fault else {
            let answered = Exchange::Answered { status, headers: Vec::new(), body };
            let landed = (200..400).contains(&status);
            let in_doubt = matches!(status, 408 | 409 | 499 | 500..=599);
            // A scripted 5xx did no work (`commit-then-5xx` is the one that did); the host cannot tell.
            return (answered, landed, in_doubt, status.to_string(), delay);
        };
        let exchange = match fault {
            Fault::LostResponse => Exchange::SentNoAnswer("the response was lost".into()),
            Fault::CommitThen5xx => {
                Exchange::Answered { status: 502, headers: Vec::new(), body: b"bad gateway".to_vec() }
            }
            Fault::LateAnswer => Exchange::SentNoAnswer("answered after the host's timeout".into()),
            Fault::Transient => Exchange::NotConnected,
            Fault::RateLimited => Exchange::Answered {
                status: 429,
                headers: vec![("retry-after-ms".into(), "10".into())],
                body: b"slow down".to_vec(),
            },
            Fault::Permanent => Exchange::Answered {
                status: 400,
                headers: Vec::new(),
                body: br#"{"error":"refused by the script"}"#.to_vec(),
            },
        };
        let delay = if fault == Fault::LateAnswer { Duration::MAX } else { delay };
        (exchange, fault.commits(), fault.commits(), fault.name().to_string(), delay)
    }

    fn rule(&self, label: &str, occurrence: u32, nth: u32) -> Option<&Rule> {
        self.script.effects.iter().find(|r| {
            r.label == label && r.occurrence.is_none_or(|o| o == occurrence) && r.dispatch.is_none_or(|d| d == nth)
        })
    }

    /// The body a commit answers with: the rule's for any dispatch of the effect, else the echo.
    fn body_for(&self, label: &str, occurrence: u32, nth: u32, request: &Outgoing) -> Vec<u8> {
        let with_body =
            |r: &&Rule| r.label == label && r.occurrence.is_none_or(|o| o == occurrence) && r.body.is_some();
        let rule = self
            .rule(label, occurrence, nth)
            .filter(|r| r.body.is_some())
            .or_else(|| self.script.effects.iter().find(with_body));
        rule.and_then(|r| r.body.clone()).map_or_else(|| request.body.clone(), String::into_bytes)
    }

    /// Answers a read: a rule, else a lookup by key.
    pub fn read(&self, request: &Outgoing) -> Exchange {
        if let Some(rule) = self.script.reads.iter().find(|r| request.url.contains(&r.url_contains)) {
            return Exchange::Answered {
                status: rule.status,
                headers: Vec::new(),
                body: rule.body.clone().into_bytes(),
            };
        }
        let state = self.state();
        match state.commits.iter().find(|(key, _)| request.url.contains(key.as_str())) {
            Some((_, (_, body))) => Exchange::Answered { status: 200, headers: Vec::new(), body: body.clone() },
            None => Exchange::Answered { status: 404, headers: Vec::new(), body: b"{}".to_vec() },
        }
    }
}
