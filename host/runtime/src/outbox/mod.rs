//! The outbox relay: delivers the messages tools enqueued (exactly once, with their effect
//! records) to each topic's endpoint.
//!
//! Per topic, strictly in the order the messages were enqueued: a message is sent, with its effect
//! key as `Idempotency-Key`, until its endpoint acknowledges it (a 2xx), and only then is the next
//! one sent. The acknowledgement is recorded after it arrives; a relay killed before that sends
//! the message again when it restarts, with the same key, so nothing is lost and a topic is never
//! reordered: an endpoint may see its latest message twice, never a later one before an earlier
//! one. An endpoint that honours the key sees each message once; one that does not may see a
//! message twice after a crash or a lost answer (the policy file says so where it is configured).
//!
//! What an answer means is `rules.rs`'s (pure, from the rule of evidence): a 2xx delivers; a
//! refused connection, a 429, a 5xx, 408, 409 or a timeout is sent again after a capped, jittered
//! backoff; any other 4xx (or a 3xx: redirects are not followed) stops the topic at that message,
//! reported, until the relay is started again.
//!
//! One relay per topic: two would each send the topic's head. On a ledger that hosts share, a
//! relay holds a lease on each topic it delivers (`Ledger::lease`, judged by the database's
//! clock, renewed before every send and longer than a send can take); the others wait and take
//! the topic over when its lease lapses (its relay died) or is given up (it stopped).

mod send;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::watch;

use crate::effects::hooks::Hooks;
use crate::ledger::{Ledger, LedgerError, OutboxMessage};

pub use oncebox_core::delivery::{Endpoint, MAX_ATTEMPTS_PER_PASS, Verdict, jitter, judge, wait};

/// Messages read from a topic's head at a time.
const BATCH: usize = 64;

/// How often a relay on a ledger that other hosts share looks for what they enqueued.
const LOOK_AGAIN: std::time::Duration = std::time::Duration::from_secs(1);

/// Why the relay stopped before it was asked to.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The ledger could not be read or written: nothing more is sent, since a send whose answer
    /// cannot be recorded would only be sent again.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("the relay's HTTP client: {0}")]
    Client(String),
    #[error("a topic's relay task ended abnormally: {0}")]
    Task(String),
}

/// Delivers outbox messages to their topics' endpoints. Cheap to clone.
#[derive(Clone)]
pub struct Relay {
    inner: Arc<Inner>,
}

struct Inner {
    ledger: Ledger,
    client: reqwest::Client,
    topics: BTreeMap<String, Endpoint>,
    /// This relay's name in the topics' leases: random, so no two relays share one.
    owner: String,
    /// The harness's hooks (`oncebox-testing`, the simulator), which answer in the endpoints'
    /// place; `None` for every other relay.
    hooks: Option<Arc<dyn Hooks>>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay").field("ledger", &self.inner.ledger).field("topics", &self.inner.topics).finish()
    }
}

/// What the relay did for one topic, and where the topic stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TopicReport {
    pub topic: String,
    pub endpoint: String,
    pub honours_keys: bool,
    /// Messages acknowledged by the endpoint and recorded delivered.
    pub delivered: u64,
    /// Sends, whatever their answer.
    pub sends: u64,
    /// Sends of a message whose previous send may have reached the endpoint's consumer (a 5xx,
    /// a timeout): duplicates, for an endpoint that does not honour keys.
    pub resent_in_doubt: u64,
    /// `idle` (nothing pending), `retrying` (the pass's sends ran out, or the relay was stopped,
    /// with messages pending) or `stopped` (the endpoint refused the head message).
    pub state: TopicState,
    /// The head message when the topic is not idle: its sequence number, key and last error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<Head>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopicState {
    #[default]
    Idle,
    Retrying,
    Stopped,
    /// Another relay on the shared ledger holds the topic's lease and delivers it.
    HeldElsewhere,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Head {
    pub seq: u64,
    pub effect_key: String,
    pub attempts: u32,
    pub last_error: Option<String>,
}

/// What a pass or a run did, topic by topic (in topic order).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub topics: Vec<TopicReport>,
}

impl Summary {
    /// Whether every topic's messages are all delivered.
    pub fn all_delivered(&self) -> bool {
        self.topics.iter().all(|t| t.state == TopicState::Idle)
    }

    pub fn delivered(&self) -> u64 {
        self.topics.iter().map(|t| t.delivered).sum()
    }
}

