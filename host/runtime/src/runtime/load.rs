//! Loading a component: compile, check its imports against the allowed set, read its manifest,
//! and check that the class it declares matches what it imports and exports.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use wasmtime::component::InstancePre;

use super::bindings::{ReconcileIndices, ToolIndices, WitReplayClass};
use super::{MAX_COMPONENT_BYTES, Runtime, StoreState};
use crate::capabilities::{Grants, Sandbox};
use crate::effects::{EffectCtx, Shared};
use crate::limits::{
    MAX_DESCRIPTION_BYTES, MAX_ERROR_MESSAGE_BYTES, MAX_INPUT_SCHEMA_BYTES, MAX_SENSITIVE_POINTER_BYTES,
    MAX_SENSITIVE_POINTERS, MAX_TOOL_NAME_BYTES, MAX_VERSION_BYTES, cut_message,
};
use crate::policy::ReplayClass;

/// How long `describe()` may take: it only builds a manifest.
const DESCRIBE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

pub const TOOL_EXPORT: &str = "oncebox:tool/tool@0.1.0";
pub const RECONCILE_EXPORT: &str = "oncebox:tool/reconcile@0.1.0";
pub const EFFECTS_IMPORT: &str = "oncebox:tool/effects@0.1.0";

/// The contract this host speaks: `oncebox:tool@0.1.x`.
const CONTRACT: &str = "oncebox:tool/";
const CONTRACT_VERSION: &str = "@0.1.";

/// Import prefixes a tool may use; anything else (wasi:http, another package) is refused at load,
/// by name. wasi:filesystem sees only the directories granted to the tool, and wasi:sockets
/// refuses every use (`state.rs`): both are allowed so that the default builds of language
/// runtimes (componentize-py, componentize-js) load.
const ALLOWED_IMPORTS: [&str; 10] = [
    "oncebox:tool/types@0.1.",
    "oncebox:tool/reads@0.1.",
    "oncebox:tool/config@0.1.",
    "oncebox:tool/effects@0.1.",
    "wasi:cli/",
    "wasi:io/",
    "wasi:clocks/",
    "wasi:random/",
    "wasi:filesystem/",
    "wasi:sockets/",
];

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The I/O error is part of the message, not a `source` of it: chained (`{:#}`), it would be
    /// said twice.
    #[error("cannot read {path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{path} is not a WebAssembly component: {reason}")]
    NotAComponent { path: PathBuf, reason: String },
    #[error(
        "{path} imports `{import}`, which oncebox does not link (tools get oncebox:tool, wasi:cli, io, clocks and random, and wasi:filesystem and sockets linked denied; a tool's HTTP goes through oncebox:tool)"
    )]
    ForbiddenImport { path: PathBuf, import: String },
    #[error("{path} is not an oncebox tool: {reason}")]
    NotATool { path: PathBuf, reason: String },
    #[error(
        "{path} was built against `{found}`, but this host speaks oncebox:tool@0.1; rebuild the tool with an SDK of \
         this version"
    )]
    ContractVersion { path: PathBuf, found: String },
    #[error("{path}: tool `{tool}` {reason}")]
    Ungranted { path: PathBuf, tool: String, reason: String },
    #[error("{path}: tool `{tool}` declares class {class} but {reason}")]
    ClassMismatch { path: PathBuf, tool: String, class: ReplayClass, reason: String },
    #[error("{path}: invalid manifest: {reason}")]
    BadManifest { path: PathBuf, reason: String },
    #[error("wasm engine: {0}")]
    Engine(String),
}

/// What a tool says about itself, checked.
#[derive(Debug, Clone, Serialize)]
pub struct ToolManifest {
    pub name: String,
    pub version: String,
    pub description: String,
    pub class: ReplayClass,
    pub input_schema: serde_json::Value,
    pub compensated_by: Option<String>,
    /// How the compensating tool's args are made: (its arg name, a JSON pointer into
    /// `{"args": ..., "output": ...}` of the operation it undoes).
    pub compensation_args: Vec<(String, String)>,
    /// What cannot be taken back once it ran, in words, for the approver.
    pub consequence: Option<String>,
    pub sensitive: Vec<String>,
}

