//! The guarded path every effect takes (DESIGN section 4):
//!
//! ```text
//! effect key = H(op key, label, occurrence)
//! recorded with another fingerprint -> divergence error, dispatch nothing
//! recorded completed               -> the recorded answer, dispatch nothing
//! recorded in doubt                -> same-key resend only where allowed, else unknown-outcome
//! recorded retryable, or none      -> write-ahead `dispatched` (durable) -> perform -> record
//! ```
//!
//! Remote effects call [`EffectCtx::begin`], perform, then [`EffectCtx::finish`]. Local effects
//! (`local.rs`) need no write-ahead: their write and their record share one transaction.

use crate::keys;
use crate::ledger::{AttemptEffect, EffectRecord, EffectSource, EffectStatus};
use crate::runtime::bindings::ToolError;
use crate::telemetry::Span;

use super::hooks::{Point, Site};
use super::{EffectCtx, InDoubt, Scope};

/// What to do with an effect.
pub enum Begin {
    /// Answered from the ledger: here is the recorded response.
    Replay(String),
    /// Written ahead; perform it now with `record.key` as the idempotency key. `was_in_doubt`:
    /// this is a resend of an effect an earlier send may have committed. `span`: the effect's,
    /// whose context goes downstream with it.
    Dispatch { record: Box<EffectRecord>, source: EffectSource, was_in_doubt: bool, span: Span },
}

/// How a dispatched effect ended.
pub enum Dispatched {
    /// It took effect: the answer, to record and return.
    Committed(String),
    /// A definitive refusal (nothing was done): the answer, to record and return.
    Refused(String),
    /// Nothing took effect; the guest gets this error and a later attempt may resend.
    Retryable(ToolError),
    /// Sent, answer lost.
    Unknown(String),
}

/// A written-ahead effect leaves within this time of its write-ahead's stamp, or not at all
/// (`late`; `HostBuilder::send_deadline`): so every send of it started by then, and a lookup's
/// settle window counts from there (`Shared::lookup`). Without it, a host paused between its
/// write-ahead and its send (SIGSTOP, a frozen VM, a starved process) could send long after
/// another host, on a shared ledger, took the step over, reconciled it `not-committed` and sent
/// it again. Long enough that a write-ahead committed on a loaded machine is still sent.
pub const DEFAULT_SEND_BY: std::time::Duration = std::time::Duration::from_secs(10);

/// An effect written ahead longer than `send_by` ago, too late to be sent now: not sent, and in
/// doubt (its record says dispatched; the next owner reconciles it as any effect in doubt).
pub fn late(record: &EffectRecord, now_ms: u64, send_by: std::time::Duration) -> Option<Dispatched> {
    let by = record.last_dispatch_ms().saturating_add(u64::try_from(send_by.as_millis()).unwrap_or(u64::MAX));
    (now_ms > by).then(|| {
        Dispatched::Unknown(format!(
            "written ahead {} ms before it could be sent (this host was paused or starved): not sent, so as \
             not to send it after another host may have taken the step over",
            now_ms.saturating_sub(record.last_dispatch_ms())
        ))
    })
}

/// Says loudly when an effect's send ended after the moment from which every send of it counts as
/// ended (`Shared::lookup`'s `sent_until_ms`, where another host starts counting a lookup's settle
/// window). The client's timeout ends a send before that moment, so only a host paused or starved
/// while sending gets there: a frozen VM, or SIGSTOP in the instant after `late` was checked and
/// before the kernel wrote the request. No check in the process can stop a request the kernel
/// writes on resuming; by then another host may have taken the step over and judged the effect,
/// and at a downstream that does not honour keys the request may commit a second time. The
/// operator gets the key to look for.
pub fn overran(lookup: &crate::failure::Lookup, effect_key: &str, target: &str, now_ms: u64) {
    if let Some(over_ms) = lookup.overrun_ms(now_ms) {
        tracing::error!(
            %effect_key,
            %target,
            over_ms,
            "this host was paused or starved while it sent an effect: the send ended {over_ms} ms after every send \
             of it counts as ended, so its request may have reached the downstream after another host could judge \
             it. If the step was taken over meanwhile, look for a second commit of this key at the downstream"
        );
    }
}

