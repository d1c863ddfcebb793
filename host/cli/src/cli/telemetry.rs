//! Where the pipeline's spans go (`oncebox_runtime::telemetry` makes them): exported over OTLP
//! (HTTP/protobuf) when the standard variables name an endpoint, `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (`/v1/traces` appended) or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; nowhere otherwise, and then no
//! span is made at all. The exporter reads the other `OTEL_EXPORTER_OTLP_*` variables (headers,
//! timeout, compression), the SDK its `OTEL_BSP_*` and `OTEL_TRACES_SAMPLER*` ones; the resource
//! is `service.name` = oncebox (unless `OTEL_SERVICE_NAME`, or a `service.name` in
//! `OTEL_RESOURCE_ATTRIBUTES`, says otherwise), `service.version`, and `OTEL_RESOURCE_ATTRIBUTES`.

use opentelemetry::KeyValue;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::resource::{EnvResourceDetector, TelemetryResourceDetector};
use opentelemetry_sdk::trace::SdkTracerProvider;

/// The exporter, while one runs: [`Traces::shutdown`] sends what is still batched.
#[must_use = "shut it down at exit, or the last spans are lost"]
pub struct Traces(Option<SdkTracerProvider>);

/// Starts the OTLP exporter when the environment asks for one. A bad setting is said once on
/// stderr and the command runs without traces: tracing is never a reason not to run.
pub fn init() -> Traces {
    let set = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let endpoint = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"));
    let disabled = set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || set("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
    if endpoint.is_none() || disabled {
        return Traces(None);
    }
    let protocol = set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL"));
    if let Some(protocol) = protocol.filter(|p| p != "http/protobuf") {
        tracing::warn!(%protocol, "traces are exported over OTLP http/protobuf only; the protocol asked for is ignored");
    }
    // The exporter's client is reqwest's, built with rustls and no provider of its own.
    oncebox::install_crypto_provider();
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()
    {
        Ok(exporter) => exporter,
        Err(e) => {
            eprintln!("warning: traces are not exported: {e}");
            return Traces(None);
        }
    };
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource()).build();
    let scope = opentelemetry::InstrumentationScope::builder("oncebox").with_version(env!("CARGO_PKG_VERSION")).build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    oncebox::telemetry::install(opentelemetry::global::tracer_with_scope(scope));
    Traces(Some(provider))
}

/// `service.name` = oncebox and `service.version`, under what `OTEL_RESOURCE_ATTRIBUTES` and
/// `OTEL_SERVICE_NAME` say (the later wins, as the specification orders them).
fn resource() -> Resource {
    let mut resource = Resource::builder_empty()
        .with_service_name("oncebox")
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .with_detectors(&[Box::new(TelemetryResourceDetector), Box::new(EnvResourceDetector::new())]);
    if let Some(name) = std::env::var("OTEL_SERVICE_NAME").ok().filter(|n| !n.trim().is_empty()) {
        resource = resource.with_service_name(name);
    }
    resource.build()
}

impl Traces {
    /// Sends the spans still batched and stops the exporter (bounded by the exporter's timeout).
    pub fn shutdown(self) {
        if let Some(provider) = self.0
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: the last traces may not have been exported: {e}");
        }
    }
}