/// A verified component, ready to instantiate many times.
pub struct LoadedTool {
    pub path: PathBuf,
    /// `sha256:HEX` of the component file's bytes as loaded: names the code that runs, and
    /// binds an approval to it (`approvals.rs`), so that a tool replaced since the decision
    /// needs a new one.
    pub digest: String,
    pub manifest: ToolManifest,
    pub imports: Vec<String>,
    pub exports: Vec<String>,
    pub(super) pre: InstancePre<StoreState>,
    pub(super) tool: ToolIndices,
    pub(super) reconcile: Option<ReconcileIndices>,
    pub(crate) schema: jsonschema::Validator,
    /// What the tool may reach and consume; the host sets it after loading, from its policy.
    pub sandbox: Arc<Sandbox>,
}

impl std::fmt::Debug for LoadedTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedTool")
            .field("path", &self.path)
            .field("digest", &self.digest)
            .field("manifest", &self.manifest)
            .finish()
    }
}

/// A component read, checked before compiling, and compiled: what [`Runtime::compile`] answers.
pub struct Compiled {
    pub path: PathBuf,
    /// `sha256:HEX` of the file as read.
    pub digest: String,
    pub origin: super::cache::Origin,
    imports: Vec<String>,
    exports: Vec<String>,
    component: wasmtime::component::Component,
}

impl Runtime {
    /// Reads the component at `path`, refuses what the checks before compiling refuse (not a
    /// component, too big, an import outside the contract), and compiles it, or takes it from the
    /// compile cache (the process's, then the cache directory's), on a blocking thread: a server
    /// keeps answering while a language runtime's component compiles. `oncebox compile` and a
    /// server's first scan compile ahead of loading this way.
    pub async fn compile(&self, path: &Path) -> Result<Compiled, LoadError> {
        let path = path.to_path_buf();
        let io = |error| LoadError::Io { path: path.clone(), error };
        let size = std::fs::metadata(&path).map_err(io)?.len();
        if size > MAX_COMPONENT_BYTES {
            return Err(LoadError::NotAComponent {
                path,
                reason: format!("it is {size} bytes, over the limit of {MAX_COMPONENT_BYTES}"),
            });
        }
        let bytes = std::fs::read(&path).map_err(io)?;
        let not_component = |reason: String| LoadError::NotAComponent { path: path.clone(), reason };
        if let Some(reason) = not_wasm(&bytes) {
            return Err(not_component(reason));
        }
        if is_core_module(&bytes) {
            return Err(not_component("it is a core module; build the tool for wasm32-wasip2".into()));
        }
        // What the component imports and exports is read from its outer sections before it is
        // compiled: a refused import costs milliseconds, not the tens of seconds a language
        // runtime's component takes to compile.
        let (imports, exports) =
            interface(&bytes).map_err(|e| not_component(one_line(&format!("failed to parse it: {e}"))))?;
        let other_version = |name: &&String| name.starts_with(CONTRACT) && !name.contains(CONTRACT_VERSION);
        if let Some(found) = imports.iter().chain(&exports).find(other_version) {
            return Err(LoadError::ContractVersion { path, found: found.clone() });
        }
        if let Some(import) = imports.iter().find(|i| !ALLOWED_IMPORTS.iter().any(|a| i.starts_with(a))) {
            return Err(LoadError::ForbiddenImport { path, import: import.clone() });
        }
        if !exports.iter().any(|e| e == TOOL_EXPORT) {
            let exported = if exports.is_empty() { "nothing".to_string() } else { exports.join(", ") };
            return Err(LoadError::NotATool {
                path,
                reason: format!("it exports {exported}, not `{TOOL_EXPORT}`: it is a component of another world"),
            });
        }

        let digest = format!("sha256:{}", hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes)));
        let (engine, dir) = (self.engine.clone(), self.cache_dir.clone());
        let compiled = tokio::task::spawn_blocking(move || super::cache::component(&engine, &bytes, dir.as_deref()))
            .await
            .map_err(|e| not_component(format!("its compile ended abnormally: {e}")))?;
        let (component, origin) = compiled.map_err(|e| not_component(one_line(&format!("{e:#}"))))?;
        Ok(Compiled { path, digest, origin, imports, exports, component })
    }

    pub async fn load(&self, path: &Path, shared: Arc<Shared>) -> Result<LoadedTool, LoadError> {
        let Compiled { path, digest, imports, exports, component, .. } = self.compile(path).await?;
        let not_component = |reason: String| LoadError::NotAComponent { path: path.clone(), reason };
        // The checks that follow (a read-only tool links no effect) rest on the imports read
        // before compiling: the compiled component must name the same ones.
        let mut compiled: Vec<String> =
            component.component_type().imports(&self.engine).map(|(name, _)| name.to_string()).collect();
        let mut read = imports.clone();
        compiled.sort();
        read.sort();
        if compiled != read {
            return Err(not_component(format!(
                "its import section names {} imports, the compiled component {}",
                read.len(),
                compiled.len()
            )));
        }
        let pre = self.linker.instantiate_pre(&component).map_err(|e| not_component(one_line(&format!("{e:#}"))))?;
        let tool =
            ToolIndices::new(&pre).map_err(|e| LoadError::NotATool { path: path.clone(), reason: format!("{e:#}") })?;
        let reconcile = if exports.iter().any(|e| e == RECONCILE_EXPORT) {
            Some(
                ReconcileIndices::new(&pre)
                    .map_err(|e| LoadError::NotATool { path: path.clone(), reason: format!("{e:#}") })?,
            )
        } else {
            None
        };

        let manifest = self.describe(&pre, &tool, shared).await.map_err(|reason| LoadError::NotATool {
            path: path.clone(),
            reason: format!("describe() failed: {}", cut_message(&reason, MAX_ERROR_MESSAGE_BYTES)),
        })?;
        let manifest = check_manifest(&path, manifest)?;

        let mismatch = |reason: String| LoadError::ClassMismatch {
            path: path.clone(),
            tool: manifest.name.clone(),
            class: manifest.class,
            reason,
        };
        if !manifest.class.writes() && imports.iter().any(|i| i.starts_with("oncebox:tool/effects@")) {
            return Err(mismatch(format!("it imports `{EFFECTS_IMPORT}`: a read-only tool cannot link an effect")));
        }
        if manifest.class.reconciles() && reconcile.is_none() {
            return Err(mismatch(format!("it does not export `{RECONCILE_EXPORT}`, which its class requires")));
        }
        let schema = jsonschema::validator_for(&manifest.input_schema).map_err(|e| LoadError::BadManifest {
            path: path.clone(),
            reason: one_line(&format!("input schema: {e}")),
        })?;
        let sandbox = Arc::new(Sandbox { tool: manifest.name.clone(), ..Sandbox::default() });
        Ok(LoadedTool { path, digest, manifest, imports, exports, pre, tool, reconcile, schema, sandbox })
    }

    async fn describe(
        &self,
        pre: &InstancePre<StoreState>,
        tool: &ToolIndices,
        shared: Arc<Shared>,
    ) -> Result<super::bindings::Manifest, String> {
        // `describe` runs with nothing granted and the default limits: it only builds a manifest.
        let effects = EffectCtx::new(shared, Arc::default(), Arc::default(), None);
        let mut store = self.store(effects, DESCRIBE_DEADLINE).map_err(|(message, _)| message)?;
        let instance = pre.instantiate_async(&mut store).await.map_err(|e| format!("{e:#}"))?;
        let guest = tool.load(&mut store, &instance).map_err(|e| format!("{e:#}"))?;
        guest.call_describe(&mut store).await.map_err(|e| format!("{e:#}"))
    }
}

