//! Sealed values: what a person must see and the ledger must not hold in the clear (the sensitive
//! params of a call awaiting approval, such as a shipping address). Sealed with
//! ChaCha20-Poly1305 under a key derived from the ledger's key file (`secret.rs`, mode 0600,
//! beside the ledger), bound to the operation key: whoever holds only the ledger file, a backup or
//! a log cannot read them, and a sealed value moved to another operation does not open. Whoever
//! holds the key file (the operator, `oncebox approvals show --reveal`) can. Pure, but for the
//! nonce the caller draws.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};

use oncebox_core::keys::FingerprintKey;

/// The nonce length of ChaCha20-Poly1305.
pub const NONCE_BYTES: usize = 12;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    #[error("the sealed value is not in the `v1:NONCE:CIPHERTEXT` form")]
    Malformed,
    #[error("no key in the key file opens the sealed value (another ledger's, or its secret was deleted)")]
    NoKey,
    #[error("the value is too long to seal")]
    TooLong,
    #[error("no randomness to seal with: {0}")]
    NoRandomness(String),
}

/// Seals `plaintext` for `operation_key` under the newest key, with a fresh random `nonce`.
pub fn seal(
    key: &FingerprintKey,
    operation_key: &str,
    plaintext: &[u8],
    nonce: [u8; NONCE_BYTES],
) -> Result<String, SealError> {
    let sealing = key.sealing_keys()[0];
    let cipher = ChaCha20Poly1305::new(Key::from_slice(&sealing));
    let payload = Payload { msg: plaintext, aad: operation_key.as_bytes() };
    // Encryption fails only for a message over 256 GiB; args are bounded far below that.
    let ciphertext = cipher.encrypt(Nonce::from_slice(&nonce), payload).map_err(|_| SealError::TooLong)?;
    Ok(format!("v1:{}:{}", hex::encode(nonce), hex::encode(ciphertext)))
}

/// Opens what [`seal`] sealed for `operation_key`, under any of the key file's secrets (a
/// rotation keeps the older ones).
pub fn open(key: &FingerprintKey, operation_key: &str, sealed: &str) -> Result<Vec<u8>, SealError> {
    let mut parts = sealed.splitn(3, ':');
    let (Some("v1"), Some(nonce), Some(ciphertext)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(SealError::Malformed);
    };
    let nonce: [u8; NONCE_BYTES] =
        hex::decode(nonce).ok().and_then(|n| n.try_into().ok()).ok_or(SealError::Malformed)?;
    let ciphertext = hex::decode(ciphertext).map_err(|_| SealError::Malformed)?;
    for sealing in key.sealing_keys() {
        let cipher = ChaCha20Poly1305::new(Key::from_slice(&sealing));
        let payload = Payload { msg: &ciphertext, aad: operation_key.as_bytes() };
        if let Ok(plaintext) = cipher.decrypt(Nonce::from_slice(&nonce), payload) {
            return Ok(plaintext);
        }
    }
    Err(SealError::NoKey)
}

/// A text that may hold a sensitive value of its operation's args (a downstream's answer that
/// echoes the address it was sent), as the ledger keeps it: masked for every reader (the rule is
/// `oncebox_core::redact::mask_text`), and, only when masking changed it, whole and sealed for the
/// one reader that needs it exactly (the guest, on a replay). No secrets, no work (and no nonce).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// What any view shows and the ledger holds in the clear.
    pub masked: String,
    /// The exact text, sealed for the operation ([`seal`]); `None` when the text held no secret.
    pub sealed: Option<String>,
}

/// Masks `text` of the operation `operation_key` against `secrets` and seals the exact text when
/// that changed it. `nonce` is asked for only then.
pub fn keep(
    key: &FingerprintKey,
    operation_key: &str,
    text: &str,
    secrets: &[String],
    nonce: impl FnOnce() -> Result<[u8; NONCE_BYTES], SealError>,
) -> Result<Kept, SealError> {
    match oncebox_core::redact::mask_text(text, secrets) {
        None => Ok(Kept { masked: text.to_string(), sealed: None }),
        Some(masked) => Ok(Kept { masked, sealed: Some(seal(key, operation_key, text.as_bytes(), nonce()?)?) }),
    }
}

/// The exact text [`keep`] kept: the sealed one opened, or the text itself when nothing was sealed.
pub fn exact(key: &FingerprintKey, operation_key: &str, text: &str, sealed: Option<&str>) -> Result<String, SealError> {
    match sealed {
        None => Ok(text.to_string()),
        Some(sealed) => String::from_utf8(open(key, operation_key, sealed)?).map_err(|_| SealError::Malformed),
    }
}