/// How the refusal of a diverged attempt begins (the harness reports it as a violation).
pub const DIVERGED: &str = "the tool diverged";

/// Describes a request before it is guarded.
pub struct Request<'a> {
    pub kind: &'a str,
    pub label: &'a str,
    pub target: &'a str,
    pub fingerprint: String,
}

impl EffectCtx {
    /// Derives the next key for `label` in this invocation.
    pub(super) fn next_key(&mut self, label: &str) -> Result<(String, u32), ToolError> {
        let next = self.peek_key(label)?;
        self.advance(label);
        Ok(next)
    }

    /// The key the next effect with `label` gets, without using it up.
    pub(super) fn peek_key(&self, label: &str) -> Result<(String, u32), ToolError> {
        let operation_key = self.scope()?.journal.operation_key();
        let occurrence = self.occurrences.get(label).copied().unwrap_or(0);
        Ok((keys::effect_key(operation_key, label, occurrence), occurrence))
    }

    /// Uses up the key `peek_key` gave for `label`.
    pub(super) fn advance(&mut self, label: &str) {
        *self.occurrences.entry(label.to_string()).or_insert(0) += 1;
    }

    pub(super) async fn begin(&mut self, request: Request<'_>) -> Result<Begin, ToolError> {
        let (key, occurrence) = self.next_key(request.label)?;
        let scope = self.scope()?.clone();

        let lookup_key = key.clone();
        let existing = if scope.first { None } else { scope.journal.effect(&lookup_key).await.map_err(host_error)? };
        let now = self.shared.ledger.now_ms();
        let existing_state = existing.as_ref().map(|e| (e.status, e.dispatches));
        let was_in_doubt = existing_state.is_some_and(|(status, _)| status.in_doubt());

        if existing.is_none() && (!scope.first || !self.in_doubt.is_empty() || (scope.once && !self.effects.is_empty()))
        {
            self.diverged(&scope, request.label, &key, request.kind, &request.fingerprint, true).await?;
        }
        let (record, source) = match existing {
            Some(recorded) if recorded.fingerprint != request.fingerprint => {
                return Err(ToolError::Permanent(format!(
                    "effect `{}` #{occurrence} asks for something other than what was recorded for its key {key}; \
                     the tool diverged from its first run, nothing was sent",
                    request.label
                )));
            }
            Some(recorded) if recorded.status.answered() => {
                self.note(&recorded, EffectSource::Deduplicated, None);
                // The guest gets the answer exactly as it came, a sensitive value it echoed included.
                let response = recorded.response.as_deref().unwrap_or_default();
                let exact = crate::seal::exact(
                    &self.shared.keying,
                    &recorded.operation_key,
                    response,
                    recorded.sealed.as_deref(),
                )
                .map_err(|e| {
                    ToolError::Permanent(format!(
                        "host: the recorded answer of effect `{}` ({key}) could not be unsealed: {e}",
                        request.label
                    ))
                })?;
                return Ok(Begin::Replay(exact));
            }
            Some(recorded)
                if recorded.status.in_doubt() && !self.shared.resendable(&recorded, scope.redispatch_in_doubt, now) =>
            {
                self.in_doubt.push(InDoubt { key: recorded.key.clone(), resendable: false });
                self.note(&recorded, EffectSource::Deduplicated, None);
                return Err(ToolError::UnknownOutcome(format!(
                    "effect `{}` ({key}) may have taken place and cannot safely be sent again; reconcile it",
                    request.label
                )));
            }
            // An irreversible effect leaves once, whatever its first send met (DESIGN section 7):
            // sending it again takes a new step and a new approval. (A rerun of this attempt after a
            // KV conflict meets its own send here.)
            Some(recorded) if scope.once => {
                self.note(&recorded, EffectSource::Deduplicated, None);
                return Err(ToolError::Transient(format!(
                    "effect `{}` ({key}) was sent once and not taken; an irreversible effect is never sent twice: \
                     a new step, with its own approval, sends it again",
                    request.label
                )));
            }
            Some(mut recorded) => {
                recorded.status = EffectStatus::Dispatched;
                recorded.dispatches += 1;
                recorded.updated_ms = now;
                recorded.last_dispatched_ms = now;
                recorded.attempt = scope.attempt;
                (recorded, EffectSource::Redispatched)
            }
            None => (
                EffectRecord {
                    key,
                    operation_key: scope.journal.operation_key().to_string(),
                    label: request.label.to_string(),
                    occurrence,
                    kind: request.kind.to_string(),
                    target: request.target.to_string(),
                    fingerprint: request.fingerprint,
                    status: EffectStatus::Dispatched,
                    response: None,
                    sealed: None,
                    error: None,
                    dispatches: 1,
                    first_dispatched_ms: now,
                    last_dispatched_ms: now,
                    updated_ms: now,
                    resolution: None,
                    attempt: scope.attempt,
                },
                EffectSource::Fresh,
            ),
        };
        self.shared.reached(|| site(&record, Point::BeforeWriteAhead)).await;
        let span = scope.trace.sent(&record, source);
        let resendable = self.shared.resendable(&record, scope.redispatch_in_doubt, now);
        // In doubt from before the write-ahead is submitted until its answer is recorded: if this
        // future is dropped (the attempt deadline, a cancelled call) at any await from here on, the
        // write-ahead may be durable and the request may have left, and the attempt must say so.
        self.in_doubt.push(InDoubt { key: record.key.clone(), resendable });
        // Write-ahead: durable before anything leaves the host, with the local effects staged so
        // far. The job compares the effect's recorded state with what this attempt read (`existing`).
        let (ahead, staged) = (record.clone(), std::mem::take(&mut self.staged));
        let carried: Vec<String> = staged.iter().map(|(effect, _)| effect.key.clone()).collect();
        let expected = existing_state.as_ref().map(|(status, dispatches)| (*status, *dispatches));
        if let Err(e) = scope.journal.write(&ahead, expected, staged).await {
            // Refused or not committed: nothing left. But the local writes staged before it went
            // down with the job (they are no effects of this attempt any more), so this attempt can
            // no longer complete; a KV conflict among them runs it again, uncounted.
            self.in_doubt.retain(|d| d.key != record.key);
            self.effects.retain(|noted| !carried.contains(&noted.key));
            if matches!(e, crate::ledger::LedgerError::KvConflict { .. }) {
                self.rerun = true;
            }
            // An answer this attempt recorded (one that rode: a shared ledger's server lost it in a
            // crash) is gone: that effect is in doubt again, and the attempt's outcome with it.
            if let crate::ledger::LedgerError::AnswerLost { effect_key, .. } = &e {
                // Said before the read below, which the attempt may not outlive (its deadline).
                if !self.in_doubt.iter().any(|d| &d.key == effect_key) {
                    self.in_doubt.push(InDoubt { key: effect_key.clone(), resendable: false });
                }
                for noted in self.effects.iter_mut().filter(|noted| &noted.key == effect_key) {
                    noted.status = EffectStatus::Dispatched;
                }
                let error = ToolError::UnknownOutcome(format!("host: {e}"));
                self.broken.get_or_insert_with(|| tool_error_text(&error));
                if let Ok(Some(lost)) = scope.journal.effect(effect_key).await {
                    let resendable = self.shared.resendable(&lost, scope.redispatch_in_doubt, now);
                    for doubt in self.in_doubt.iter_mut().filter(|d| &d.key == effect_key) {
                        doubt.resendable = resendable;
                    }
                }
                return Err(error);
            }
            let error = host_error(e);
            self.broken.get_or_insert_with(|| tool_error_text(&error));
            return Err(error);
        }
        self.shared.reached(|| site(&record, Point::AfterWriteAhead)).await;
        Ok(Begin::Dispatch { record: Box::new(record), source, was_in_doubt, span })
    }

