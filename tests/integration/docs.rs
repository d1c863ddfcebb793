//! The docs' code blocks (README.md and docs/*.md), checked against what they quote, and run.
//!
//! The rule for a fenced block in the docs:
//!
//! - `text`: a sample of output, a synopsis with placeholders, or a sketch. Nothing runs it.
//! - `sh`: commands, run as written. The README's two are the project's own: `cargo test
//!   --workspace` is what runs this file, and `cargo run -- demo` is `oncebox demo`, run below with
//!   its last line compared with the README's. docs/writing-tools.md's scaffolds, in Rust, Python
//!   and JavaScript, are run below.
//! - any other tag (`rust`, `python`, `js`, `toml`, `json`): a verbatim quote of a file, whole or a
//!   contiguous run of its lines, that a test builds, parses or runs. [`QUOTES`] lists, per doc,
//!   the files its blocks may quote and what runs each. A block found in none of its doc's files,
//!   or a listed file that no block quotes any more, fails here: a doc cannot drift from the code
//!   it shows.
//!
//! And every relative link `](path)` in the docs resolves to a file or directory of the repository.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

/// The repository's root: the first directory above this package that holds `Cargo.lock`.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|dir| dir.join("Cargo.lock").is_file())
        .expect("a Cargo.lock above the test package")
        .to_path_buf()
}

/// The files the docs' blocks quote: (doc, file, what builds, parses or runs the file). A file is a
/// path from the repository's root, or [`SCAFFOLD`].
const QUOTES: &[(&str, &str, &str)] = &[
    ("README.md", "example-tools/refund/src/lib.rs", "built by oncebox-artifacts; tool-refund's tests/harness.rs"),
    ("README.md", "docs/examples/mcp-servers.json", "the_mcp_configuration_serves_the_documented_call_over_stdio"),
    ("docs/writing-tools.md", SCAFFOLD, "a_tool_crate_made_as_the_guide_says_builds_and_survives_every_crash_point"),
    ("docs/writing-tools.md", "example-tools/charge/src/lib.rs", "built by oncebox-artifacts; tool-charge's tests"),
    ("docs/writing-tools.md", "example-tools/reserve/src/lib.rs", "built by oncebox-artifacts; tool-reserve's tests"),
    ("docs/writing-tools.md", "example-tools/python/charge/app.py", LANGUAGES),
    ("docs/writing-tools.md", "example-tools/python/charge/pyproject.toml", LANGUAGES),
    ("docs/writing-tools.md", "example-tools/js/charge/tool.js", LANGUAGES),
    ("docs/writing-tools.md", "example-tools/js/charge/package.json", LANGUAGES),
    ("docs/writing-tools.md", "example-tools/refund/tests/harness.rs", "tool-refund's test"),
    ("docs/writing-tools.md", "tests/integration/docs.rs", "a_tool_tested_in_isolation_is_charged_once"),
    (
        "docs/serving.md",
        "docs/examples/mcp-servers.json",
        "the_mcp_configuration_serves_the_documented_call_over_stdio",
    ),
    ("docs/serving.md", "docs/examples/tools-call.json", "the_mcp_configuration_serves_the_documented_call_over_stdio"),
    ("docs/serving.md", "tests/serve/orchestrator.py", "serve::orchestrator"),
    ("docs/operating.md", "tests/serve/notify_receiver.py", "serve::notifications"),
    (
        "docs/operating.md",
        "docs/examples/oncebox.toml",
        "the_policy_file_example_loads_and_shows_where_each_value_came_from",
    ),
    ("docs/integrations.md", "clients/python/tests/langgraph_scenarios.py", "clients::a_langgraph_*"),
    ("docs/integrations.md", "clients/python/tests/mcp_scenario.py", "clients::langgraph_calls_oncebox_over_mcp_*"),
    ("docs/integrations.md", "clients/python/tests/dbos_scenarios.py", "clients::a_dbos_*"),
    (
        "docs/policy-file.md",
        "docs/examples/oncebox.toml",
        "the_policy_file_example_loads_and_shows_where_each_value_came_from",
    ),
];

/// The tool `oncebox new put-item --class idempotent-write` writes, as docs/writing-tools.md shows it.
const SCAFFOLD: &str = "put-item/src/lib.rs, written by oncebox new";

