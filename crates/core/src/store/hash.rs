//! In-process store (`HashStore`) and the key-value table it shares with the TCP server.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{
    added, check_multi_set, compare_set_outcome, deadline_after, wait_timeout_error, Store,
    DEFAULT_TIMEOUT,
};
use crate::error::{Error, Result};
use crate::interrupt;

/// How often a blocked wait re-checks its `abort` condition.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// Why a blocking wait on a [`MemKv`] ended without its keys.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WaitError {
    /// The deadline passed; the keys still missing.
    Timeout(Vec<String>),
    /// The caller's `abort` condition became true.
    Aborted,
    /// The waiting thread was interrupted (see [`crate::interrupt`]).
    Interrupted,
}

/// A key-value table whose waiters wake when keys are written.
#[derive(Default)]
pub(crate) struct MemKv {
    map: Mutex<HashMap<String, Vec<u8>>>,
    written: Condvar,
}

impl MemKv {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<u8>>> {
        // A panic elsewhere cannot leave the map half-updated (every update is one insert).
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set(&self, key: &str, value: &[u8]) {
        self.lock().insert(key.to_owned(), value.to_vec());
        self.written.notify_all();
    }

    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut map = self.lock();
        let v = added(key, map.get(key).map(Vec::as_slice), delta)?;
        map.insert(key.to_owned(), v.to_string().into_bytes());
        drop(map);
        self.written.notify_all();
        Ok(v)
    }

    pub fn append(&self, key: &str, value: &[u8]) {
        self.lock()
            .entry(key.to_owned())
            .or_default()
            .extend_from_slice(value);
        self.written.notify_all();
    }

    pub fn check(&self, keys: &[String]) -> bool {
        let map = self.lock();
        keys.iter().all(|k| map.contains_key(k))
    }

    pub fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Vec<u8> {
        let mut map = self.lock();
        let (new, ret) = compare_set_outcome(map.get(key).map(Vec::as_slice), expected, desired);
        if let Some(new) = new {
            map.insert(key.to_owned(), new);
            drop(map);
            self.written.notify_all();
        }
        ret
    }

    pub fn delete_key(&self, key: &str) -> bool {
        self.lock().remove(key).is_some()
    }

    pub fn multi_set(&self, keys: &[String], values: &[Vec<u8>]) {
        let mut map = self.lock();
        for (k, v) in keys.iter().zip(values) {
            map.insert(k.clone(), v.clone());
        }
        drop(map);
        self.written.notify_all();
    }

    pub fn num_keys(&self) -> i64 {
        self.lock().len() as i64
    }

    /// Waits until every key exists, then returns their values (`want_values`) or nothing.
    /// `abort` is polled every [`WAIT_SLICE`] so a waiter whose client left does not linger.
    pub fn wait_for(
        &self,
        keys: &[String],
        deadline: Instant,
        want_values: bool,
        abort: &dyn Fn() -> bool,
    ) -> std::result::Result<Vec<Vec<u8>>, WaitError> {
        let mut map = self.lock();
        loop {
            if keys.iter().all(|k| map.contains_key(k)) {
                return Ok(if want_values {
                    keys.iter().map(|k| map[k].clone()).collect()
                } else {
                    Vec::new()
                });
            }
            let now = Instant::now();
            if now >= deadline {
                let missing = keys.iter().filter(|k| !map.contains_key(*k));
                return Err(WaitError::Timeout(missing.cloned().collect()));
            }
            let slice = (deadline - now).min(WAIT_SLICE);
            map = interrupt::wait_timeout(&self.written, map, slice)
                .map_err(|_| WaitError::Interrupted)?;
            if abort() {
                return Err(WaitError::Aborted);
            }
        }
    }
}

/// An in-process store (torch's `HashStore`): threads of one process share it.
pub struct HashStore {
    kv: MemKv,
    timeout: Mutex<Duration>,
}

impl Default for HashStore {
    fn default() -> Self {
        HashStore {
            kv: MemKv::default(),
            timeout: Mutex::new(DEFAULT_TIMEOUT),
        }
    }
}

