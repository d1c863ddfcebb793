//! Traces: the one room the pipeline's stages report to. A call, each of its attempts and each
//! of their effects is a span (OpenTelemetry), a child of the caller's W3C trace context when the
//! call came with one, and an effect sends its own context downstream in `traceparent` beside its
//! `Idempotency-Key`, so that agent -> oncebox -> provider is one trace.
//!
//! A `Span` rides on the call's existing state (`Prepared`, an attempt's `Scope`), never as an
//! argument threaded through the stages. Where the spans go is the embedder's choice
//! ([`install`]; the `oncebox` binary exports over OTLP when the `OTEL_EXPORTER_OTLP_*`
//! variables say where): with none installed a span is nothing, and what the pipeline pays is a
//! load and a branch. The caller's context still reaches the downstream then, unchanged.
//!
//! What a span says: ids the orchestrator chose (run, step), names (tool, class, an effect's label,
//! kind and target), hashes (keys), counts and verdicts. Never an arg, a param, an answer or an
//! error's text: those may carry a sensitive value, and masking cannot catch every form of one.

use std::sync::OnceLock;

use opentelemetry::global::BoxedTracer;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanBuilder, SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;

use crate::call::{Outcome, Prepared};
use crate::error::CallError;
use crate::ledger::{AttemptRecord, EffectRecord, EffectSource};
use crate::policy::ReplayClass;

/// The longest `traceparent` read (version 00 is 55 characters; a later version may append).
pub const MAX_TRACEPARENT_BYTES: usize = 256;
/// The longest `tracestate` read (W3C: at most 32 members; 512 characters is what a vendor must
/// carry). A longer one is dropped, and the trace goes on without it.
pub const MAX_TRACESTATE_BYTES: usize = 1024;

/// The caller's W3C trace context, as it arrived: the HTTP API's `traceparent` and `tracestate`
/// headers, or the same keys in an MCP request's `_meta`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceContext {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// The context from its two values, or `None` without a `traceparent` (or with one over its
    /// bound). Whether it parses is judged when the call's span starts: a malformed one starts a
    /// new trace, as W3C asks.
    pub fn new(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<TraceContext> {
        let traceparent = traceparent?.trim();
        if traceparent.is_empty() || traceparent.len() > MAX_TRACEPARENT_BYTES {
            return None;
        }
        let tracestate = tracestate.filter(|s| s.len() <= MAX_TRACESTATE_BYTES).map(str::to_string);
        Some(TraceContext { traceparent: traceparent.to_string(), tracestate })
    }
}

impl Extractor for TraceContext {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => Some(&self.traceparent),
            "tracestate" => self.tracestate.as_deref(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

static TRACER: OnceLock<BoxedTracer> = OnceLock::new();

/// Makes the pipeline's spans with `tracer` from now on (the first call wins; later ones are
/// ignored). Without it, no span is made.
pub fn install(tracer: BoxedTracer) {
    let _ = TRACER.set(tracer);
}

/// Whether spans are made.
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

/// A call's, an attempt's or an effect's span, as a context its children start from; `None` when
/// spans are off and the caller sent no context. Ended when its last clone is dropped, if not
/// before.
#[derive(Clone, Default)]
pub(crate) struct Span(Option<Context>);

impl std::fmt::Debug for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(cx) => write!(f, "Span({:?})", cx.span().span_context().span_id()),
            None => f.write_str("Span(none)"),
        }
    }
}

/// Attribute names, in one place.
mod key {
    pub const RUN: &str = "oncebox.run";
    pub const STEP: &str = "oncebox.step";
    pub const TOOL: &str = "oncebox.tool";
    pub const CLASS: &str = "oncebox.class";
    pub const OPERATION_KEY: &str = "oncebox.operation_key";
    pub const ATTEMPT: &str = "oncebox.attempt";
    pub const MAX_ATTEMPTS: &str = "oncebox.max_attempts";
    pub const ATTEMPTS: &str = "oncebox.attempts";
    pub const SOURCE: &str = "oncebox.source";
    pub const VERDICT: &str = "oncebox.verdict";
    pub const DOWNSTREAM_ACCEPTED: &str = "oncebox.downstream_accepted";
    pub const EFFECT_KEY: &str = "oncebox.effect.key";
    pub const EFFECT_KIND: &str = "oncebox.effect.kind";
    pub const EFFECT_TARGET: &str = "oncebox.effect.target";
}