/// What builds and runs the Python and JavaScript twins of `charge` (with oncebox-guest-langs, as
/// their authors would): loaded beside the Rust tools, charged once, compensated, explored.
const LANGUAGES: &str = "tests/integration/languages.rs";

/// The README's two commands, its first block.
const COMMANDS: &str = "\
cargo run -- demo            # a naive retry loop charges twice; oncebox charges once
cargo xtask test             # every test, after installing what they need: unit, provider, integration
";

/// The `sh` blocks besides the README's: (doc, its first line), each run by a test here.
const RUN: &[(&str, &str)] =
    &[("docs/writing-tools.md", NEW_RUST), ("docs/writing-tools.md", NEW_PYTHON), ("docs/writing-tools.md", NEW_JS)];

/// The first lines of docs/writing-tools.md's three scaffolds: `oncebox new`, in each language.
const NEW_RUST: &str = "oncebox new put-item --class idempotent-write      # or read-only, compensatable, irreversible";
const NEW_PYTHON: &str = "oncebox new put-item --class idempotent-write --lang python";
const NEW_JS: &str = "oncebox new put-item --class idempotent-write --lang js";

/// In the Python scaffold, where the reader puts the path of their checkout (`oncebox new` prints
/// the SDK's whole path); the test puts this repository's.
const CHECKOUT: &str = "path/to/oncebox";

