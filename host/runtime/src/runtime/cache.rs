//! Compiled components, so a component is compiled once: first an in-process cache (every host in
//! the process shares the engine), then, when the host has a cache directory, a file per component
//! on disk, so that the next process loads it in milliseconds instead of compiling it again.
//!
//! A disk entry is named by the component's SHA-256 and a hash of the engine's settings and
//! version (wasmtime's `precompile_compatibility_hash`), so another engine never reads it. Its
//! first 32 bytes are the SHA-256 of the rest: an entry that does not match (a torn write, a bit
//! flip, a truncated file) or that wasmtime refuses is compiled again and rewritten, never used.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Beyond this many distinct components the in-process cache starts over rather than grow
/// without bound.
const MAX_IN_MEMORY: usize = 256;

/// Where a component came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// This process had compiled or read it already.
    Memory,
    /// The cache directory's entry.
    Disk,
    /// Compiled now.
    Compiled,
}

/// The component for `bytes`: from memory, from `dir`, or compiled (and then stored in both).
/// It compiles on the calling thread, using every core (wasmtime's parallel compilation): call
/// it where blocking is allowed.
pub fn component(engine: &Engine, bytes: &[u8], dir: Option<&Path>) -> wasmtime::Result<(Component, Origin)> {
    static MEMORY: OnceLock<Mutex<HashMap<[u8; 32], Component>>> = OnceLock::new();
    let memory = MEMORY.get_or_init(Default::default);
    let digest: [u8; 32] = Sha256::digest(bytes).into();
    let file = dir.map(|dir| dir.join(entry_name(engine, &digest)));
    if let Some(component) = memory.lock().unwrap_or_else(|p| p.into_inner()).get(&digest).cloned() {
        // Compiled by a host without this directory: give the next process its entry too.
        if let Some(file) = file.as_deref().filter(|file| !file.exists()) {
            write(&component, file);
        }
        return Ok((component, Origin::Memory));
    }
    let (component, origin) = match file.as_deref().and_then(|file| read(engine, file)) {
        Some(component) => (component, Origin::Disk),
        None => {
            let component = Component::new(engine, bytes)?;
            if let Some(file) = &file {
                write(&component, file);
            }
            (component, Origin::Compiled)
        }
    };
    let mut memory = memory.lock().unwrap_or_else(|p| p.into_inner());
    if memory.len() >= MAX_IN_MEMORY {
        memory.clear();
    }
    memory.insert(digest, component.clone());
    Ok((component, origin))
}

fn entry_name(engine: &Engine, digest: &[u8; 32]) -> String {
    let mut settings = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut settings);
    format!("{}-{:016x}.cwasm", hex::encode(digest), settings.finish())
}

/// A verified entry, or `None` (missing, corrupt, or refused by wasmtime) after saying why.
fn read(engine: &Engine, file: &Path) -> Option<Component> {
    let bytes = std::fs::read(file).ok()?;
    let verified = bytes.split_at_checked(32).filter(|(sum, payload)| Sha256::digest(payload).as_slice() == *sum);
    let Some((_, payload)) = verified else {
        tracing::warn!(file = %file.display(), "the compiled-component cache entry is corrupt; compiling again");
        return None;
    };
    // SAFETY: wasmtime requires that the bytes come from `Component::serialize` of a compatible
    // engine. This file is named for this engine's settings, was written by `write` below from
    // `serialize`, and its checksum shows it is byte for byte what was written. The cache directory
    // is the operator's, trusted like the ledger (SECURITY.md).
    #[allow(unsafe_code)]
    let component = unsafe { Component::deserialize(engine, payload) };
    match component {
        Ok(component) => {
            tracing::debug!(file = %file.display(), "compiled component loaded from the disk cache");
            Some(component)
        }
        Err(e) => {
            tracing::warn!(file = %file.display(), error = %e, "wasmtime refused a cache entry; compiling again");
            None
        }
    }
}

/// Stores an entry through a temporary file and a rename, so a reader sees all of it or none.
/// A cache that cannot be written only costs the next process a compile: logged, not an error.
fn write(component: &Component, file: &Path) {
    let result = (|| -> Result<(), String> {
        let payload = component.serialize().map_err(|e| e.to_string())?;
        let dir = file.parent().ok_or("no directory")?;
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let mut entry = Sha256::digest(&payload).to_vec();
        entry.extend_from_slice(&payload);
        let temp = PathBuf::from(format!("{}.{}.tmp", file.display(), std::process::id()));
        std::fs::write(&temp, &entry).map_err(|e| e.to_string())?;
        std::fs::rename(&temp, file).map_err(|e| e.to_string())
    })();
    if let Err(e) = result {
        tracing::warn!(file = %file.display(), error = %e, "cannot write the compiled-component cache");
    }
}