    /// Refuses a new effect key for a request (the same kind and fingerprint) that took place or
    /// may have: one an earlier attempt made and this attempt has not met again (its label
    /// changed between attempts: the time in a label, another component now running the step),
    /// or, for a remote effect (`this_attempt`), one this attempt made itself whose outcome is in
    /// doubt (the tool caught the unknown outcome and asked again: the label's next occurrence is
    /// a new key). Sending it would do again what was done, under a key the downstream has never
    /// seen. An irreversible step's request is refused whatever its first send met, as
    /// [`crate::ledger::repeats`] says. A tool that asks for different effects (it read the world
    /// again, or looks up what the first did) is not refused. The attempt cannot complete (even if
    /// the guest swallows the error), and the step stays in doubt. Only later attempts, and an
    /// attempt with something in doubt (or an irreversible step's), pay the read.
    pub(super) async fn diverged(
        &mut self,
        scope: &Scope,
        label: &str,
        key: &str,
        kind: &str,
        fingerprint: &str,
        this_attempt: bool,
    ) -> Result<(), ToolError> {
        let recorded = scope.journal.effects().await.map_err(host_error)?;
        let met = |key: &str| self.effects.iter().any(|noted| noted.key == key);
        let doubted = |key: &str| self.in_doubt.iter().any(|d| d.key == key);
        let repeated = |e: &EffectRecord| {
            crate::ledger::repeats(e, kind, fingerprint, scope.once)
                && (!met(&e.key) || (this_attempt && (doubted(&e.key) || scope.once)))
        };
        let Some(open) = recorded.into_iter().find(repeated) else {
            return Ok(());
        };
        if !open.status.in_doubt() && !open.status.taken() {
            // Irreversible, its first send proven not taken or refused: never sent twice, under
            // any label. Not noted as met: a later ask in this attempt, under yet another label,
            // meets this record again and is refused again.
            let met = if open.status == EffectStatus::Refused { "refused" } else { "not taken" };
            return Err(ToolError::Transient(format!(
                "effect `{}` ({}) of this step was sent once and {met}; this attempt asks for it again as `{label}` \
                 ({key}); an irreversible effect is never sent twice: a new step, with its own approval, sends it again",
                open.label, open.key
            )));
        }
        if open.status.in_doubt() && !doubted(&open.key) {
            self.in_doubt.push(InDoubt { key: open.key.clone(), resendable: false });
        }
        let message = if met(&open.key) {
            format!(
                "{DIVERGED}: effect `{}` ({}) made this same request earlier in this attempt, and it took place or \
                 may have; this attempt asks for it again as `{label}` ({key}); nothing was sent. A tool never \
                 retries an unknown outcome itself: the step ends unknown, and reconcile settles it",
                open.label, open.key
            )
        } else {
            format!(
                "{DIVERGED}: effect `{}` ({}) of an earlier attempt made this same request, and it took place or may \
                 have; this attempt asks for it again as `{label}` ({key}); nothing was sent. A label must not change \
                 between attempts, nor the component while a step is in doubt; reconcile the one in doubt",
                open.label, open.key
            )
        };
        self.broken.get_or_insert_with(|| message.clone());
        Err(ToolError::UnknownOutcome(message))
    }