/// Refuses grants that name a directory that is not there. (A tool that imports wasi:filesystem
/// without a grant loads: it sees no directory at all.)
pub fn check_grants(tool: &LoadedTool, grants: &Grants) -> Result<(), LoadError> {
    let ungranted =
        |reason: String| LoadError::Ungranted { path: tool.path.clone(), tool: tool.manifest.name.clone(), reason };
    for dir in &grants.dirs {
        if !dir.host.is_dir() {
            return Err(ungranted(format!("is granted {}, which is not a directory", dir.host.display())));
        }
    }
    Ok(())
}

fn check_manifest(path: &Path, m: super::bindings::Manifest) -> Result<ToolManifest, LoadError> {
    let bad = |reason: String| LoadError::BadManifest { path: path.to_path_buf(), reason };
    check_sizes(&m).map_err(bad)?;
    check_tool_name("name", &m.name).map_err(bad)?;
    if let Some(undo) = &m.compensated_by {
        check_tool_name("compensated-by", undo).map_err(bad)?;
    }
    let input_schema: serde_json::Value =
        serde_json::from_str(&m.input_schema).map_err(|e| bad(format!("input schema is not JSON: {e}")))?;
    for pointer in &m.sensitive {
        if !pointer.is_empty() && !pointer.starts_with('/') {
            return Err(bad(format!("sensitive field `{pointer}` is not a JSON pointer")));
        }
    }
    check_compensation_args(&m).map_err(bad)?;
    let class = match m.class {
        WitReplayClass::ReadOnly => ReplayClass::ReadOnly,
        WitReplayClass::IdempotentWrite => ReplayClass::IdempotentWrite,
        WitReplayClass::Compensatable => ReplayClass::Compensatable,
        WitReplayClass::Irreversible => ReplayClass::Irreversible,
    };
    Ok(ToolManifest {
        name: m.name,
        version: m.version,
        description: m.description,
        class,
        input_schema,
        compensated_by: m.compensated_by,
        compensation_args: m.compensation_args,
        consequence: m.consequence,
        sensitive: m.sensitive,
    })
}

