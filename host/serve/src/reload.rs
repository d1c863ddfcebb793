//! The tools directory, watched: a component added, changed or removed is picked up within a
//! second (or at once on SIGHUP). A bad one is reported and skipped; the others go on. A call in
//! flight keeps the component it started with (the host replaces entries whole).
//!
//! A scan compiles every new or changed file at once, each on a blocking thread, before it loads
//! them one by one in file order (so which of two files naming the same tool wins does not
//! depend on which compiled first): a directory of language-runtime tools, seconds each to
//! compile, is ready in the time of the slowest rather than of all of them in turn, and the server
//! answers meanwhile. Until the first scan is over the server is `starting` (`/healthz` names what
//! is compiling) and what needs the tools waits for it ([`Loaded::ready`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use oncebox_runtime::Host;
use oncebox_runtime::ledger::Why;

/// How often the directory is looked at.
pub const SCAN_EVERY: Duration = Duration::from_secs(1);

/// What a file looked like when last loaded (or refused): loaded again only when this changes.
/// The inode and the change time catch a copy that keeps size and mtime (`cp -p`, `rsync -t`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
    changed: i64,
}

#[derive(Debug, Clone)]
struct File {
    seen: Seen,
    /// The tool it holds, if it loaded.
    tool: Option<String>,
    /// Why it did not load, if so.
    error: Option<String>,
    /// Why its compensation does not check, if so (found again after every change).
    unchecked: Option<String>,
}

#[derive(Debug)]
pub struct Loaded {
    dir: PathBuf,
    files: Mutex<BTreeMap<PathBuf, File>>,
    /// The files being compiled now.
    compiling: Mutex<std::collections::BTreeSet<PathBuf>>,
    /// True once the first scan is over.
    scanned: tokio::sync::watch::Sender<bool>,
}

