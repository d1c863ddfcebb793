//! Loading refuses what is not a tool of its declared class, naming the reason.

use oncebox::{Error, Host, LoadError, ReplayClass};

async fn host() -> Host {
    Host::builder_in_memory().build().await.expect("host")
}

#[tokio::test]
async fn a_read_only_tool_that_imports_effects_is_refused() {
    let err = host().await.load(oncebox_artifacts::LYING_READER).await.expect_err("must refuse");
    match &err {
        Error::Load(LoadError::ClassMismatch { tool, class, reason, .. }) => {
            assert_eq!(tool, "lying-reader");
            assert_eq!(*class, ReplayClass::ReadOnly);
            assert!(reason.contains("oncebox:tool/effects@0.1.0"), "{reason}");
        }
        other => panic!("expected a class mismatch, got {other:?}"),
    }
}

/// wasi:sockets is linked so that language runtimes' default builds load, and refuses every use:
/// the tool's connect fails, and the listener it aimed at never sees a connection.
#[tokio::test]
async fn a_component_importing_sockets_loads_and_reaches_nothing() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    let host = host().await;
    host.load(oncebox_artifacts::SOCKET_USER).await.expect("loads");
    let (imports, _) = host.interface("socket-user").expect("interface");
    assert!(imports.iter().any(|i| i.starts_with("wasi:sockets/")), "{imports:?}");
    let args = serde_json::json!({"addr": addr.to_string()}).to_string();
    let outcome = host.call(oncebox::Call::unrecorded("socket-user", args)).await.expect("call");
    assert_eq!(outcome.status, oncebox::Status::Failed, "{outcome:?}");
    assert!(listener.accept().is_err(), "the listener saw no connection");
    // Name lookup is refused too: `localhost` resolves to nothing, before any connect.
    let args = serde_json::json!({"addr": format!("localhost:{}", addr.port())}).to_string();
    let outcome = host.call(oncebox::Call::unrecorded("socket-user", args)).await.expect("call");
    assert_eq!(outcome.status, oncebox::Status::Failed, "{outcome:?}");
    let message = outcome.error.map(|e| e.message).unwrap_or_default();
    assert!(message.contains("lookup") || message.contains("resolve"), "{message}");
    assert!(listener.accept().is_err(), "the listener saw no connection");
}

/// Only the component's own imports are the host's business: one of a component nested inside it
/// is satisfied inside, and is not refused; one of its own after a nested module still is.
#[tokio::test]
async fn the_imports_checked_are_the_component_s_own() {
    let dir = tempfile::tempdir().expect("dir");
    let cases = [
        (r#"(component (component (import "wasi:http/outgoing-handler@0.2.0" (instance))))"#, false),
        (r#"(component (core module) (import "wasi:http/outgoing-handler@0.2.0" (instance)))"#, true),
    ];
    for (i, (wat, refused)) in cases.into_iter().enumerate() {
        let wasm = dir.path().join(format!("{i}.wasm"));
        std::fs::write(&wasm, wat::parse_str(wat).expect("wat")).expect("write");
        let err = host().await.load(&wasm).await.expect_err("neither is a tool");
        let forbidden = matches!(&err, Error::Load(LoadError::ForbiddenImport { .. }));
        assert_eq!(forbidden, refused, "{wat}: {err}");
        if !refused {
            assert!(matches!(&err, Error::Load(LoadError::NotATool { .. })), "{wat}: {err}");
        }
    }
}

/// Imports are checked from the component's outer sections before anything is compiled.
#[tokio::test]
async fn a_forbidden_import_is_refused_by_name_before_compiling() {
    let dir = tempfile::tempdir().expect("dir");
    let wasm = dir.path().join("http-user.wasm");
    // A component that imports wasi:http and nothing else.
    let wat = r#"(component (import "wasi:http/outgoing-handler@0.2.0" (instance)))"#;
    std::fs::write(&wasm, wat::parse_str(wat).expect("wat")).expect("write");
    let cache = dir.path().join("cache");
    let host = Host::builder_in_memory().compile_cache(&cache).build().await.expect("host");
    let err = host.load(&wasm).await.expect_err("must refuse");
    match &err {
        Error::Load(LoadError::ForbiddenImport { import, .. }) => {
            assert_eq!(import, "wasi:http/outgoing-handler@0.2.0")
        }
        other => panic!("expected a forbidden import, got {other:?}"),
    }
    assert!(err.to_string().contains("does not link"), "{err}");
    let compiled = std::fs::read_dir(&cache).map(|d| d.count()).unwrap_or(0);
    assert_eq!(compiled, 0, "nothing was compiled");
}

#[tokio::test]
async fn files_that_are_not_components_are_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").expect("write");
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"definitely not wasm").expect("write");
    let host = host().await;
    let err = host.load(&core).await.expect_err("core module");
    assert!(err.to_string().contains("core module"), "{err}");
    assert!(matches!(host.load(&junk).await, Err(Error::Load(LoadError::NotAComponent { .. }))));
    assert!(matches!(host.load(dir.path().join("missing.wasm")).await, Err(Error::Load(LoadError::Io { .. }))));
}

