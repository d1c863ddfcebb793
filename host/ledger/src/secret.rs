//! The ledger's fingerprint secret, kept in a file beside the ledger (`LEDGER.key`, mode 0600),
//! never in the ledger itself: whoever holds only the ledger file cannot test guesses of a
//! sensitive arg against its fingerprints. The file holds one hex secret per line, newest first;
//! `oncebox ledger rotate-key` puts a new one in front, and an old line may be deleted once every
//! operation fingerprinted under it has expired (retention). No log, record or output shows one.

use std::io::Write;
use std::path::{Path, PathBuf};

use oncebox_core::keys::{FingerprintKey, SECRET_BYTES};

/// Why the key file could not be used.
#[derive(Debug, thiserror::Error)]
#[error("the ledger's fingerprint key {path}: {reason}")]
pub struct KeyFileError {
    pub path: PathBuf,
    pub reason: String,
}

/// Where the key of the ledger at `ledger` lives.
pub fn beside(ledger: &Path) -> PathBuf {
    let mut name = ledger.as_os_str().to_owned();
    name.push(".key");
    PathBuf::from(name)
}

/// A fresh random key, for a ledger that lives in memory.
pub fn random() -> Result<FingerprintKey, KeyFileError> {
    let secret = fresh_secret(Path::new(":memory:"))?;
    FingerprintKey::new(vec![secret]).ok_or_else(|| KeyFileError { path: ":memory:".into(), reason: "empty".into() })
}

/// Reads the key at `path`, creating it (one random secret, readable by its owner only) if there
/// is no file yet.
pub fn load_or_create(path: &Path) -> Result<FingerprintKey, KeyFileError> {
    let error = |reason: String| KeyFileError { path: path.to_path_buf(), reason };
    match std::fs::read_to_string(path) {
        Ok(text) => FingerprintKey::parse(&text).map_err(error),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = FingerprintKey::new(vec![fresh_secret(path)?]).ok_or_else(|| error("empty".into()))?;
            write_new(path, &key)?;
            Ok(key)
        }
        Err(e) => Err(error(e.to_string())),
    }
}

/// Puts a new secret in front of the key at `path` (written to a temporary file, then renamed,
/// so a crash leaves the old key or the new one, never half of one). Returns the secrets now kept.
pub fn rotate(path: &Path) -> Result<usize, KeyFileError> {
    let key = load_or_create(path)?.rotated(fresh_secret(path)?);
    let temporary = path.with_extension("key.new");
    let _ = std::fs::remove_file(&temporary);
    write_new(&temporary, &key)?;
    std::fs::rename(&temporary, path).map_err(|e| KeyFileError { path: path.to_path_buf(), reason: e.to_string() })?;
    Ok(key.len())
}

fn fresh_secret(path: &Path) -> Result<[u8; SECRET_BYTES], KeyFileError> {
    let mut secret = [0u8; SECRET_BYTES];
    getrandom::fill(&mut secret)
        .map_err(|e| KeyFileError { path: path.to_path_buf(), reason: format!("no randomness: {e}") })?;
    Ok(secret)
}

/// Creates `path` (it must not exist), owner-only where the platform allows, and syncs it.
fn write_new(path: &Path, key: &FingerprintKey) -> Result<(), KeyFileError> {
    let error = |e: std::io::Error| KeyFileError { path: path.to_path_buf(), reason: e.to_string() };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(error)?;
    file.write_all(key.to_text().as_bytes()).map_err(error)?;
    file.sync_all().map_err(error)
}