/// How a pass over one message (or a topic) ended.
enum Ended {
    /// The message was delivered (or, for a topic, nothing is pending).
    Done,
    /// The endpoint refused it: the topic stops here.
    Refused,
    /// The pass's sends for it ran out.
    OutOfSends,
    /// The relay was asked to stop.
    Stopping,
    /// Another relay holds the topic's lease.
    Elsewhere,
    /// The topic's head is not the message in hand any more (another relay delivered it while
    /// this one's lease had lapsed): the topic is read again.
    Moved,
}

/// Whether a topic gives up on a message after its pass's sends, or keeps sending.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Pass,
    Forever,
}

impl Relay {
    /// A relay for `topics` over `ledger`, with its own HTTP client (redirects never followed,
    /// the system's TLS roots plus `tls_roots`, PEM). Refuses a credential that is not a valid
    /// header value, before anything is sent.
    pub fn new(
        ledger: Ledger,
        topics: impl IntoIterator<Item = (String, Endpoint)>,
        tls_roots: &[Vec<u8>],
    ) -> Result<Relay, RelayError> {
        let client = crate::http_client::build(tls_roots).map_err(|e| RelayError::Client(e.to_string()))?;
        Relay::with_client(ledger, client, topics)
    }

    /// A relay that sends through `client` (a host's own, say).
    pub fn with_client(
        ledger: Ledger,
        client: reqwest::Client,
        topics: impl IntoIterator<Item = (String, Endpoint)>,
    ) -> Result<Relay, RelayError> {
        Relay::hooked(ledger, client, topics, None)
    }

    /// Like [`Relay::with_client`], its sends answered by `hooks` (a host's, under the harness)
    /// when there are some.
    pub(crate) fn hooked(
        ledger: Ledger,
        client: reqwest::Client,
        topics: impl IntoIterator<Item = (String, Endpoint)>,
        hooks: Option<Arc<dyn Hooks>>,
    ) -> Result<Relay, RelayError> {
        let topics: BTreeMap<String, Endpoint> = topics.into_iter().collect();
        for (topic, endpoint) in &topics {
            for (name, value) in &endpoint.headers {
                if reqwest::header::HeaderValue::from_str(value).is_err() {
                    return Err(RelayError::Client(format!(
                        "topic {topic}: the configured `{name}` header for {} is not a valid value",
                        endpoint.host_port()
                    )));
                }
            }
        }
        let mut name = [0u8; 12];
        getrandom::fill(&mut name)
            .map_err(|e| RelayError::Client(format!("no randomness for the relay's name: {e}")))?;
        Ok(Relay { inner: Arc::new(Inner { ledger, client, topics, owner: hex::encode(name), hooks }) })
    }

    /// The topics this relay delivers, with their endpoints.
    pub fn topics(&self) -> impl Iterator<Item = (&str, &Endpoint)> {
        self.inner.topics.iter().map(|(topic, endpoint)| (topic.as_str(), endpoint))
    }

    /// One pass: delivers what is pending, every topic at once, each in order, giving each message
    /// its endpoint's `attempts_per_pass` sends; returns when every topic is delivered, stopped
    /// at a refused message, or out of sends for its head (`oncebox outbox deliver --once`).
    pub async fn deliver_pending(&self) -> Result<Summary, RelayError> {
        self.run_topics(Mode::Pass, std::future::pending::<()>()).await
    }

