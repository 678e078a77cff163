//! Key-value stores with torch.distributed's semantics: used for rendezvous and by users.
//!
//! `get` and `wait` block until the keys exist or the timeout passes (then [`Error::Store`]).
//! `add` on a key holding a non-integer value fails with [`Error::Store`] naming the key.
//! Keys are strings, values bytes; `add` stores its counter as decimal ASCII, as torch does.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

mod codec;
pub mod file;
pub mod hash;
pub mod prefix;
pub mod tcp;

pub use file::FileStore;
pub use hash::HashStore;
pub use prefix::PrefixStore;
pub use tcp::{TcpStore, TcpStoreOptions};

/// torch's default store timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The store interface shared by every implementation (and by a Python-defined store in the
/// binding crate).
pub trait Store: Send + Sync {
    /// Sets `key` to `value`, replacing any value.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Returns the value of `key`, waiting until it exists; `None` uses the store's timeout.
    fn get(&self, key: &str, timeout: Option<Duration>) -> Result<Vec<u8>>;
    /// Adds `delta` to the integer at `key` (0 if absent) and returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
    /// Appends `value` to `key`, creating it if absent.
    fn append(&self, key: &str, value: &[u8]) -> Result<()>;
    /// True when every key exists, without waiting.
    fn check(&self, keys: &[String]) -> Result<bool>;
    /// torch semantics: sets `desired` when the current value equals `expected`, or when the key
    /// is absent and `expected` is empty; returns the value now held (or `expected` when the key
    /// is absent and nothing was set).
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>>;
    /// Deletes `key`; true when it existed.
    fn delete_key(&self, key: &str) -> Result<bool>;
    /// `get` of several keys, waiting for all of them.
    fn multi_get(&self, keys: &[String], timeout: Option<Duration>) -> Result<Vec<Vec<u8>>>;
    /// `set` of several keys at once.
    fn multi_set(&self, keys: &[String], values: &[Vec<u8>]) -> Result<()>;
    /// Number of keys held.
    fn num_keys(&self) -> Result<i64>;
    /// Waits until every key exists; `None` uses the store's timeout.
    fn wait(&self, keys: &[String], timeout: Option<Duration>) -> Result<()>;
    /// The default timeout of blocking calls.
    fn timeout(&self) -> Duration;
    fn set_timeout(&self, timeout: Duration);
}

/// `now + timeout`, saturating (a timeout of `Duration::MAX` means "practically never").
pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now)
}

/// The error of a `get`/`wait` whose keys did not all appear within `timeout`, in torch's
/// TCPStore words ("wait timeout after 300ms, keys: a, b"; torch also shows its internal "/"
/// before each key).
pub(crate) fn wait_timeout_error(missing: &[String], timeout: Duration) -> Error {
    Error::store(format!(
        "wait timeout after {}ms, keys: {}",
        timeout.as_millis(),
        missing.join(", ")
    ))
}

/// The counter held at `key`, as `add` reads it (absent: 0).
pub(crate) fn parse_counter(key: &str, value: Option<&[u8]>) -> Result<i64> {
    let Some(value) = value else { return Ok(0) };
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .ok_or_else(|| {
            Error::store(format!(
                "add: key {key:?} holds a non-integer value ({:?})",
                String::from_utf8_lossy(&value[..value.len().min(64)])
            ))
        })
}

/// `parse_counter(key, value) + delta`, checked for overflow.
pub(crate) fn added(key: &str, value: Option<&[u8]>, delta: i64) -> Result<i64> {
    parse_counter(key, value)?
        .checked_add(delta)
        .ok_or_else(|| Error::store(format!("add: key {key:?} overflows i64")))
}

/// torch's compare_set on one slot: the new value to store (if any) and the value to return.
pub(crate) fn compare_set_outcome(
    current: Option<&[u8]>,
    expected: &[u8],
    desired: &[u8],
) -> (Option<Vec<u8>>, Vec<u8>) {
    match current {
        None if expected.is_empty() => (Some(desired.to_vec()), desired.to_vec()),
        None => (None, expected.to_vec()),
        Some(cur) if cur == expected => (Some(desired.to_vec()), desired.to_vec()),
        Some(cur) => (None, cur.to_vec()),
    }
}

/// Checks that `multi_set` got as many values as keys.
pub(crate) fn check_multi_set(keys: &[String], values: &[Vec<u8>]) -> Result<()> {
    if keys.len() == values.len() {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "multi_set: {} keys but {} values",
            keys.len(),
            values.len()
        )))
    }
}
