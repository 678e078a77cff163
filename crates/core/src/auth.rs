//! Shared-secret authentication of TCP connections (`RUSTDIST_AUTH_KEY`).
//!
//! When the key is set, every TCP store connection and every peer connection of a process group
//! starts with a mutual challenge-response: each side sends a fresh random nonce and proves it
//! holds the key with an HMAC-SHA256 over both nonces (and, for peers, the hello), under a label
//! naming its role so that one side's proof can never be replayed as the other's. Nothing else
//! is accepted on a connection before that. Tags are compared in constant time.

use std::fmt;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{Error, Result};

/// The environment variable holding the shared secret (unset or empty: no authentication).
pub const AUTH_KEY_ENV: &str = "RUSTDIST_AUTH_KEY";
/// Bytes of a challenge nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of an HMAC-SHA256 tag.
pub const TAG_LEN: usize = 32;

pub type Nonce = [u8; NONCE_LEN];
pub type Tag = [u8; TAG_LEN];

/// The shared secret. Its `Debug` output never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthKey(Arc<[u8]>);

impl fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuthKey(<redacted>)")
    }
}

impl AuthKey {
    /// A key from raw bytes; `None` for an empty one (which would authenticate nothing).
    pub fn new(secret: &[u8]) -> Option<AuthKey> {
        (!secret.is_empty()).then(|| AuthKey(secret.into()))
    }

    /// The key in `RUSTDIST_AUTH_KEY` (its raw bytes, any encoding), if set and non-empty.
    pub fn from_env() -> Option<AuthKey> {
        use std::os::unix::ffi::OsStrExt;
        std::env::var_os(AUTH_KEY_ENV).and_then(|v| AuthKey::new(v.as_bytes()))
    }

    fn mac(&self, label: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
        // HMAC accepts keys of any length, so this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        // Length-prefixed fields: no two different inputs hash the same bytes.
        for field in std::iter::once(label).chain(parts.iter().copied()) {
            mac.update(&(field.len() as u64).to_le_bytes());
            mac.update(field);
        }
        mac
    }

    /// HMAC-SHA256 of `label` and `parts` under this key.
    pub fn tag(&self, label: &[u8], parts: &[&[u8]]) -> Tag {
        self.mac(label, parts).finalize().into_bytes().into()
    }

    /// Whether `tag` is this key's tag of `label` and `parts`, compared in constant time.
    pub fn verify(&self, label: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
        self.mac(label, parts).verify_slice(tag).is_ok()
    }
}

/// A fresh random challenge from the operating system.
pub fn nonce() -> Result<Nonce> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::getrandom(&mut n)
        .map_err(|e| Error::network(format!("cannot draw a random challenge: {e}")))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_bind_key_label_and_fields() {
        let k = AuthKey::new(b"secret").unwrap();
        let t = k.tag(b"role", &[b"ab", b"c"]);
        assert!(k.verify(b"role", &[b"ab", b"c"], &t));
        assert!(!k.verify(b"other role", &[b"ab", b"c"], &t));
        assert!(
            !k.verify(b"role", &[b"a", b"bc"], &t),
            "fields are length-prefixed"
        );
        assert!(!k.verify(b"role", &[b"ab", b"c"], &t[..31]));
        let other = AuthKey::new(b"secreT").unwrap();
        assert!(!other.verify(b"role", &[b"ab", b"c"], &t));
        assert!(AuthKey::new(b"").is_none());
        assert_eq!(format!("{k:?}"), "AuthKey(<redacted>)");
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }
}