impl HashStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn wait_values(
        &self,
        keys: &[String],
        timeout: Option<Duration>,
        want_values: bool,
    ) -> Result<Vec<Vec<u8>>> {
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        match self
            .kv
            .wait_for(keys, deadline_after(timeout), want_values, &|| false)
        {
            Ok(v) => Ok(v),
            Err(WaitError::Timeout(missing)) => Err(wait_timeout_error(&missing, timeout)),
            Err(WaitError::Aborted) => Err(Error::store("wait aborted")),
            Err(WaitError::Interrupted) => Err(Error::Interrupted),
        }
    }
}

impl Store for HashStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.kv.set(key, value);
        Ok(())
    }
    fn get(&self, key: &str, timeout: Option<Duration>) -> Result<Vec<u8>> {
        let mut v = self.wait_values(&[key.to_owned()], timeout, true)?;
        Ok(v.swap_remove(0))
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.kv.add(key, delta)
    }
    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.kv.append(key, value);
        Ok(())
    }
    fn check(&self, keys: &[String]) -> Result<bool> {
        Ok(self.kv.check(keys))
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        Ok(self.kv.compare_set(key, expected, desired))
    }
    fn delete_key(&self, key: &str) -> Result<bool> {
        Ok(self.kv.delete_key(key))
    }
    fn multi_get(&self, keys: &[String], timeout: Option<Duration>) -> Result<Vec<Vec<u8>>> {
        self.wait_values(keys, timeout, true)
    }
    fn multi_set(&self, keys: &[String], values: &[Vec<u8>]) -> Result<()> {
        check_multi_set(keys, values)?;
        self.kv.multi_set(keys, values);
        Ok(())
    }
    fn num_keys(&self) -> Result<i64> {
        Ok(self.kv.num_keys())
    }
    fn wait(&self, keys: &[String], timeout: Option<Duration>) -> Result<()> {
        self.wait_values(keys, timeout, false).map(drop)
    }
    fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(|p| p.into_inner()) = timeout;
    }
}

/// Conformance checks every store implementation must pass (used by each store's tests).
#[cfg(test)]
pub(crate) mod conformance {
    use std::sync::Arc;
    use std::thread;
    use std::time::{Duration, Instant};

    use crate::error::Error;
    use crate::store::Store;

    fn keys(ks: &[&str]) -> Vec<String> {
        ks.iter().map(|k| k.to_string()).collect()
    }

    /// Every method, on a fresh (empty) store.
    pub fn all_methods(s: &dyn Store) {
        assert_eq!(s.num_keys().unwrap(), 0);
        s.set("a", b"1").unwrap();
        assert_eq!(s.get("a", None).unwrap(), b"1");
        s.set("a", b"hello").unwrap();
        assert_eq!(s.get("a", None).unwrap(), b"hello");
        assert_eq!(s.add("c", 5).unwrap(), 5);
        assert_eq!(s.add("c", -7).unwrap(), -2);
        assert_eq!(s.get("c", None).unwrap(), b"-2");
        s.set("n", b"40").unwrap();
        assert_eq!(s.add("n", 2).unwrap(), 42);
        let err = s.add("a", 1).unwrap_err();
        assert!(
            matches!(&err, Error::Store(m) if m.contains("a\" holds")),
            "{err:?}"
        );
        s.append("a", b" world").unwrap();
        s.append("new", b"x").unwrap();
        assert_eq!(s.get("a", None).unwrap(), b"hello world");
        assert_eq!(s.get("new", None).unwrap(), b"x");
        assert!(s.check(&keys(&["a", "c"])).unwrap());
        assert!(!s.check(&keys(&["a", "zz"])).unwrap());
        assert!(s.check(&[]).unwrap());
        // compare_set: absent key + empty expected sets; absent + non-empty returns expected.
        assert_eq!(s.compare_set("cs", b"", b"v1").unwrap(), b"v1");
        assert_eq!(s.compare_set("cs2", b"e", b"v").unwrap(), b"e");
        assert!(!s.check(&keys(&["cs2"])).unwrap());
        assert_eq!(s.compare_set("cs", b"v1", b"v2").unwrap(), b"v2");
        assert_eq!(s.compare_set("cs", b"nope", b"v3").unwrap(), b"v2");
        assert_eq!(s.get("cs", None).unwrap(), b"v2");
        assert!(s.delete_key("cs").unwrap());
        assert!(!s.delete_key("cs").unwrap());
        assert!(!s.check(&keys(&["cs"])).unwrap());
        s.multi_set(&keys(&["m1", "m2"]), &[b"x".to_vec(), Vec::new()])
            .unwrap();
        assert_eq!(
            s.multi_get(&keys(&["m2", "m1"]), None).unwrap(),
            vec![Vec::new(), b"x".to_vec()]
        );
        assert!(s.multi_set(&keys(&["m3"]), &[]).is_err());
        // a, c, n, new, m1, m2
        assert_eq!(s.num_keys().unwrap(), 6);
        s.wait(&keys(&["a", "m1"]), None).unwrap();
        s.wait(&keys(&["a"]), Some(Duration::from_millis(10)))
            .unwrap();
        let bin: Vec<u8> = (0..=255).collect();
        s.set("bin", &bin).unwrap();
        assert_eq!(s.get("bin", None).unwrap(), bin);
    }

