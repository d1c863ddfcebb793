//! Where the test harness (`oncebox-testing`) reaches into the real pipeline: the points of an
//! effect's life at which it can crash the host, and the downstream it answers instead of the
//! network. A production host has no hooks (`Shared::hooks` is `None`), and each point costs it
//! one branch; nothing else in the pipeline knows whether it runs under the harness.

use std::future::Future;
use std::pin::Pin;

use crate::effects::HttpTarget;

/// A future the hooks hand back.
pub type HookFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A point in the pipeline at which the harness may crash the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Point {
    /// A remote effect is about to be written ahead: nothing of it is on disk, nothing was sent.
    BeforeWriteAhead,
    /// The write-ahead is durable; the request has not left.
    AfterWriteAhead,
    /// The downstream answered (or the exchange ended); the answer is not on disk.
    AfterDispatch,
    /// The answer is recorded (durable on a shared backend; on redb committed in this process and
    /// durable with the next durable write); the tool has not seen it yet.
    AfterAnswer,
    /// An attempt's record (and the operation's end, if it was the last) is durable.
    AfterAttemptRecord,
}

impl Point {
    /// The crash points, in the order an effect meets them.
    pub const ALL: [Point; 5] = [
        Point::BeforeWriteAhead,
        Point::AfterWriteAhead,
        Point::AfterDispatch,
        Point::AfterAnswer,
        Point::AfterAttemptRecord,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Point::BeforeWriteAhead => "before-write-ahead",
            Point::AfterWriteAhead => "after-write-ahead",
            Point::AfterDispatch => "after-dispatch",
            Point::AfterAnswer => "after-answer",
            Point::AfterAttemptRecord => "after-attempt-record",
        }
    }
}

/// Where the pipeline is: the point, and the effect (or attempt) it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub point: Point,
    pub operation_key: String,
    /// The effect's label and occurrence; empty and the attempt's number at `AfterAttemptRecord`.
    pub label: String,
    pub occurrence: u32,
    /// The effect's key (its `Idempotency-Key`); empty at `AfterAttemptRecord`.
    pub key: String,
}

impl Site {
    /// The end of attempt `attempt` of an operation.
    pub fn attempt(operation_key: &str, attempt: u32) -> Site {
        Site {
            point: Point::AfterAttemptRecord,
            operation_key: operation_key.to_string(),
            label: String::new(),
            occurrence: attempt,
            key: String::new(),
        }
    }
}

/// What the scripted downstream did with an HTTP request, in the terms the rule of evidence
/// (`failure::http`) judges: the harness never decides what an answer proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exchange {
    /// The connection was refused: no byte of the request was written.
    NotConnected,
    /// The request went out and no answer came back (lost, or later than the host's timeout).
    SentNoAnswer(String),
    /// An answer.
    Answered { status: u16, headers: Vec<(String, String)>, body: Vec<u8> },
}

impl Exchange {
    /// What the rule of evidence is given to judge of this exchange (`failure::HttpObservation`).
    pub(crate) fn observation(&self) -> crate::failure::HttpObservation {
        use crate::failure::HttpObservation;
        match self {
            Exchange::NotConnected => HttpObservation::NotConnected,
            Exchange::SentNoAnswer(_) => HttpObservation::SentNoAnswer,
            Exchange::Answered { status, headers, .. } => {
                let retry_after = crate::effects::retry_after_in(|name| {
                    headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
                });
                HttpObservation::Answered { status: *status, retry_after }
            }
        }
    }
}

/// An HTTP request as it would leave the host (with its `Idempotency-Key` when it is an effect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub method: String,
    pub url: String,
    pub body: Vec<u8>,
}

/// The harness's side of the hooks.
pub trait Hooks: Send + Sync + 'static {
    /// Called when the pipeline reaches `site`; a crash is a future that never ends (the harness
    /// then drops the call and the host, as a killed process would be).
    fn at(&self, site: Site) -> HookFuture<'_, ()>;

    /// Answers an HTTP effect instead of the network. `site` is at `AfterWriteAhead`.
    fn http(&self, site: Site, request: Outgoing) -> HookFuture<'_, Exchange>;

    /// Answers an HTTP read (a GET, a reconcile's lookup) instead of the network.
    fn read(&self, request: Outgoing) -> HookFuture<'_, Exchange>;

    /// The settings of every downstream (the script stands for all of them).
    fn target(&self) -> HttpTarget;

    /// Answers the outbox relay's delivery of a message (a POST to its topic's endpoint, carrying
    /// `key`, its effect key, as `Idempotency-Key`) instead of the network. Unless a harness says
    /// otherwise, no endpoint can be reached.
    fn deliver(&self, key: String, request: Outgoing) -> HookFuture<'_, Exchange> {
        let _ = (key, request);
        Box::pin(async { Exchange::NotConnected })
    }
}
