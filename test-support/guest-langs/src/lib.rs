//! Tools written in Python and JavaScript, built exactly as their authors build them, for the
//! tests and the bench:
//!
//! - Python: a venv with the SDK pip-installed from `guest-sdk/python` (which brings
//!   componentize-py from PyPI), then `python -m oncebox_tool build` in the tool's directory;
//! - JavaScript: `npm ci` in the tool's directory (the SDK is a `file:` dependency, copied in with
//!   componentize-js and esbuild from npm), then `npm run build`.
//!
//! Toolchains are installed on first use under `work` (a venv) or in the project (its
//! `node_modules`, ignored by git). A component is built again only when its project or its SDK
//! changed: each built one is kept in `work` under a hash of both.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    Python,
    Js,
}

impl Lang {
    fn sdk(self) -> PathBuf {
        root().join(match self {
            Lang::Python => "guest-sdk/python",
            Lang::Js => "guest-sdk/js",
        })
    }
}

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The project at `dir` (relative to the repository's root) built to a component, at a path under
/// `work` that names its contents. Builds one at a time: two builds would share a venv or a
/// project's `node_modules`.
pub fn build(lang: Lang, dir: &str, work: &Path) -> anyhow::Result<PathBuf> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    // The builds run in the project's directory: a relative `work` would mean something else there.
    let work = &std::path::absolute(work).with_context(|| format!("{}", work.display()))?;
    let project = root().join(dir);
    let sdk = fingerprint(&lang.sdk())?;
    let name = dir.rsplit('/').next().unwrap_or(dir);
    let built = work.join(format!("{name}-{}.wasm", &fingerprint_with(&project, &sdk)?[..16]));
    if built.exists() {
        return Ok(built);
    }
    std::fs::create_dir_all(work).with_context(|| format!("create {}", work.display()))?;
    let output = match lang {
        Lang::Python => {
            let python = python(work, &sdk)?;
            run(Command::new(&python).args(["-m", "oncebox_tool", "build"]).current_dir(&project))?;
            project.join(setting(&project.join("pyproject.toml"), "output")?)
        }
        Lang::Js => {
            let stamp = project.join("node_modules/.oncebox-sdk");
            if std::fs::read_to_string(&stamp).ok().as_deref() != Some(sdk.as_str()) {
                // A fresh copy of the SDK as it is now: `npm ci` copies it in (`install-links`).
                run(Command::new("npm").args(["ci", "--no-audit", "--no-fund"]).current_dir(&project))?;
                std::fs::write(&stamp, &sdk)?;
            }
            run(Command::new("npm").args(["run", "--silent", "build"]).current_dir(&project))?;
            project.join(setting(&project.join("package.json"), "output")?)
        }
    };
    std::fs::copy(&output, &built).with_context(|| format!("copy {} to {}", output.display(), built.display()))?;
    Ok(built)
}

/// The venv's python, with the SDK as it is now installed in it.
fn python(work: &Path, sdk: &str) -> anyhow::Result<PathBuf> {
    let venv = work.join("py-venv");
    let python = venv.join("bin/python");
    let stamp = venv.join("oncebox-sdk");
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(sdk) {
        let sdk_dir = Lang::Python.sdk();
        run(Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .arg(&sdk_dir))?;
        // The SDK's own version does not change with its files: put the files there as they are.
        run(Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--force-reinstall", "--no-deps"])
            .arg(&sdk_dir))?;
        std::fs::write(&stamp, sdk)?;
    }
    Ok(python)
}

/// `"output"`'s value in a pyproject.toml's `[tool.oncebox]` or a package.json's `"oncebox"`: the
/// one line that sets it, read without a parser of either format.
fn setting(file: &Path, key: &str) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
    let line = text
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with(key) || line.starts_with(&format!("\"{key}\"")))
        .with_context(|| format!("{}: no `{key}` setting", file.display()))?;
    let value = line.split(['=', ':']).nth(1).unwrap_or_default();
    Ok(value.trim().trim_end_matches(',').trim_matches('"').to_string())
}

fn run(command: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{command:?}");
    let output = command.output().with_context(|| format!("cannot run {shown}"))?;
    if !output.status.success() {
        bail!(
            "{shown} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// A hash of every source file under `dir` (not what installs and builds leave there).
fn fingerprint(dir: &Path) -> anyhow::Result<String> {
    fingerprint_with(dir, "")
}

fn fingerprint_with(dir: &Path, salt: &str) -> anyhow::Result<String> {
    let mut files = Vec::new();
    collect(dir, &mut files)?;
    files.sort();
    let mut hash = Sha256::new();
    hash.update(salt);
    for file in files {
        hash.update(file.strip_prefix(dir).unwrap_or(&file).to_string_lossy().as_bytes());
        hash.update(std::fs::read(&file).with_context(|| format!("read {}", file.display()))?);
    }
    Ok(hex::encode(hash.finalize()))
}

const NOT_SOURCES: [&str; 4] = ["node_modules", "__pycache__", ".venv", "tests"];

fn collect(dir: &Path, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if path.is_dir() {
            if !NOT_SOURCES.contains(&name.as_str()) {
                collect(&path, files)?;
            }
        } else if !name.ends_with(".wasm") {
            files.push(path);
        }
    }
    Ok(())
}
