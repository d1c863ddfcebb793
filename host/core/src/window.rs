//! Windows: named moments inside a synchronous function of a store, between two of its reads or
//! writes, where another thread of a host could finish its own work (a decision committed and its
//! mark dropped while a claim holds an open snapshot). A production host never stops there.
//!
//! Built with the `simulate` feature (the runtime's `harness` turns it on; no host is built with
//! it), a process may install one watcher ([`watch`]), called at each window reached: the
//! whole-system simulator (`sim/`) uses it to let a decision it holds back finish exactly there,
//! so that races inside the store happen on a schedule a seed fixes, not only when threads
//! happen to meet. Without the feature [`at`] is empty and compiles away.

/// Where a store is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Window {
    /// A claim of an operation has opened its read snapshot (its claims lock held) and has not
    /// yet judged what it reads: a decision that commits now is not in the snapshot.
    ClaimSnapshot,
    /// A decision on a request for approval is marked as being decided and not yet handed to
    /// the store's writer: a claim that starts now must see the mark.
    DecisionMarked,
    /// A decision is written (committed), and its mark not yet dropped: the task that wrote it
    /// has not resumed. Another decision on the request may be marked meanwhile.
    DecisionWritten,
}

/// The watcher installed, when one is.
#[cfg(feature = "simulate")]
static WATCHER: std::sync::OnceLock<fn(Window, &str)> = std::sync::OnceLock::new();

/// The store reached `window` for operation `key`.
#[inline(always)]
pub fn at(window: Window, key: &str) {
    #[cfg(feature = "simulate")]
    if let Some(watcher) = WATCHER.get() {
        watcher(window, key);
    }
    #[cfg(not(feature = "simulate"))]
    let _ = (window, key);
}

/// Makes `watcher` this process's, called at every later window reached (on whatever thread
/// reaches it). Refused (`false`) once one was installed.
#[cfg(feature = "simulate")]
#[doc(hidden)]
pub fn watch(watcher: fn(Window, &str)) -> bool {
    WATCHER.set(watcher).is_ok()
}
