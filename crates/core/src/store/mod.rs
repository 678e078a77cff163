//! Key-value stores with torch.distributed's semantics: used for rendezvous and by users.
//!
//! `get` and `wait` block until the keys exist or the timeout passes (then [`Error::Store`]).
//! `add` on a key holding a non-integer value fails. Keys are strings, values bytes.

use std::time::Duration;

use crate::error::Result;

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