/// The values at `pointers` in `args` (the manifest's sensitive ones), sealed for the operation
/// as one JSON object keyed by pointer: `None` when the args hold none. `nonce` is asked for only
/// then. What a request for approval keeps for the approver, and an operation for the host.
pub fn seal_params(
    key: &FingerprintKey,
    operation_key: &str,
    args: &serde_json::Value,
    pointers: &[String],
    nonce: impl FnOnce() -> Result<[u8; NONCE_BYTES], SealError>,
) -> Result<Option<String>, SealError> {
    let values: serde_json::Map<String, serde_json::Value> =
        pointers.iter().filter_map(|pointer| args.pointer(pointer).map(|v| (pointer.clone(), v.clone()))).collect();
    if values.is_empty() {
        return Ok(None);
    }
    let plaintext = serde_json::Value::Object(values).to_string();
    seal(key, operation_key, plaintext.as_bytes(), nonce()?).map(Some)
}

/// What [`seal_params`] sealed: each sensitive value by its pointer.
pub fn open_values(
    key: &FingerprintKey,
    operation_key: &str,
    sealed: &str,
) -> Result<serde_json::Map<String, serde_json::Value>, SealError> {
    serde_json::from_slice(&open(key, operation_key, sealed)?).map_err(|_| SealError::Malformed)
}

/// `redacted` (args as a record keeps them) with the values [`seal_params`] sealed put back at
/// their pointers: the exact args.
pub fn open_params(
    key: &FingerprintKey,
    operation_key: &str,
    redacted: &serde_json::Value,
    sealed: &str,
) -> Result<serde_json::Value, SealError> {
    let values = open_values(key, operation_key, sealed)?;
    let mut args = redacted.clone();
    for (pointer, value) in values {
        if let Some(slot) = args.pointer_mut(&pointer) {
            *slot = value;
        }
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> FingerprintKey {
        FingerprintKey::new(vec![[byte; 32]]).expect("one secret")
    }

    #[test]
    fn a_sealed_value_opens_with_its_key_and_operation_only() {
        let sealed = seal(&key(1), "op-1", b"1 Main St", [7; NONCE_BYTES]).expect("sealed");
        assert!(!sealed.contains("Main"), "{sealed}");
        assert_eq!(open(&key(1), "op-1", &sealed), Ok(b"1 Main St".to_vec()));
        assert_eq!(open(&key(2), "op-1", &sealed), Err(SealError::NoKey));
        assert_eq!(open(&key(1), "op-2", &sealed), Err(SealError::NoKey), "bound to its operation");
        assert_eq!(open(&key(1), "op-1", "v1:zz:00"), Err(SealError::Malformed));
    }

    #[test]
    fn a_value_sealed_before_a_rotation_still_opens() {
        let sealed = seal(&key(1), "op", b"x", [0; NONCE_BYTES]).expect("sealed");
        let rotated = key(1).rotated([9; 32]);
        assert_eq!(open(&rotated, "op", &sealed), Ok(b"x".to_vec()));
        let tampered = format!("{}0", &sealed[..sealed.len() - 1]);
        assert!(open(&key(1), "op", &tampered).is_err());
    }

    #[test]
    fn a_kept_text_is_masked_and_its_exact_text_opens_for_its_operation() {
        let secrets = vec!["1 Main St".to_string()];
        let answer = r#"{"id":"shp_1","address":"1 Main St"}"#;
        let kept = keep(&key(1), "op-1", answer, &secrets, || Ok([3; NONCE_BYTES])).expect("kept");
        assert_eq!(kept.masked, r#"{"address":"[redacted]","id":"shp_1"}"#);
        let sealed = kept.sealed.as_deref().expect("sealed");
        assert!(!sealed.contains("Main"), "{sealed}");
        assert_eq!(exact(&key(1), "op-1", &kept.masked, Some(sealed)).as_deref(), Ok(answer), "exact, byte for byte");
        assert_eq!(exact(&key(1), "op-2", &kept.masked, Some(sealed)), Err(SealError::NoKey));
        // Nothing to mask: kept as it is, nothing sealed, no nonce drawn.
        let plain = keep(&key(1), "op-1", r#"{"id":"shp_1"}"#, &secrets, || Err(SealError::TooLong)).expect("kept");
        assert_eq!((plain.masked.as_str(), plain.sealed), (r#"{"id":"shp_1"}"#, None));
        assert_eq!(exact(&key(1), "op-1", "x", None).as_deref(), Ok("x"));
    }

    #[test]
    fn sealed_params_open_back_into_the_redacted_args() {
        let args = serde_json::json!({"order_id": "o-1", "card": {"number": "4242"}, "pin": 1234});
        let pointers = vec!["/card".to_string(), "/pin".to_string(), "/missing".to_string()];
        let sealed = seal_params(&key(1), "op", &args, &pointers, || Ok([5; NONCE_BYTES])).expect("sealed");
        let sealed = sealed.expect("there are sensitive values");
        assert!(!sealed.contains("4242"), "{sealed}");
        let redacted = oncebox_core::redact::redact(&args, &pointers);
        assert_eq!(open_params(&key(1), "op", &redacted, &sealed), Ok(args.clone()));
        assert_eq!(open_params(&key(1), "other", &redacted, &sealed), Err(SealError::NoKey));
        let none = seal_params(&key(1), "op", &args, &["/nothing".to_string()], || Err(SealError::TooLong));
        assert_eq!(none, Ok(None), "nothing sensitive: nothing sealed, no nonce drawn");
    }
}