#[tokio::test]
async fn the_manifest_is_read_and_a_duplicate_name_is_refused() {
    let host = host().await;
    let manifest = host.load(oncebox_artifacts::CHARGE).await.expect("load");
    assert_eq!(manifest.name, "charge");
    assert_eq!(manifest.class, ReplayClass::Compensatable);
    assert_eq!(manifest.compensated_by.as_deref(), Some("refund"));
    assert_eq!(manifest.sensitive, ["/payment_method"]);
    assert_eq!(manifest.input_schema["required"].as_array().map(Vec::len), Some(4));
    let (imports, exports) = host.interface("charge").expect("interface");
    assert!(exports.iter().any(|e| e == "oncebox:tool/reconcile@0.1.0"));
    assert!(imports.iter().all(|i| !i.starts_with("wasi:filesystem")));
    assert!(matches!(host.load(oncebox_artifacts::CHARGE).await, Err(Error::DuplicateTool { .. })));
}

#[tokio::test]
async fn every_example_tool_loads_with_its_class() {
    let host = host().await;
    let mut classes = Vec::new();
    for tool in oncebox_artifacts::EXAMPLE_TOOLS {
        let m = host.load(tool).await.expect("load");
        classes.push((m.name, m.class));
    }
    use ReplayClass::*;
    let expected = [
        ("stock", ReadOnly),
        ("reserve", Compensatable),
        ("release", IdempotentWrite),
        ("charge", Compensatable),
        ("refund", IdempotentWrite),
        ("fulfill", Irreversible),
        ("notify", IdempotentWrite),
    ];
    assert_eq!(classes, expected.map(|(n, c)| (n.to_string(), c)));
}

/// Writes a component given as WebAssembly text and returns its path.
fn component(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, wat::parse_str(text).expect("valid component text")).expect("write");
    path
}

#[tokio::test]
async fn a_component_of_another_world_is_refused_naming_what_it_exports() {
    let dir = tempfile::tempdir().expect("dir");
    let other =
        component(dir.path(), "other.wasm", r#"(component (instance $i) (export "acme:shop/api" (instance $i)))"#);
    let err = host().await.load(&other).await.expect_err("another world");
    match &err {
        Error::Load(LoadError::NotATool { reason, .. }) => {
            assert!(reason.contains("acme:shop/api"), "{reason}");
            assert!(reason.contains("another world"), "{reason}");
        }
        other => panic!("expected not-a-tool, got {other:?}"),
    }
}

#[tokio::test]
async fn a_component_of_another_contract_version_is_refused_with_both_versions() {
    let dir = tempfile::tempdir().expect("dir");
    let future = component(dir.path(), "future.wasm", r#"(component (import "oncebox:tool/reads@0.2.0" (instance)))"#);
    let err = host().await.load(&future).await.expect_err("another version");
    assert!(
        matches!(&err, Error::Load(LoadError::ContractVersion { found, .. }) if found == "oncebox:tool/reads@0.2.0")
    );
    let message = err.to_string();
    assert!(message.contains("oncebox:tool/reads@0.2.0") && message.contains("oncebox:tool@0.1"), "{message}");
}

#[tokio::test]
async fn a_component_file_over_the_size_limit_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().expect("dir");
    let huge = dir.path().join("huge.wasm");
    // Sparse: the limit is checked from the file's metadata, so no disk is spent on this test.
    std::fs::File::create(&huge).and_then(|f| f.set_len(oncebox::MAX_COMPONENT_BYTES + 1)).expect("sparse file");
    let err = host().await.load(&huge).await.expect_err("too large");
    assert!(err.to_string().contains("over the limit"), "{err}");
}