    pub(super) async fn finish(
        &mut self,
        mut record: Box<EffectRecord>,
        source: EffectSource,
        was_in_doubt: bool,
        span: Span,
        outcome: Dispatched,
    ) -> Result<String, ToolError> {
        let journal = self.scope()?.journal.clone();
        self.shared.reached(|| site(&record, Point::AfterDispatch)).await;
        record.updated_ms = self.shared.ledger.now_ms();
        // A resend of an effect an earlier send may have committed: only a taken answer settles it.
        // A refused connection, a rate limit, a refusal or a lost answer speak for this send alone
        // (a rate limiter or an expired credential in front of the idempotency layer answers without
        // looking at the key), so the effect stays in doubt.
        let outcome = match outcome {
            Dispatched::Retryable(error) if was_in_doubt => Dispatched::Unknown(format!(
                "the resend was not taken ({}); the first send may have been",
                tool_error_text(&error)
            )),
            Dispatched::Refused(_) if was_in_doubt => {
                Dispatched::Unknown("the resend was refused, which says nothing of the first send".into())
            }
            outcome => outcome,
        };
        let secrets = self.scope()?.secrets.clone();
        // What the ledger keeps of an answer: masked, and sealed whole when it echoes a secret.
        let kept = |record: &EffectRecord, response: &str| {
            crate::seal::keep(&self.shared.keying, &record.operation_key, response, &secrets, || {
                let mut nonce = [0u8; crate::seal::NONCE_BYTES];
                getrandom::fill(&mut nonce).map_err(|e| crate::seal::SealError::NoRandomness(e.to_string()))?;
                Ok(nonce)
            })
        };
        let masked = |text: String| crate::redact::mask_text(&text, &secrets).unwrap_or(text);
        let answered = match &outcome {
            Dispatched::Refused(_) => EffectStatus::Refused,
            _ => EffectStatus::Completed,
        };
        let result = match outcome {
            Dispatched::Committed(response) | Dispatched::Refused(response) => match kept(&record, &response) {
                Ok(kept) => {
                    record.status = answered;
                    record.response = Some(kept.masked);
                    record.sealed = kept.sealed;
                    record.error = None;
                    Ok(response)
                }
                // The answer came but cannot be kept without its secret in the clear: it is
                // recorded as lost (the effect stays in doubt), never in the clear.
                Err(e) => {
                    record.status = EffectStatus::Unknown;
                    record.error = Some(format!("the answer could not be sealed: {e}"));
                    Err(ToolError::UnknownOutcome(format!(
                        "effect `{}` ({}): its answer could not be sealed: {e}",
                        record.label, record.key
                    )))
                }
            },
            Dispatched::Retryable(error) => {
                record.status = EffectStatus::Retryable;
                record.error = Some(masked(format!("{error:?}")));
                Err(error)
            }
            Dispatched::Unknown(message) => {
                record.status = EffectStatus::Unknown;
                let message = masked(message);
                record.error = Some(message.clone());
                Err(ToolError::UnknownOutcome(format!("effect `{}` ({}): {message}", record.label, record.key)))
            }
        };
        let stored = record.clone();
        let expected = Some((EffectStatus::Dispatched, record.dispatches));
        if let Err(e) = journal.write(&stored, expected, Vec::new()).await {
            // The effect went out but its answer is not on disk: the ledger holds its write-ahead,
            // so it stays in doubt (the entry `begin` made), and no resend can be trusted.
            for doubt in self.in_doubt.iter_mut().filter(|d| d.key == record.key) {
                doubt.resendable = false;
            }
            self.note(&record, source, Some(span));
            return Err(ToolError::UnknownOutcome(format!(
                "effect {} was sent but its answer could not be recorded: {e}",
                record.key
            )));
        }
        // The answer is recorded (on redb it rides with the next durable write, and a crash before
        // that leaves the write-ahead, in doubt): the effect is in doubt now only if the answer
        // proves nothing.
        if !record.status.in_doubt() {
            self.in_doubt.retain(|d| d.key != record.key);
        }
        self.note(&record, source, Some(span));
        self.shared.reached(|| site(&record, Point::AfterAnswer)).await;
        result
    }

