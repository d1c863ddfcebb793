//! Provider-wide settings: how faithfully the provider keeps its idempotency
//! promises.
//!
//! The defaults are an ideal downstream: keys deduplicate forever and a lookup
//! by key sees a commit the moment it happens. Real downstreams are worse, and a
//! client that is correct only against the ideal one is not correct. These
//! settings take the promises away one by one, so tests can show that the client
//! never turns "maybe happened" into "failed" or into a second commit it could
//! have avoided.

use serde::{Deserialize, Serialize};

/// How the provider treats `Idempotency-Key`s. Set with
/// [`ProviderHandle::configure`](crate::ProviderHandle::configure) or `POST /settings`.
///
/// On the wire every field is optional and takes its default when omitted, so
/// `POST /settings {}` restores the ideal provider; unknown fields are refused,
/// so a misspelt setting is not silently ignored:
/// `{"honour_keys": false, "lookup_by_key": true, "key_retention_ms": null, "lookup_lag_ms": 0}`.
///
/// Settings apply to requests from the moment they are set; commits made
/// earlier keep their keys, and are looked up under the settings of the lookup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Whether a key deduplicates: a resend with a completed key gets the first
    /// response replayed (`Idempotent-Replayed: true`), a concurrent one 409, a
    /// reused one 400. When `false` the key is ignored for all of that, as most
    /// APIs ignore it, and every request commits afresh. Default `true`.
    pub honour_keys: bool,
    /// Whether `GET /{route}/by-key/{key}` finds commits. This works whether or
    /// not keys are honoured: a downstream may look requests up by a client
    /// reference it does not deduplicate on (when several commits arrived with the
    /// same key, the latest is found). With both flags `false` the provider has no
    /// key support at all. Default `true`.
    pub lookup_by_key: bool,
    /// How long a key is kept after its commit, in milliseconds; `None` keeps it
    /// forever. Once forgotten, a resend with the key commits again and a lookup
    /// by it answers 404, as when a real API's key window has passed. Default `None`.
    pub key_retention_ms: Option<u64>,
    /// How long after a commit a lookup by its key still answers 404, in
    /// milliseconds: a lookup index that lags behind the writes. Deduplication
    /// is not affected. Default 0.
    pub lookup_lag_ms: u64,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings { honour_keys: true, lookup_by_key: true, key_retention_ms: None, lookup_lag_ms: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn omitted_fields_take_their_defaults_and_unknown_ones_are_refused() {
        let empty: Result<Settings, _> = serde_json::from_str("{}");
        assert_eq!(empty.ok(), Some(Settings::default()));

        let some: Result<Settings, _> = serde_json::from_str(r#"{"honour_keys": false, "key_retention_ms": 300}"#);
        let expected = Settings { honour_keys: false, key_retention_ms: Some(300), ..Settings::default() };
        assert_eq!(some.ok(), Some(expected));

        let typo: Result<Settings, _> = serde_json::from_str(r#"{"honor_keys": false}"#);
        assert!(typo.is_err(), "a misspelt setting must not be ignored");
    }
}