    /// Keeps delivering, every topic at once, each in order, never giving up on a message, and
    /// waking when a commit through this ledger enqueues a message, until `shutdown` resolves. A
    /// send under way when it does is completed and its answer recorded (within the endpoint's
    /// timeout), so a clean stop sends nothing twice. A topic whose endpoint refused its head
    /// stays stopped until the relay is started again.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> Result<Summary, RelayError> {
        self.run_topics(Mode::Forever, shutdown).await
    }

    async fn run_topics(&self, mode: Mode, shutdown: impl Future<Output = ()>) -> Result<Summary, RelayError> {
        let (stop, stopping) = watch::channel(false);
        let mut tasks = tokio::task::JoinSet::new();
        for (topic, endpoint) in &self.inner.topics {
            let (relay, topic, endpoint, stopping) = (self.clone(), topic.clone(), endpoint.clone(), stopping.clone());
            tasks.spawn(async move { relay.topic(topic, endpoint, mode, stopping).await });
        }
        let mut shutdown = std::pin::pin!(shutdown);
        let (mut topics, mut failure) = (Vec::new(), None);
        loop {
            tokio::select! {
                () = &mut shutdown, if !*stop.borrow() => {
                    let _ = stop.send(true);
                }
                joined = tasks.join_next() => match joined {
                    None => break,
                    Some(Ok(Ok(report))) => topics.push(report),
                    Some(Ok(Err(e))) => {
                        // One topic's ledger failed: stop the others too, and report the first error.
                        let _ = stop.send(true);
                        failure.get_or_insert(e);
                    }
                    Some(Err(e)) => {
                        let _ = stop.send(true);
                        failure.get_or_insert(RelayError::Task(e.to_string()));
                    }
                },
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        topics.sort_by(|a, b| a.topic.cmp(&b.topic));
        Ok(Summary { topics })
    }

    /// One topic, until it is idle (a pass) or until the relay stops (forever).
    async fn topic(
        &self,
        topic: String,
        endpoint: Endpoint,
        mode: Mode,
        mut stopping: watch::Receiver<bool>,
    ) -> Result<TopicReport, RelayError> {
        let mut report = TopicReport {
            topic: topic.clone(),
            endpoint: endpoint.url.to_string(),
            honours_keys: endpoint.honours_keys,
            ..TopicReport::default()
        };
        let mut enqueued = self.inner.ledger.outbox_enqueued();
        let mut last;
        loop {
            // Marked before the read: a message enqueued after it wakes the wait below.
            enqueued.borrow_and_update();
            last = self.drain(&topic, &endpoint, mode, &mut stopping, &mut report).await?;
            match (&last, mode) {
                (Ended::Done, Mode::Pass) => break,
                (Ended::Done, Mode::Forever) if self.inner.ledger.is_shared() => {
                    // Other hosts enqueue into a shared ledger without this process hearing of
                    // it: look again every LOOK_AGAIN, and at once for this process's own.
                    tokio::select! {
                        _ = enqueued.changed() => {}
                        _ = tokio::time::sleep(LOOK_AGAIN) => {}
                        _ = stopping.wait_for(|stop| *stop) => break,
                    }
                }
                (Ended::Done, Mode::Forever) => {
                    let woken = tokio::select! {
                        changed = enqueued.changed() => changed.is_ok(),
                        _ = stopping.wait_for(|stop| *stop) => break,
                    };
                    if !woken {
                        // No sender left: nothing can enqueue any more.
                        let _ = stopping.wait_for(|stop| *stop).await;
                        break;
                    }
                }
                (Ended::Refused, Mode::Forever) => {
                    let _ = stopping.wait_for(|stop| *stop).await;
                    break;
                }
                // Read the head again, under the lease now held.
                (Ended::Moved, _) => {}
                (Ended::Elsewhere, Mode::Forever) => {
                    // Looked at again: the other relay may die or stop.
                    tokio::select! {
                        _ = tokio::time::sleep(LOOK_AGAIN) => {}
                        _ = stopping.wait_for(|stop| *stop) => break,
                    }
                }
                (Ended::Refused | Ended::OutOfSends | Ended::Stopping | Ended::Elsewhere, _) => break,
            }
        }
        if let Err(e) = self.inner.ledger.release(&lease_name(&topic), &self.inner.owner).await {
            // The lease then runs out by itself; another relay waits that long.
            tracing::warn!(%topic, error = %e, "could not give up the topic's relay lease");
        }
        let head = self.inner.ledger.outbox_pending(&topic, 1).await?.into_iter().next();
        report.state = match &head {
            None => TopicState::Idle,
            Some(_) if matches!(last, Ended::Elsewhere) => TopicState::HeldElsewhere,
            Some(message) if message.delivery.refused => TopicState::Stopped,
            Some(_) => TopicState::Retrying,
        };
        report.head = head.map(|message| Head {
            seq: message.seq,
            effect_key: message.effect_key,
            attempts: message.delivery.attempts,
            last_error: message.delivery.last_error,
        });
        Ok(report)
    }

    /// Delivers the topic's pending messages in order until none is left (`Done`) or one is not
    /// delivered.
    async fn drain(
        &self,
        topic: &str,
        endpoint: &Endpoint,
        mode: Mode,
        stopping: &mut watch::Receiver<bool>,
        report: &mut TopicReport,
    ) -> Result<Ended, RelayError> {
        loop {
            let batch = self.inner.ledger.outbox_pending(topic, BATCH).await?;
            if batch.is_empty() {
                return Ok(Ended::Done);
            }
            for message in batch {
                if *stopping.borrow() {
                    return Ok(Ended::Stopping);
                }
                match self.deliver(&message, endpoint, mode, stopping, report).await? {
                    Ended::Done => {}
                    other => return Ok(other),
                }
            }
        }
    }

    /// Sends one message until it is delivered, refused, out of the pass's sends, or the relay
    /// stops. Every answer is recorded before anything else happens.
    async fn deliver(
        &self,
        message: &OutboxMessage,
        endpoint: &Endpoint,
        mode: Mode,
        stopping: &mut watch::Receiver<bool>,
        report: &mut TopicReport,
    ) -> Result<Ended, RelayError> {
        let ledger = &self.inner.ledger;
        let (seq, key) = (message.seq, message.effect_key.as_str());
        // Whether this message's last send in this run may have reached the endpoint's consumer.
        let (mut in_doubt, mut failures) = (false, 0u32);
        loop {
            if in_doubt {
                report.resent_in_doubt += 1;
                if !endpoint.honours_keys {
                    tracing::warn!(
                        topic = %message.topic, seq, effect_key = key,
                        "resending an outbox message whose last send may have arrived, to an endpoint not declared \
                         honours_keys: it may see the message twice"
                    );
                }
            }
            // Held before every send: the lease outlasts the send (`lease_for`), so no other relay
            // sends this topic while this one may be sending.
            if !ledger.lease(&lease_name(&message.topic), &self.inner.owner, lease_for(endpoint)).await? {
                return Ok(Ended::Elsewhere);
            }
            // On a shared ledger the lease may have lapsed since this message was read (a long
            // backoff, a stalled process) and another relay may have delivered it and those after
            // it: under the lease just taken, the message is sent only if it is still the head.
            if ledger.is_shared() && !still_head(ledger, message).await? {
                return Ok(Ended::Moved);
            }
            let sent = match &self.inner.hooks {
                Some(hooks) => send::through(hooks.as_ref(), endpoint, message).await,
                None => send::post(&self.inner.client, endpoint, message).await,
            };
            report.sends += 1;
            let now = ledger.now_ms();
            match judge(&sent.observation) {
                Verdict::Delivered => {
                    ledger.mark_delivered(seq, now).await?;
                    report.delivered += 1;
                    tracing::info!(topic = %message.topic, seq, effect_key = key, "outbox message delivered");
                    return Ok(Ended::Done);
                }
                Verdict::Refused => {
                    ledger.record_delivery_failure(seq, now, &sent.description, true).await?;
                    tracing::error!(
                        topic = %message.topic, seq, effect_key = key, error = %sent.description,
                        "the endpoint refused an outbox message; its topic stops there until the relay is started again"
                    );
                    return Ok(Ended::Refused);
                }
                Verdict::Again { in_doubt: doubt, retry_after } => {
                    ledger.record_delivery_failure(seq, now, &sent.description, false).await?;
                    failures += 1;
                    in_doubt = doubt;
                    tracing::warn!(
                        topic = %message.topic, seq, effect_key = key, error = %sent.description, failures,
                        "outbox message not delivered; it will be sent again with the same key"
                    );
                    if mode == Mode::Pass && failures >= endpoint.attempts_per_pass {
                        return Ok(Ended::OutOfSends);
                    }
                    let after = wait(endpoint, failures, retry_after, jitter(key, failures));
                    tokio::select! {
                        () = tokio::time::sleep(after) => {}
                        _ = stopping.wait_for(|stop| *stop) => return Ok(Ended::Stopping),
                    }
                }
            }
        }
    }
}

/// The name of `topic`'s lease on a shared ledger.
fn lease_name(topic: &str) -> String {
    format!("outbox/{topic}")
}

/// How long a topic's lease holds without renewal: longer than a send can take (its timeout),
/// with room for the answer to be recorded before the next renewal.
fn lease_for(endpoint: &Endpoint) -> std::time::Duration {
    endpoint.timeout.saturating_mul(2).saturating_add(std::time::Duration::from_secs(10))
}

/// Whether `message` is still its topic's first undelivered message.
async fn still_head(ledger: &Ledger, message: &OutboxMessage) -> Result<bool, RelayError> {
    let head = ledger.outbox_pending(&message.topic, 1).await?;
    Ok(head.first().is_some_and(|head| head.seq == message.seq))
}
