//! `[reconciler]`: how a server asks again about operations whose outcome is unknown.
//!
//! ```toml
//! [reconciler]
//! enabled = true     # `oncebox serve` runs it (the default)
//! first = "1s"       # the first try, this long after the operation is found unknown
//! max = "5m"         # the wait doubles from `first` up to this
//! every = "2s"       # how often the ledger is read for new unknowns
//! ```
//!
//! A try is a lookup at the downstream by effect key under the rule of evidence; it never sends
//! the effect. The file has no `[reconciler]`: the defaults above.

use serde::Deserialize;
use toml::{Spanned, Value};

use super::{Lines, PolicyError, ordered};
use crate::reconcile_schedule::Settings;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReconciler {
    enabled: Option<Spanned<Value>>,
    first: Option<Spanned<Value>>,
    max: Option<Spanned<Value>>,
    every: Option<Spanned<Value>>,
}

impl Lines<'_> {
    pub(super) fn reconciler(&self, raw: Option<RawReconciler>) -> Result<Settings, PolicyError> {
        let mut settings = Settings::default();
        let Some(raw) = raw else {
            return Ok(settings);
        };
        if let Some(value) = raw.enabled {
            settings.enabled = self.boolean("enabled", value)?.value;
        }
        // Zero is refused: a zero wait would ask a downstream as often as the host can.
        let first = raw.first.map(|v| self.positive("first", v)).transpose()?;
        let max = raw.max.map(|v| self.positive("max", v)).transpose()?;
        ordered(self.path, ("first", first), ("max", max))?;
        if let Some(at) = first {
            settings.first = at.value;
        }
        if let Some(at) = max {
            settings.max = at.value;
        }
        // One given against the other's default: name the line that was written.
        if settings.first > settings.max {
            let line = first.or(max).map_or(1, |at| at.line);
            return Err(PolicyError::Invalid {
                path: self.path.to_path_buf(),
                line,
                reason: format!(
                    "[reconciler] `first` ({}) exceeds `max` ({}, its default filled in)",
                    humantime::format_duration(settings.first),
                    humantime::format_duration(settings.max)
                ),
            });
        }
        if let Some(value) = raw.every {
            settings.every = self.positive("every", value)?.value;
        }
        Ok(settings)
    }
}