/// The compensation mapping: only with a `compensated-by`, each pointer into the operation's
/// `/args/...` or `/output/...`, and none reaching a sensitive arg, which the ledger keeps redacted
/// (the compensation would get `[redacted]` instead of the value).
fn check_compensation_args(m: &super::bindings::Manifest) -> Result<(), String> {
    if m.compensated_by.is_none() && !m.compensation_args.is_empty() {
        return Err("`compensation-args` without `compensated-by`: nothing would receive them".into());
    }
    for (arg, pointer) in &m.compensation_args {
        if arg.is_empty() {
            return Err("`compensation-args` has an empty arg name".into());
        }
        let inside = pointer == "/args"
            || pointer == "/output"
            || pointer.starts_with("/args/")
            || pointer.starts_with("/output/");
        if !inside {
            return Err(format!(
                "`compensation-args` `{arg}` points at `{pointer}`, not into `/args/...` or `/output/...`"
            ));
        }
        if let Some(arg_pointer) = pointer.strip_prefix("/args") {
            let reaches = |sensitive: &String| {
                let under = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}/"));
                under(arg_pointer, sensitive) || under(sensitive, arg_pointer) || arg_pointer.is_empty()
            };
            if let Some(sensitive) = m.sensitive.iter().find(|s| reaches(s)) {
                return Err(format!(
                    "`compensation-args` `{arg}` reads `{pointer}`, which holds the sensitive `{sensitive}`: the \
                     ledger keeps it redacted, so the compensation would not get it"
                ));
            }
        }
    }
    Ok(())
}

/// Refuses a manifest field over its limit (`limits.rs`), naming the field, its size and the limit;
/// the text itself is not repeated.
fn check_sizes(m: &super::bindings::Manifest) -> Result<(), String> {
    let fields = [
        ("name", m.name.len(), MAX_TOOL_NAME_BYTES),
        ("version", m.version.len(), MAX_VERSION_BYTES),
        ("description", m.description.len(), MAX_DESCRIPTION_BYTES),
        ("input-schema", m.input_schema.len(), MAX_INPUT_SCHEMA_BYTES),
        ("compensated-by", m.compensated_by.as_ref().map_or(0, String::len), MAX_TOOL_NAME_BYTES),
        ("consequence", m.consequence.as_ref().map_or(0, String::len), MAX_DESCRIPTION_BYTES),
    ];
    if m.compensation_args.len() > MAX_SENSITIVE_POINTERS {
        return Err(format!(
            "`compensation-args` lists {} pairs, over the limit of {MAX_SENSITIVE_POINTERS}",
            m.compensation_args.len()
        ));
    }
    if let Some((arg, _)) = m
        .compensation_args
        .iter()
        .find(|(arg, pointer)| arg.len() > MAX_SENSITIVE_POINTER_BYTES || pointer.len() > MAX_SENSITIVE_POINTER_BYTES)
    {
        let shown = cut_message(arg, 64);
        return Err(format!("`compensation-args` `{shown}` is over the limit of {MAX_SENSITIVE_POINTER_BYTES} bytes"));
    }
    for (field, len, max) in fields {
        if len > max {
            return Err(format!("`{field}` is {len} bytes, over the limit of {max}"));
        }
    }
    if m.sensitive.len() > MAX_SENSITIVE_POINTERS {
        return Err(format!(
            "`sensitive` lists {} pointers, over the limit of {MAX_SENSITIVE_POINTERS}",
            m.sensitive.len()
        ));
    }
    if let Some((i, pointer)) = m.sensitive.iter().enumerate().find(|(_, p)| p.len() > MAX_SENSITIVE_POINTER_BYTES) {
        return Err(format!(
            "`sensitive` pointer #{i} is {} bytes, over the limit of {MAX_SENSITIVE_POINTER_BYTES}",
            pointer.len()
        ));
    }
    Ok(())
}