impl Loaded {
    pub fn new(dir: PathBuf) -> Loaded {
        Loaded {
            dir,
            files: Mutex::new(BTreeMap::new()),
            compiling: Mutex::new(std::collections::BTreeSet::new()),
            scanned: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Whether the first scan is over: every tool the directory held at the start is loaded (or
    /// refused, and said why).
    pub fn is_ready(&self) -> bool {
        *self.scanned.borrow()
    }

    /// Resolves once the first scan is over: a call, a listing of the tools, waits for it rather
    /// than be told that a tool still compiling does not exist.
    pub async fn ready(&self) {
        let mut scanned = self.scanned.subscribe();
        // The sender lives as long as `self`, which the caller borrows: `wait_for` cannot fail.
        let _ = scanned.wait_for(|scanned| *scanned).await;
    }

    /// The files being compiled now, by file name.
    pub fn compiling(&self) -> Vec<String> {
        let compiling = self.compiling.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        compiling
            .iter()
            .map(|path| path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned()))
            .collect()
    }

    /// The tools directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Each file that did not load, with why: `[{"file", "error"}]`.
    pub fn errors(&self) -> Vec<serde_json::Value> {
        let files = self.files.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        files
            .iter()
            .filter_map(|(path, file)| {
                file.error
                    .as_ref()
                    .or(file.unchecked.as_ref())
                    .map(|error| serde_json::json!({ "file": path, "error": error }))
            })
            .collect()
    }

    /// Why calls of `tool` are refused although it loaded: its compensation is missing or does
    /// not fit, so what it does could not be undone (the rule `compensate --tools` applies too).
    pub fn unserved(&self, tool: &str) -> Option<String> {
        let files = self.files.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        files
            .values()
            .find(|file| file.tool.as_deref() == Some(tool))
            .and_then(|file| file.unchecked.clone())
            .map(|why| format!("`{tool}` is not served until its compensation loads: {why}"))
    }

    /// Brings the host up to date with the directory: loads what is new or changed, unloads what
    /// is gone, then checks every compensation. `retry` tries the refused files again (SIGHUP).
    /// Returns how many files were looked at again.
    pub async fn scan(&self, host: &Host, retry: bool) -> usize {
        let listed = match list(&self.dir) {
            Ok(listed) => listed,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot read the tools directory");
                // A scan that could not read the directory is over too: what waits for the first
                // one is answered with what is loaded (nothing), not kept waiting for good.
                self.scanned.send_if_modified(|scanned| !std::mem::replace(scanned, true));
                return 0;
            }
        };
        let before = self.files.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        let mut changed = 0;
        for (path, file) in &before {
            if !listed.contains_key(path) {
                changed += 1;
                if let Some(tool) = &file.tool {
                    host.unload(tool);
                    tracing::info!(tool, file = %path.display(), "tool removed");
                }
                self.files.lock().unwrap_or_else(|p| p.into_inner()).remove(path);
            }
        }
        // A file refused before is tried again after any change: the duplicate it clashed with,
        // or the tool it needed, may be gone or come.
        let retry =
            retry || changed > 0 || listed.iter().any(|(path, seen)| before.get(path).is_none_or(|f| f.seen != *seen));
        let unchanged = |path: &PathBuf, seen: &Seen| {
            before.get(path).is_some_and(|file| file.seen == *seen && !(retry && file.error.is_some()))
        };
        let wanted: Vec<PathBuf> =
            listed.iter().filter(|(path, seen)| !unchanged(path, seen)).map(|(path, _)| path.clone()).collect();
        self.compile_all(host, &wanted).await;
        for (path, seen) in listed {
            if unchanged(&path, &seen) {
                continue;
            }
            changed += 1;
            let previous = before.get(&path).and_then(|file| file.tool.clone());
            if let Some(tool) = &previous
                && let Some(reason) = in_doubt(host, tool).await
            {
                tracing::warn!(tool, file = %path.display(), reason, "component not replaced");
                let file = File { seen, tool: previous.clone(), error: Some(reason), unchecked: None };
                self.files.lock().unwrap_or_else(|p| p.into_inner()).insert(path, file);
                continue;
            }
            let file = match host.reload(&path).await {
                Ok(manifest) => {
                    if let Some(old) = previous.filter(|old| *old != manifest.name) {
                        host.unload(&old);
                    }
                    tracing::info!(tool = manifest.name, file = %path.display(), "tool loaded");
                    File { seen, tool: Some(manifest.name), error: None, unchecked: None }
                }
                Err(e) => {
                    // The last good version of a changed file stays loaded: a half-copied or broken
                    // file must not take a working tool away.
                    tracing::warn!(file = %path.display(), error = %e, "component refused; skipped");
                    File { seen, tool: previous, error: Some(e.to_string()), unchecked: None }
                }
            };
            self.files.lock().unwrap_or_else(|p| p.into_inner()).insert(path, file);
        }
        if changed > 0 {
            self.check_compensations(host);
        }
        self.scanned.send_if_modified(|scanned| !std::mem::replace(scanned, true));
        changed
    }

    /// Compiles `paths` into the compile cache, all at once (each on a blocking thread), so that
    /// loading them after is quick. What fails here fails again when it is loaded, and is
    /// reported there.
    async fn compile_all(&self, host: &Host, paths: &[PathBuf]) {
        if paths.is_empty() {
            return;
        }
        let compile = |path: &PathBuf| {
            let path = path.clone();
            async move {
                self.compiling.lock().unwrap_or_else(|p| p.into_inner()).insert(path.clone());
                let started = std::time::Instant::now();
                let compiled = host.compile(&path).await;
                self.compiling.lock().unwrap_or_else(|p| p.into_inner()).remove(&path);
                if let Ok((_, origin)) = compiled {
                    tracing::debug!(file = %path.display(), ?origin, elapsed = ?started.elapsed(), "compiled");
                }
            }
        };
        futures_util::future::join_all(paths.iter().map(compile)).await;
    }

    /// A compensatable tool whose compensation is missing or does not fit is reported, and not
    /// served ([`Loaded::unserved`]): a step it completed could not be undone. It stays loaded, so
    /// its recorded operations are still reconciled and compensated once the compensation loads.
    fn check_compensations(&self, host: &Host) {
        let mut files = self.files.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for file in files.values_mut() {
            file.unchecked = None;
        }
        for (manifest, path) in host.tools() {
            if let Err(e) = host.check_compensation(&manifest)
                && let Some(file) = files.get_mut(&path)
            {
                tracing::warn!(tool = manifest.name, error = %e, "compensation does not check");
                file.unchecked = Some(e.to_string());
            }
        }
    }
}

/// Why `tool` must not be replaced now: an operation of it is in doubt or claimed, and its next
/// attempt must run the component that began it. A new version may label its effects
/// differently, derive other keys, and send anew what the old one may already have sent. The
/// file is tried again at the next change (touch it once they are reconciled).
/// O(open): read from the ledger's index of open work.
async fn in_doubt(host: &Host, tool: &str) -> Option<String> {
    use oncebox_runtime::ledger::OperationStatus;
    let now = host.ledger().now_ms();
    let open = host
        .ledger()
        .open_operations(now, |why| matches!(why, Why::Unknown | Why::InFlight { .. } | Why::Abandoned { .. }));
    let operations = match open.await {
        Ok(operations) => operations,
        Err(e) => {
            return Some(format!(
                "not replaced: cannot read the ledger to see whether `{tool}` has work in doubt: {e}"
            ));
        }
    };
    let open = operations
        .iter()
        .filter(|op| op.tool == tool && matches!(op.status, OperationStatus::Unknown | OperationStatus::Claimed))
        .count();
    (open > 0).then(|| {
        format!(
            "not replaced: {open} operations of `{tool}` are unknown or running, and must finish (or be reconciled) with \
             the component that began them; the old one keeps serving until then"
        )
    })
}

/// The `.wasm` files of `dir` and what each looks like now.
fn list(dir: &Path) -> std::io::Result<BTreeMap<PathBuf, Seen>> {
    let mut listed = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|ext| ext != "wasm") {
            continue;
        }
        if let Ok(meta) = std::fs::metadata(&path) {
            listed.insert(path, seen(&meta));
        }
    }
    Ok(listed)
}

#[cfg(unix)]
fn seen(meta: &std::fs::Metadata) -> Seen {
    use std::os::unix::fs::MetadataExt;
    Seen {
        len: meta.len(),
        modified: meta.modified().ok(),
        inode: meta.ino(),
        changed: meta.ctime_nsec() + meta.ctime() * 1_000_000_000,
    }
}

#[cfg(not(unix))]
fn seen(meta: &std::fs::Metadata) -> Seen {
    Seen { len: meta.len(), modified: meta.modified().ok(), inode: 0, changed: 0 }
}
