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
}