/// A tool name (the manifest's `name`, or the `compensated-by` it names): 1 to
/// [`MAX_TOOL_NAME_BYTES`] of `a-z`, `0-9`, `-`, `_`, so it can appear in a policy file's table
/// header, a log line and a key without quoting.
fn check_tool_name(field: &str, name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= MAX_TOOL_NAME_BYTES
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if valid {
        return Ok(());
    }
    // Short enough to quote: the size check came first.
    let shown = cut_message(name, MAX_TOOL_NAME_BYTES);
    Err(format!("`{field}` `{shown}` must be 1-{MAX_TOOL_NAME_BYTES} characters of a-z, 0-9, `-`, `_`"))
}

/// Why `bytes` cannot be WebAssembly at all (no magic number), in one line; `None` if they might be.
fn not_wasm(bytes: &[u8]) -> Option<String> {
    if bytes.starts_with(b"\0asm") {
        return None;
    }
    if bytes.is_empty() {
        return Some("the file is empty".into());
    }
    let head = &bytes[..bytes.len().min(512)];
    let text = std::str::from_utf8(head).is_ok_and(|t| t.chars().all(|c| !c.is_control() || c.is_whitespace()));
    Some(if text {
        "it is text, not a WebAssembly binary (which starts with the bytes \\0asm)".into()
    } else {
        "it does not start with the WebAssembly magic bytes \\0asm".into()
    })
}

/// An engine's error as one short line: its chain joined, whitespace (wasmparser's messages span
/// lines) collapsed, and cut to a few hundred bytes.
fn one_line(message: &str) -> String {
    const MAX_DETAIL_BYTES: usize = 300;
    cut_message(&message.split_whitespace().collect::<Vec<_>>().join(" "), MAX_DETAIL_BYTES)
}