struct Block {
    tag: String,
    body: String,
    line: usize,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// README.md and every docs/*.md, by path from the root.
fn docs() -> Vec<(String, String)> {
    let mut docs = vec![("README.md".to_string(), read("README.md"))];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    for page in pages {
        let name = format!("docs/{}", page.file_name().expect("name").to_string_lossy());
        docs.push((name.clone(), read(&name)));
    }
    docs
}

/// The fenced blocks of a markdown text, each body with its final newline.
fn blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (n, line) in text.lines().enumerate() {
        match (open.take(), line.strip_prefix("```")) {
            (None, Some(tag)) => open = Some(Block { tag: tag.trim().to_string(), body: String::new(), line: n + 1 }),
            (Some(block), Some("")) => blocks.push(block),
            (Some(mut block), _) => {
                block.body.push_str(line);
                block.body.push('\n');
                open = Some(block);
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "a block is not closed");
    blocks
}

/// A crate written by `oncebox new put-item --class idempotent-write` in `dir`.
fn scaffold(dir: &Path) -> PathBuf {
    let (code, _, stderr) = crate::support::oncebox(&[
        "new",
        "put-item",
        "--class",
        "idempotent-write",
        "--path",
        dir.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 0, "{stderr}");
    dir.join("put-item")
}

#[test]
fn every_block_is_a_sample_a_command_run_here_or_a_quote_of_a_file_that_runs() {
    let scratch = tempfile::tempdir().expect("dir");
    let scaffold = std::fs::read_to_string(scaffold(scratch.path()).join("src/lib.rs")).expect("lib.rs");
    let mut quoted = vec![false; QUOTES.len()];
    for (doc, text) in docs() {
        for (n, block) in blocks(&text).into_iter().enumerate() {
            let at = format!("{doc}:{}", block.line);
            match block.tag.as_str() {
                "text" => {}
                "" => panic!("{at}: a block without a tag (`text` if it is not run)"),
                "sh" if doc == "README.md" && n == 0 => assert_eq!(block.body, COMMANDS, "{at}"),
                "sh" => assert!(
                    RUN.iter().any(|(d, first)| *d == doc && block.body.lines().next() == Some(first)),
                    "{at}: an `sh` block that no test runs (tag it `text` if it is a synopsis)"
                ),
                _ => {
                    let mut found = false;
                    for (i, (d, file, _)) in QUOTES.iter().enumerate() {
                        if *d != doc {
                            continue;
                        }
                        let source = if *file == SCAFFOLD { scaffold.clone() } else { read(file) };
                        if source.contains(&block.body) {
                            quoted[i] = true;
                            found = true;
                        }
                    }
                    assert!(found, "{at}: this `{}` block quotes none of the files QUOTES lists for {doc}", block.tag);
                }
            }
        }
    }
    for (i, (doc, file, _)) in QUOTES.iter().enumerate() {
        assert!(quoted[i], "{doc} no longer quotes {file}: remove it from QUOTES");
    }
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    for (doc, text) in docs() {
        let dir = Path::new(&doc).parent().expect("dir").to_path_buf();
        let mut fenced = false;
        for line in text.lines() {
            if line.starts_with("```") {
                fenced = !fenced;
            }
            if fenced {
                continue;
            }
            for (i, _) in line.match_indices("](") {
                let target = line[i + 2..].split(')').next().expect("target");
                if ["http://", "https://", "#"].iter().any(|scheme| target.starts_with(scheme)) {
                    continue;
                }
                let path = target.split('#').next().expect("path");
                assert!(root().join(&dir).join(path).exists(), "{doc}: the link to {target} leads nowhere");
            }
        }
    }
}

#[test]
fn the_readme_opens_with_the_two_commands_and_links_every_page_in_at_most_250_lines() {
    let readme = read("README.md");
    assert!(readme.lines().count() <= 250, "README.md has {} lines", readme.lines().count());
    let first = blocks(&readme).into_iter().next().expect("a block");
    assert!(first.line <= 5, "the README's first block starts on line {}", first.line);
    assert_eq!((first.tag.as_str(), first.body.as_str()), ("sh", COMMANDS));
    // CI runs the test command as printed, not a command of its own beside it.
    let test_command = COMMANDS.lines().nth(1).and_then(|line| line.split('#').next()).map(str::trim);
    let ci = read(".ci/run");
    assert!(
        test_command.is_some_and(|command| ci.lines().any(|line| line.trim() == command)),
        ".ci/run does not run the README's test command {test_command:?}"
    );
    for (doc, _) in docs().into_iter().skip(1) {
        assert!(readme.contains(&format!("]({doc})")), "README.md does not link {doc}");
    }
}

#[test]
fn the_readme_shows_the_line_the_demo_ends_with() {
    let output = Command::new(env!("CARGO_BIN_EXE_oncebox")).arg("demo").output().expect("demo");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().expect("a summary line");
    let sample = blocks(&read("README.md")).into_iter().find(|b| b.body.starts_with("demo: ")).expect("the sample");
    assert_eq!(sample.body, format!("{last}\n"));
}

/// The `sh` block of docs/writing-tools.md that starts with `first`.
fn guide_commands(first: &str) -> String {
    let guide = read("docs/writing-tools.md");
    let block = blocks(&guide).into_iter().find(|b| b.tag == "sh" && b.body.lines().next() == Some(first));
    block.unwrap_or_else(|| panic!("docs/writing-tools.md has no `sh` block starting with {first:?}")).body
}

/// Runs `script` with bash in `dir`, with the `oncebox` this suite built first on the PATH and the
/// suite's compile cache; its stdout. What the outer build passes to its own rustc does not reach
/// a build the script makes.
fn sh(dir: &Path, script: &str, env: &[(&str, &str)]) -> String {
    let bin = Path::new(env!("CARGO_BIN_EXE_oncebox")).parent().expect("bin dir");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut command = Command::new("bash");
    command
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("PATH", &path)
        .env("ONCEBOX_CACHE", Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache"))
        .envs(env.iter().copied());
    for var in
        ["CARGO_TARGET_DIR", "CARGO_BUILD_TARGET", "RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "RUSTC_WORKSPACE_WRAPPER"]
    {
        command.env_remove(var);
    }
    let output = command.output().expect("bash");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{script}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    stdout.to_string()
}

/// Every step `oncebox new` printed after `next:` (but `cd`) is in the guide's commands, whose
/// continued lines are read as one: the guide shows what the binary says.
fn the_guide_shows_the_printed_steps(commands: &str, printed: &str) {
    let commands = commands.replace(" \\\n    ", " ");
    let steps = printed.lines().skip_while(|line| *line != "next:").skip(1).map(str::trim);
    let steps: Vec<&str> = steps.filter(|step| !step.starts_with("cd ")).collect();
    assert!(steps.len() >= 2 && steps.iter().any(|step| step.ends_with("--explore")), "{printed}");
    for step in steps {
        assert!(commands.contains(step), "the guide does not show the printed step `{step}`:\n{commands}");
    }
}

/// docs/writing-tools.md's Rust commands, as written: `oncebox new`, `cargo build --release` in the
/// crate (offline: the workspace's build has fetched what the SDK needs), and the harness test with
/// every crash point. The crate's target directory is kept in the suite's, so a second run builds
/// nothing.
#[test]
fn a_tool_crate_made_as_the_guide_says_builds_and_survives_every_crash_point() {
    let commands = guide_commands(NEW_RUST);
    let (new, rest) = commands.split_once('\n').expect("more than one line");
    let scratch = tempfile::tempdir().expect("dir");
    let offline = [("CARGO_NET_OFFLINE", "true")];
    let printed = sh(scratch.path(), new, &offline);
    the_guide_shows_the_printed_steps(&commands, &printed);
    let tool = std::fs::read_to_string(scratch.path().join("put-item/src/lib.rs")).expect("lib.rs");
    let guide = read("docs/writing-tools.md");
    assert!(blocks(&guide).iter().any(|b| b.tag == "rust" && b.body == tool), "the guide shows the tool it writes");
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("docs-put-item-target");
    std::fs::create_dir_all(&target).expect("target dir");
    std::os::unix::fs::symlink(&target, scratch.path().join("put-item/target")).expect("symlink");
    sh(scratch.path(), rest, &offline);
}

/// docs/writing-tools.md's Python commands, as written but for the checkout's path: a venv, the
/// SDK installed in it (componentize-py from PyPI, or pip's cache), the build, and the harness
/// test with every crash point. (The steps `oncebox new` prints appear in the guide: checked
/// below.)
#[test]
fn a_python_tool_made_as_the_guide_says_builds_and_survives_every_crash_point() {
    let commands = guide_commands(NEW_PYTHON);
    assert!(commands.contains(CHECKOUT), "{commands}");
    let commands = commands.replace(CHECKOUT, root().canonicalize().expect("root").to_str().expect("utf8"));
    a_tool_made_as_the_guide_says(&commands);
}

/// docs/writing-tools.md's JavaScript commands, as written: `npm install` (the SDK copied in, with
/// componentize-js and esbuild, from npm or its cache), `npm run build`, and the harness test with
/// every crash point.
#[test]
fn a_js_tool_made_as_the_guide_says_builds_and_survives_every_crash_point() {
    a_tool_made_as_the_guide_says(&guide_commands(NEW_JS));
}

/// A Python or JavaScript scaffold's commands, run in a fresh directory: `oncebox new` first (what
/// it prints is in the guide), then the rest, which writes `put-item.wasm` and explores it.
fn a_tool_made_as_the_guide_says(commands: &str) {
    let (new, rest) = commands.split_once('\n').expect("more than one line");
    let scratch = tempfile::tempdir().expect("dir");
    the_guide_shows_the_printed_steps(commands, &sh(scratch.path(), new, &[]));
    let report = sh(scratch.path(), rest, &[]);
    assert!(scratch.path().join("put-item/put-item.wasm").is_file(), "{report}");
    // The exploration's verdict, as `oncebox test --explore` prints it: one effect's four crash
    // points and six faults, plus the attempt's record, as for a Rust tool.
    assert!(report.contains("11 scenarios, 0 invariant(s) broken"), "{report}");
}

/// docs/writing-tools.md quotes this test from `let provider` to the count: a host with an
/// in-memory ledger, one component, one step called twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_tested_in_isolation_is_charged_once() -> Result<(), Box<dyn std::error::Error>> {
    let provider = oncebox_example_provider::Provider::start().await?;
    let base = provider.base_url();
    let host = oncebox::Host::builder_in_memory()
        .tool_config("charge", "base_url", &base)
        .grant("charge", oncebox::Grant::Http(base.parse()?)) // nothing is granted by default
        .build()
        .await?;
    host.load(oncebox_artifacts::CHARGE).await?;
    let args = r#"{"order_id": "o-1", "amount_cents": 1200, "currency": "eur", "payment_method": "pm_card_visa"}"#;
    let outcome = host.call(oncebox::Call::step("run-1", "step-1", "charge", args)).await?;
    assert!(outcome.is_completed());
    let again = host.call(oncebox::Call::step("run-1", "step-1", "charge", args)).await?;
    assert!(again.replayed);
    assert_eq!(provider.counts("o-1").payments, 1); // counted where it landed
    Ok(())
}

#[test]
fn the_policy_file_example_loads_and_shows_where_each_value_came_from() {
    let file = root().join("docs/examples/oncebox.toml");
    oncebox::policy_file::PolicyFile::load(&file).expect("the example policy file loads");
    let output = Command::new(env!("CARGO_BIN_EXE_oncebox"))
        .args(["policy", "show", oncebox_artifacts::CHARGE, "--policy", file.to_str().expect("utf8")])
        .env("ONCEBOX_CACHE", Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache"))
        .output()
        .expect("policy show");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(shown.contains("oncebox.toml:"), "policy show names the file's lines: {shown}");
}

/// An MCP server over stdio, as an agent starts it from `mcpServers`.
struct StdioServer {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    log: PathBuf,
}

impl StdioServer {
    fn send(&mut self, message: &Value) {
        writeln!(self.stdin, "{message}").expect("write");
        self.stdin.flush().expect("flush");
    }

    fn answer(&mut self, id: i64) -> Value {
        for line in self.lines.by_ref() {
            let message: Value = serde_json::from_str(&line.expect("read")).expect("a JSON-RPC line");
            if message["id"] == id {
                return message;
            }
        }
        panic!("the server stopped: {}", std::fs::read_to_string(&self.log).unwrap_or_default())
    }
}

impl Drop for StdioServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// docs/examples/mcp-servers.json's stdio server, on a directory laid out as it says, answers
/// docs/examples/tools-call.json: charged once, the same call again replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_configuration_serves_the_documented_call_over_stdio() {
    let provider = oncebox_example_provider::Provider::start().await.expect("provider");
    let config: Value = serde_json::from_str(&read("docs/examples/mcp-servers.json")).expect("JSON");
    let call: Value = serde_json::from_str(&read("docs/examples/tools-call.json")).expect("JSON");
    assert_eq!(config["mcpServers"]["oncebox-http"]["url"], "http://127.0.0.1:7420/mcp", "serve's default address");
    let server = &config["mcpServers"]["oncebox"];
    assert_eq!(server["command"], "oncebox");

    let srv = tempfile::tempdir().expect("dir");
    let at = srv.path().to_str().expect("utf8").to_string();
    std::fs::create_dir(srv.path().join("tools")).expect("tools");
    // charge, and refund, which undoes it: a compensatable tool is served only with its compensation.
    let base = provider.base_url();
    let mut policy = String::new();
    for (tool, component) in [("charge", oncebox_artifacts::CHARGE), ("refund", oncebox_artifacts::REFUND)] {
        std::fs::copy(component, srv.path().join(format!("tools/{tool}.wasm"))).expect("copy");
        policy.push_str(&format!(
            "[tools.{tool}.config]\nbase_url = \"{base}\"\n[tools.{tool}.grants]\nhttp = [\"{base}\"]\n"
        ));
    }
    std::fs::write(srv.path().join("oncebox.toml"), policy).expect("policy");
    let args: Vec<String> = server["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|arg| arg.as_str().expect("a string").replace("/srv", &at))
        .collect();

    let order = call["params"]["arguments"]["order_id"].as_str().expect("order").to_string();
    let log = srv.path().join("serve.log");
    let result = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(env!("CARGO_BIN_EXE_oncebox"))
            .args(&args)
            .env("ONCEBOX_CACHE", Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("oncebox serve --stdio");
        let stdin = child.stdin.take().expect("stdin");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut server = StdioServer { child, stdin, lines, log };
        server.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "docs", "version": "0"}}}));
        let opened = server.answer(1);
        assert!(opened.get("result").is_some(), "{opened}");
        server.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        server.send(&call);
        let first = server.answer(call["id"].as_i64().expect("id"));
        let mut again = call.clone();
        again["id"] = json!(8);
        server.send(&again);
        (first, server.answer(8))
    });
    let (first, again) =
        tokio::time::timeout(std::time::Duration::from_secs(120), result).await.expect("in time").expect("join");
    assert_eq!(first["result"]["_meta"]["oncebox/status"], "completed", "{first}");
    assert_eq!(first["result"]["_meta"]["oncebox/replayed"], false, "{first}");
    assert_eq!(again["result"]["_meta"]["oncebox/status"], "completed", "{again}");
    assert_eq!(again["result"]["_meta"]["oncebox/replayed"], true, "{again}");
    assert_eq!(provider.counts(&order).payments, 1, "charged once");
}