impl Span {
    /// A call's span: a child of the caller's context when it sent one.
    pub(crate) fn call(caller: Option<&TraceContext>, tool: &str, class: ReplayClass) -> Span {
        let parent = caller.map(|caller| TraceContextPropagator::new().extract(caller));
        let Some(tracer) = TRACER.get() else {
            // No spans of ours; the caller's context alone goes downstream.
            return Span(parent.filter(|cx| cx.span().span_context().is_valid()));
        };
        let builder = SpanBuilder::from_name("call")
            .with_kind(SpanKind::Server)
            .with_attributes([KeyValue::new(key::TOOL, tool.to_string()), KeyValue::new(key::CLASS, class.as_str())]);
        let parent = parent.unwrap_or_default();
        Span(Some(parent.with_span(tracer.build_with_context(builder, &parent))))
    }

    /// The call's ids, once they are derived.
    pub(crate) fn keyed(&self, prepared: &Prepared) {
        self.set([
            KeyValue::new(key::RUN, prepared.run_id.clone()),
            KeyValue::new(key::STEP, prepared.step_id.clone()),
            KeyValue::new(key::OPERATION_KEY, prepared.operation_key.clone()),
        ]);
    }

    /// Ends the call's span with what became of the call.
    pub(crate) fn called(&self, result: &Result<Outcome, CallError>) {
        let Some(cx) = self.recording() else { return };
        let span = cx.span();
        match result {
            Ok(outcome) => {
                let source = if outcome.replayed { "replayed" } else { "fresh" };
                span.set_attributes([
                    KeyValue::new(key::SOURCE, source),
                    KeyValue::new(key::VERDICT, outcome.status.as_str()),
                    KeyValue::new(key::ATTEMPTS, i64::from(outcome.attempts)),
                ]);
                if let Some(key) = &outcome.operation_key {
                    span.set_attribute(KeyValue::new(key::OPERATION_KEY, key.clone()));
                }
                if matches!(outcome.status, crate::Status::Failed | crate::Status::Unknown) {
                    span.set_status(Status::error(outcome.status.as_str()));
                }
            }
            // The error's kind, never its text (which may quote the args).
            Err(e) => {
                span.set_attribute(KeyValue::new(key::VERDICT, "error"));
                span.set_status(Status::error(error_kind(e)));
            }
        }
        span.end();
    }

    /// An attempt's span, a child of the call's.
    pub(crate) fn attempt(&self, attempt: u32, max_attempts: u32) -> Span {
        self.child("attempt", SpanKind::Internal, || {
            vec![
                KeyValue::new(key::ATTEMPT, i64::from(attempt)),
                KeyValue::new(key::MAX_ATTEMPTS, i64::from(max_attempts)),
            ]
        })
    }

    /// Ends an attempt's span with its record's verdict.
    pub(crate) fn attempted(&self, record: &AttemptRecord) {
        let Some(cx) = self.recording() else { return };
        let span = cx.span();
        span.set_attributes([
            KeyValue::new(key::SOURCE, record.source.as_str()),
            KeyValue::new(key::VERDICT, record.outcome.clone()),
        ]);
        if let Some(accepted) = record.downstream_accepted {
            span.set_attribute(KeyValue::new(key::DOWNSTREAM_ACCEPTED, accepted));
        }
        if record.outcome != "ok" {
            span.set_status(Status::error(record.outcome.clone()));
        }
        span.end();
    }

    /// An effect's span, a child of its attempt's, for an effect sent downstream: a client span,
    /// started at its write-ahead, whose context goes with it ([`Span::headers`]).
    pub(crate) fn sent(&self, record: &EffectRecord, source: EffectSource) -> Span {
        self.effect_span(record, source, SpanKind::Client)
    }

    /// An effect's span for an effect not sent: answered from the ledger, or a local write.
    pub(crate) fn effect(&self, record: &EffectRecord, source: EffectSource) -> Span {
        self.effect_span(record, source, SpanKind::Internal)
    }

    fn effect_span(&self, record: &EffectRecord, source: EffectSource, kind: SpanKind) -> Span {
        self.child("effect", kind, || {
            vec![
                KeyValue::new(key::EFFECT_KEY, record.key.clone()),
                KeyValue::new(key::EFFECT_KIND, record.kind.clone()),
                KeyValue::new(key::EFFECT_TARGET, record.target.clone()),
                KeyValue::new(key::SOURCE, source.as_str()),
            ]
        })
    }

    /// Ends an effect's span with the state its record was left in.
    pub(crate) fn effected(&self, record: &EffectRecord) {
        let Some(cx) = self.recording() else { return };
        let span = cx.span();
        let verdict = record.status.as_str();
        if record.status.in_doubt() {
            span.set_status(Status::error(verdict));
        }
        span.set_attribute(KeyValue::new(key::VERDICT, verdict));
        span.end();
    }