    /// get/wait/multi_get time out with a Store error naming the missing key.
    pub fn timeouts(s: &dyn Store) {
        let t = Instant::now();
        let err = s
            .get("missing", Some(Duration::from_millis(200)))
            .unwrap_err();
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_secs(3),
            "{took:?}"
        );
        assert!(matches!(&err, Error::Store(m) if m.contains("missing") && m.contains("200ms")));
        s.set("here", b"1").unwrap();
        let err = s
            .wait(&keys(&["here", "gone"]), Some(Duration::from_millis(50)))
            .unwrap_err();
        assert!(matches!(&err, Error::Store(m) if m.contains("gone") && !m.contains("here")));
        assert!(s
            .multi_get(&keys(&["gone"]), Some(Duration::from_millis(50)))
            .is_err());
        let old = s.timeout();
        s.set_timeout(Duration::from_millis(100));
        assert_eq!(s.timeout(), Duration::from_millis(100));
        let t = Instant::now();
        assert!(s.get("missing", None).is_err());
        assert!(t.elapsed() < Duration::from_secs(3));
        s.set_timeout(old);
    }

    /// A blocked get returns once another thread sets the key.
    pub fn wakes_waiter(s: Arc<dyn Store>) {
        let s2 = Arc::clone(&s);
        let waiter = thread::spawn(move || s2.get("later", Some(Duration::from_secs(20))));
        let waiter2 = {
            let s3 = Arc::clone(&s);
            thread::spawn(move || s3.wait(&keys(&["later"]), Some(Duration::from_secs(20))))
        };
        s.set("later", b"v").unwrap();
        assert_eq!(waiter.join().unwrap().unwrap(), b"v");
        waiter2.join().unwrap().unwrap();
    }

    /// Concurrent adds from several threads are atomic.
    pub fn concurrent_adds(s: Arc<dyn Store>) {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let s = Arc::clone(&s);
                thread::spawn(move || {
                    for _ in 0..50 {
                        s.add("ctr", 1).unwrap();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(s.add("ctr", 0).unwrap(), 200);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn store_hash_all_methods() {
        conformance::all_methods(&HashStore::new());
    }

    #[test]
    fn store_hash_timeouts() {
        let s = HashStore::new();
        assert_eq!(s.timeout(), DEFAULT_TIMEOUT);
        conformance::timeouts(&s);
    }

    #[test]
    fn store_hash_wakes_waiter_and_adds_atomically() {
        conformance::wakes_waiter(Arc::new(HashStore::new()));
        conformance::concurrent_adds(Arc::new(HashStore::new()));
    }

    #[test]
    fn store_hash_wait_aborts() {
        let kv = MemKv::default();
        let r = kv.wait_for(
            &["k".into()],
            deadline_after(Duration::from_secs(10)),
            false,
            &|| true,
        );
        assert_eq!(r, Err(WaitError::Aborted));
    }
}