    /// Counts `record` among the attempt's effects, and ends its span: `span`, the one started
    /// when it was sent, or one made now for an effect not sent.
    pub(super) fn note(&mut self, record: &EffectRecord, source: EffectSource, span: Option<Span>) {
        let span = match (span, &self.scope) {
            (Some(span), _) => span,
            (None, Some(scope)) => scope.trace.effect(record, source),
            (None, None) => Span::default(),
        };
        span.effected(record);
        self.effects.push(AttemptEffect {
            key: record.key.clone(),
            label: record.label.clone(),
            source,
            status: record.status,
        });
    }
}

/// Where an effect is, for the harness's hooks.
pub(super) fn site(record: &EffectRecord, point: Point) -> Site {
    Site {
        point,
        operation_key: record.operation_key.clone(),
        label: record.label.clone(),
        occurrence: record.occurrence,
        key: record.key.clone(),
    }
}

fn tool_error_text(error: &ToolError) -> String {
    match error {
        ToolError::Transient(m) | ToolError::Permanent(m) | ToolError::UnknownOutcome(m) => m.clone(),
        ToolError::RateLimited(r) => r.message.clone(),
    }
}

/// A ledger failure inside an effect: nothing was sent (write-ahead failed) or the answer is lost.
pub(super) fn host_error(e: crate::ledger::LedgerError) -> ToolError {
    match e {
        e if e.is_no_longer_owned() => ToolError::Permanent(format!("host: {e}")),
        e => ToolError::Transient(format!("host: the ledger refused the write-ahead record, nothing was sent: {e}")),
    }
}
