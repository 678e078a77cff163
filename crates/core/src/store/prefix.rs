//! `PrefixStore`: a namespace inside another store (`key` becomes `prefix + "/" + key`).

use std::sync::Arc;
use std::time::Duration;

use super::Store;
use crate::error::Result;

/// torch's `PrefixStore`. `num_keys`, `timeout` and `set_timeout` are those of the underlying
/// store, as in torch.
pub struct PrefixStore {
    prefix: String,
    inner: Arc<dyn Store>,
}

impl PrefixStore {
    pub fn new(prefix: impl Into<String>, inner: Arc<dyn Store>) -> Self {
        PrefixStore {
            prefix: prefix.into(),
            inner,
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn underlying(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    fn key(&self, key: &str) -> String {
        format!("{}/{}", self.prefix, key)
    }

    fn keys(&self, keys: &[String]) -> Vec<String> {
        keys.iter().map(|k| self.key(k)).collect()
    }
}

impl Store for PrefixStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(&self.key(key), value)
    }
    fn get(&self, key: &str, timeout: Option<Duration>) -> Result<Vec<u8>> {
        self.inner.get(&self.key(key), timeout)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.inner.add(&self.key(key), delta)
    }
    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.append(&self.key(key), value)
    }
    fn check(&self, keys: &[String]) -> Result<bool> {
        self.inner.check(&self.keys(keys))
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.inner.compare_set(&self.key(key), expected, desired)
    }
    fn delete_key(&self, key: &str) -> Result<bool> {
        self.inner.delete_key(&self.key(key))
    }
    fn multi_get(&self, keys: &[String], timeout: Option<Duration>) -> Result<Vec<Vec<u8>>> {
        self.inner.multi_get(&self.keys(keys), timeout)
    }
    fn multi_set(&self, keys: &[String], values: &[Vec<u8>]) -> Result<()> {
        self.inner.multi_set(&self.keys(keys), values)
    }
    fn num_keys(&self) -> Result<i64> {
        self.inner.num_keys()
    }
    fn wait(&self, keys: &[String], timeout: Option<Duration>) -> Result<()> {
        self.inner.wait(&self.keys(keys), timeout)
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn set_timeout(&self, timeout: Duration) {
        self.inner.set_timeout(timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::hash::conformance;
    use crate::store::HashStore;

    #[test]
    fn store_prefix_all_methods_and_namespacing() {
        let base: Arc<dyn Store> = Arc::new(HashStore::new());
        let p = PrefixStore::new("pg0", Arc::clone(&base));
        conformance::all_methods(&p);
        assert_eq!(base.get("pg0/a", None).unwrap(), b"hello world");
        assert!(!base.check(&["a".into()]).unwrap());
        // Nested prefixes compose.
        let inner = PrefixStore::new("x", Arc::new(PrefixStore::new("y", Arc::clone(&base))));
        inner.set("k", b"v").unwrap();
        assert_eq!(base.get("y/x/k", None).unwrap(), b"v");
        assert_eq!(p.prefix(), "pg0");
        assert!(Arc::ptr_eq(p.underlying(), &base));
    }

    #[test]
    fn store_prefix_timeouts_follow_underlying() {
        let base: Arc<dyn Store> = Arc::new(HashStore::new());
        let p = PrefixStore::new("p", Arc::clone(&base));
        conformance::timeouts(&p);
        p.set_timeout(Duration::from_secs(7));
        assert_eq!(base.timeout(), Duration::from_secs(7));
        let err = p.get("k", Some(Duration::from_millis(20))).unwrap_err();
        assert!(err.to_string().contains("p/k"));
    }
}