    /// The headers that carry this span's context downstream (`traceparent`, and `tracestate` when
    /// there is one); none without a context.
    pub(crate) fn headers(&self) -> Vec<(String, String)> {
        let Some(cx) = &self.0 else { return Vec::new() };
        let mut headers = std::collections::HashMap::new();
        TraceContextPropagator::new().inject_context(cx, &mut headers);
        let mut headers: Vec<(String, String)> = headers.into_iter().collect();
        headers.sort();
        headers
    }

    fn child(&self, name: &'static str, kind: SpanKind, attributes: impl FnOnce() -> Vec<KeyValue>) -> Span {
        let (Some(tracer), Some(parent)) = (TRACER.get(), &self.0) else {
            return self.clone();
        };
        let builder = SpanBuilder::from_name(name).with_kind(kind).with_attributes(attributes());
        Span(Some(parent.with_span(tracer.build_with_context(builder, parent))))
    }

    fn set<const N: usize>(&self, attributes: [KeyValue; N]) {
        if let Some(cx) = self.recording() {
            cx.span().set_attributes(attributes);
        }
    }

    /// The context, when its span is one of ours that records.
    fn recording(&self) -> Option<&Context> {
        self.0.as_ref().filter(|cx| TRACER.get().is_some() && cx.span().is_recording())
    }
}

/// A call error's kind, for its span's status: the variant, never the message.
fn error_kind(e: &CallError) -> &'static str {
    match e {
        CallError::UnknownTool { .. } => "unknown-tool",
        CallError::InvalidArgs { .. } => "invalid-args",
        CallError::StepRequired { .. } => "step-required",
        CallError::ReservedStep { .. } => "reserved-step",
        CallError::InvalidId { .. } => "invalid-id",
        CallError::InvalidResolution { .. } => "invalid-resolution",
        CallError::ByHand { .. } => "by-hand",
        CallError::Approval { .. } => "approval",
        CallError::Seal { .. } => "seal",
        CallError::Ledger(_) => "ledger",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_context_needs_a_traceparent_within_its_bound_and_drops_an_overlong_tracestate() {
        assert_eq!(TraceContext::new(None, Some("a=b")), None);
        assert_eq!(TraceContext::new(Some("  "), None), None);
        assert_eq!(TraceContext::new(Some(&"0".repeat(MAX_TRACEPARENT_BYTES + 1)), None), None);
        let long = "a=b,".repeat(MAX_TRACESTATE_BYTES);
        let context = TraceContext::new(Some(PARENT), Some(&long)).expect("a context");
        assert_eq!(context, TraceContext { traceparent: PARENT.into(), tracestate: None });
    }

    // No test of this crate installs a tracer: these are the spans of a host without one.
    #[test]
    fn without_a_tracer_the_callers_context_goes_downstream_unchanged_and_a_malformed_one_not_at_all() {
        assert!(!enabled());
        let caller = TraceContext::new(Some(PARENT), Some("vendor=opaque"));
        let effect = Span::call(caller.as_ref(), "charge", ReplayClass::Compensatable).attempt(1, 3);
        assert_eq!(
            effect.headers(),
            [("traceparent".to_string(), PARENT.to_string()), ("tracestate".to_string(), "vendor=opaque".to_string())]
        );
        for malformed in ["00-00000000000000000000000000000000-00f067aa0ba902b7-01", "not a traceparent"] {
            let caller = TraceContext::new(Some(malformed), None);
            let span = Span::call(caller.as_ref(), "charge", ReplayClass::Compensatable);
            assert_eq!(span.attempt(1, 3).headers(), [], "{malformed}");
        }
        assert_eq!(Span::call(None, "charge", ReplayClass::Compensatable).attempt(1, 3).headers(), []);
    }

    /// What the stages pay per call without a tracer and without a caller's context:
    /// `cargo test -p oncebox-runtime --release telemetry::tests::cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a timing, not a check"]
    fn cost() {
        let n = 10_000_000u32;
        let start = std::time::Instant::now();
        for attempt in 0..n {
            let call = Span::call(None, "charge", ReplayClass::Compensatable);
            let span = std::hint::black_box(&call).attempt(attempt, 3);
            std::hint::black_box(span.headers());
            call.called(&Err(CallError::InvalidId { reason: String::new() }));
        }
        println!("{:.2} ns per call's spans, off", start.elapsed().as_nanos() as f64 / f64::from(n));
    }
}