/// The names a component imports and exports, from its outermost sections (the components and
/// modules nested inside it import from each other, not from the host). Reads without
/// validating: the compile that follows validates the bytes (or did, when the cache's entry was
/// written), and `load` checks that the compiled component imports the same names.
fn interface(bytes: &[u8]) -> Result<(Vec<String>, Vec<String>), String> {
    use wasmtime::wasmparser::{Parser, Payload};
    let (mut imports, mut exports, mut depth) = (Vec::new(), Vec::new(), 0usize);
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| e.to_string())? {
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) if depth > 0 => depth -= 1,
            Payload::ComponentImportSection(section) if depth == 0 => {
                for import in section {
                    imports.push(import.map_err(|e| e.to_string())?.name.name.to_string());
                }
            }
            Payload::ComponentExportSection(section) if depth == 0 => {
                for export in section {
                    exports.push(export.map_err(|e| e.to_string())?.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok((imports, exports))
}

/// A core module starts with the wasm magic and version 1; a component with layer 1.
fn is_core_module(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && bytes[..4] == *b"\0asm" && bytes[4..8] == [1, 0, 0, 0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::bindings::Manifest;

    fn manifest() -> Manifest {
        Manifest {
            name: "refund".into(),
            version: "0.1.0".into(),
            description: "Refunds an order's charge.".into(),
            class: WitReplayClass::IdempotentWrite,
            input_schema: r#"{"type": "object"}"#.into(),
            compensated_by: None,
            compensation_args: Vec::new(),
            consequence: None,
            sensitive: vec!["/card".into()],
        }
    }

    fn refusal(m: Manifest) -> String {
        match check_manifest(Path::new("t.wasm"), m) {
            Err(e @ LoadError::BadManifest { .. }) => e.to_string(),
            other => panic!("expected a bad manifest, got {other:?}"),
        }
    }

    #[test]
    fn a_manifest_within_its_limits_is_accepted() {
        let m = Manifest {
            name: "n".repeat(MAX_TOOL_NAME_BYTES),
            version: "v".repeat(MAX_VERSION_BYTES),
            description: "d".repeat(MAX_DESCRIPTION_BYTES),
            compensated_by: Some("c".repeat(MAX_TOOL_NAME_BYTES)),
            compensation_args: Vec::new(),
            consequence: Some("x".repeat(MAX_DESCRIPTION_BYTES)),
            sensitive: vec![format!("/{}", "p".repeat(MAX_SENSITIVE_POINTER_BYTES - 1)); MAX_SENSITIVE_POINTERS],
            ..manifest()
        };
        let checked = check_manifest(Path::new("t.wasm"), m).expect("every field at its limit is fine");
        assert_eq!(checked.name.len(), MAX_TOOL_NAME_BYTES);
    }

    #[test]
    fn each_manifest_field_over_its_limit_is_refused_naming_the_field_its_size_and_the_limit() {
        let schema = format!(r#"{{"description": "{}"}}"#, "s".repeat(MAX_INPUT_SCHEMA_BYTES));
        let cases: Vec<(Manifest, String)> = vec![
            (Manifest { name: "n".repeat(65), ..manifest() }, "`name` is 65 bytes, over the limit of 64".into()),
            (Manifest { version: "1".repeat(65), ..manifest() }, "`version` is 65 bytes, over the limit of 64".into()),
            (
                Manifest { description: "d".repeat(4097), ..manifest() },
                "`description` is 4097 bytes, over the limit of 4096".into(),
            ),
            (
                Manifest { input_schema: schema.clone(), ..manifest() },
                format!("`input-schema` is {} bytes, over the limit of 262144", schema.len()),
            ),
            (
                Manifest { compensated_by: Some("c".repeat(65)), ..manifest() },
                "`compensated-by` is 65 bytes, over the limit of 64".into(),
            ),
            (
                Manifest { sensitive: vec!["/a".into(); 65], ..manifest() },
                "`sensitive` lists 65 pointers, over the limit of 64".into(),
            ),
            (
                Manifest { sensitive: vec!["/a".into(), format!("/{}", "p".repeat(256))], ..manifest() },
                "`sensitive` pointer #1 is 257 bytes, over the limit of 256".into(),
            ),
        ];
        for (m, expected) in cases {
            let message = refusal(m);
            assert!(message.starts_with("t.wasm: invalid manifest: ") && message.ends_with(&expected), "{message}");
            assert!(message.len() < 200, "the refusal does not repeat the field: {message}");
        }
    }

    #[test]
    fn a_compensation_mapping_reads_only_the_args_and_output_the_ledger_keeps_whole() {
        let undone = |pairs: &[(&str, &str)]| Manifest {
            compensated_by: Some("refund".into()),
            compensation_args: pairs.iter().map(|(a, p)| (a.to_string(), p.to_string())).collect(),
            ..manifest()
        };
        let fine = undone(&[("order_id", "/args/order_id"), ("amount_cents", "/output/amount_cents")]);
        assert!(check_manifest(Path::new("t.wasm"), fine).is_ok());
        let cases = [
            (undone(&[("card", "/args/card")]), "holds the sensitive `/card`"),
            (undone(&[("card", "/args/card/last4")]), "holds the sensitive `/card`"),
            (undone(&[("all", "/args")]), "holds the sensitive `/card`"),
            (undone(&[("x", "/elsewhere/x")]), "not into `/args/...` or `/output/...`"),
            (undone(&[("", "/args/x")]), "empty arg name"),
            (
                Manifest { compensation_args: vec![("a".into(), "/args/a".into())], ..manifest() },
                "without `compensated-by`",
            ),
        ];
        for (m, expected) in cases {
            let message = refusal(m);
            assert!(message.contains(expected), "{message}");
        }
    }

    #[test]
    fn tool_names_are_lowercase_identifiers() {
        for name in ["", "Refund", "re fund", "refund!", "réfund"] {
            let message = refusal(Manifest { name: name.into(), ..manifest() });
            assert!(message.contains("`name`") && message.contains("a-z, 0-9"), "{message}");
        }
        let message = refusal(Manifest { compensated_by: Some("Undo Me".into()), ..manifest() });
        assert!(message.contains("`compensated-by` `Undo Me`"), "{message}");
        for name in ["refund", "a_b-9"] {
            check_manifest(Path::new("t.wasm"), Manifest { name: name.into(), ..manifest() }).expect(name);
        }
    }

    #[test]
    fn a_file_that_is_not_wasm_gets_a_one_line_reason() {
        assert_eq!(not_wasm(b""), Some("the file is empty".into()));
        assert!(not_wasm(b"hello world\n").is_some_and(|r| r.starts_with("it is text")));
        assert!(not_wasm(&[0x97, 0x1a, 0xf7, 0xa3, 0, 1]).is_some_and(|r| r.contains("magic bytes")));
        assert_eq!(not_wasm(b"\0asm\x0d\0\x01\0"), None);
        let multi = "failed to parse: bad magic number - expected=[\n    0x0,\n    0x61,\n] actual=[\n    0x68,\n]";
        assert_eq!(one_line(multi), "failed to parse: bad magic number - expected=[ 0x0, 0x61, ] actual=[ 0x68, ]");
        assert!(one_line(&"word ".repeat(1000)).len() < 400);
    }
}
