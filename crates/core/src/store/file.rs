//! `FileStore`: a store shared by processes through one file.
//!
//! The file is an append-only log of records (set, delete, append, finished). Every access
//! takes an `flock` on the file (shared to read, exclusive to write), reads the records other
//! processes appended since the last access, and, for writes, appends its own records while
//! still holding the lock, so read-modify-write operations (`add`, `compare_set`) are atomic
//! across processes. Blocking `get`/`wait` poll the file with a short backoff.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::codec::{Reader, Writer};
use super::{
    added, check_multi_set, compare_set_outcome, deadline_after, wait_timeout_error, Store,
    DEFAULT_TIMEOUT,
};
use crate::error::{Error, Result};
use crate::interrupt;

const TAG_SET: u8 = 1;
const TAG_DELETE: u8 = 2;
const TAG_APPEND: u8 = 3;
/// Written by each instance of a store with a known world size when it is dropped.
const TAG_FINISHED: u8 = 4;

/// Longest pause between two polls of a blocked `get`/`wait`.
const MAX_POLL: Duration = Duration::from_millis(20);

/// What this instance has read of the log so far.
#[derive(Default)]
struct LogState {
    offset: u64,
    kv: HashMap<String, Vec<u8>>,
    finished: i64,
}

impl LogState {
    /// Applies the complete records in `buf`; returns how many bytes they took. A record cut
    /// short (a writer that died mid-write) is left for later.
    fn apply(&mut self, buf: &[u8]) -> Result<usize> {
        let mut r = Reader::new(buf);
        let mut used = 0;
        while r.remaining() > 0 {
            let rec = (|| Ok::<_, Error>((r.u8()?, r.string()?, r.bytes()?)))();
            let Ok((tag, key, value)) = rec else { break };
            match tag {
                TAG_SET => {
                    self.kv.insert(key, value);
                }
                TAG_DELETE => {
                    self.kv.remove(&key);
                }
                TAG_APPEND => self.kv.entry(key).or_default().extend_from_slice(&value),
                TAG_FINISHED => self.finished += 1,
                _ => {
                    return Err(Error::store(format!(
                        "FileStore: corrupt file (record tag {tag} at byte {})",
                        self.offset as usize + used
                    )))
                }
            }
            used = r.pos();
        }
        Ok(used)
    }
}

/// Records to append, built while the file is locked.
#[derive(Default)]
struct Records(Writer);

impl Records {
    fn push(&mut self, tag: u8, key: &str, value: &[u8]) {
        self.0.u8(tag).bytes(key.as_bytes()).bytes(value);
    }
}

/// Holds an `flock` on a file until dropped.
struct Flock<'a>(&'a File);

impl<'a> Flock<'a> {
    fn acquire(file: &'a File, exclusive: bool) -> Result<Self> {
        let op = if exclusive {
            libc::LOCK_EX
        } else {
            libc::LOCK_SH
        };
        loop {
            // SAFETY: the fd belongs to `file`, which outlives this call.
            if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
                return Ok(Flock(file));
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::store(format!("FileStore: flock failed: {err}")));
            }
        }
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        // SAFETY: the fd belongs to the borrowed file, still open. Closing it would also unlock.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// torch's `FileStore`. With `world_size > 0`, the file is removed once `world_size`
/// instances (across processes) have been dropped, as torch does.
pub struct FileStore {
    path: PathBuf,
    file: File,
    world_size: i64,
    state: Mutex<LogState>,
    timeout: Mutex<Duration>,
}

impl FileStore {
    pub fn new(path: impl AsRef<Path>, world_size: i64) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|e| Error::store(format!("FileStore: cannot open {}: {e}", path.display())))?;
        Ok(FileStore {
            path,
            file,
            world_size,
            state: Mutex::new(LogState::default()),
            timeout: Mutex::new(DEFAULT_TIMEOUT),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn state(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads and applies what was appended since the last access (caller holds the flock).
    fn refresh(&self, st: &mut LogState) -> Result<()> {
        let io = |e: std::io::Error| {
            Error::store(format!("FileStore: reading {}: {e}", self.path.display()))
        };
        let mut f = &self.file;
        f.seek(SeekFrom::Start(st.offset)).map_err(io)?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).map_err(io)?;
        let used = st.apply(&buf)?;
        st.offset += used as u64;
        Ok(())
    }

    /// Runs `f` on the up-to-date table under the file lock (exclusive when `write`), then
    /// appends the records `f` produced.
    fn locked<T>(
        &self,
        write: bool,
        f: impl FnOnce(&HashMap<String, Vec<u8>>, &mut Records) -> Result<T>,
    ) -> Result<T> {
        let mut st = self.state();
        let _flock = Flock::acquire(&self.file, write)?;
        self.refresh(&mut st)?;
        let mut recs = Records::default();
        let out = f(&st.kv, &mut recs)?;
        if !recs.0 .0.is_empty() {
            // O_APPEND, and nobody else writes while we hold the exclusive lock.
            (&self.file).write_all(&recs.0 .0).map_err(|e| {
                Error::store(format!("FileStore: writing {}: {e}", self.path.display()))
            })?;
            self.refresh(&mut st)?;
        }
        Ok(out)
    }

    fn wait_values(
        &self,
        keys: &[String],
        timeout: Option<Duration>,
        want_values: bool,
    ) -> Result<Vec<Vec<u8>>> {
        let timeout = timeout.unwrap_or_else(|| self.timeout());
        let deadline = deadline_after(timeout);
        let mut pause = Duration::from_millis(1);
        loop {
            let found = self.locked(false, |kv, _| {
                let missing: Vec<String> = keys
                    .iter()
                    .filter(|k| !kv.contains_key(*k))
                    .cloned()
                    .collect();
                Ok(if !missing.is_empty() {
                    Err(missing)
                } else if want_values {
                    Ok(keys.iter().map(|k| kv[k].clone()).collect())
                } else {
                    Ok(Vec::new())
                })
            })?;
            let missing = match found {
                Ok(values) => return Ok(values),
                Err(missing) => missing,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(wait_timeout_error(&missing, timeout));
            }
            interrupt::sleep(pause.min(deadline - now))?;
            pause = (pause * 2).min(MAX_POLL);
        }
    }
}

impl Drop for FileStore {
    fn drop(&mut self) {
        if self.world_size <= 0 {
            return;
        }
        let done = self.locked(true, |_, recs| {
            recs.push(TAG_FINISHED, "", b"");
            Ok(())
        });
        if done.is_ok() && self.state().finished >= self.world_size {
            // Another finisher may have removed it already.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Store for FileStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.locked(true, |_, recs| {
            recs.push(TAG_SET, key, value);
            Ok(())
        })
    }
    fn get(&self, key: &str, timeout: Option<Duration>) -> Result<Vec<u8>> {
        let mut v = self.wait_values(&[key.to_owned()], timeout, true)?;
        Ok(v.swap_remove(0))
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.locked(true, |kv, recs| {
            let v = added(key, kv.get(key).map(Vec::as_slice), delta)?;
            recs.push(TAG_SET, key, v.to_string().as_bytes());
            Ok(v)
        })
    }
    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.locked(true, |_, recs| {
            recs.push(TAG_APPEND, key, value);
            Ok(())
        })
    }
    fn check(&self, keys: &[String]) -> Result<bool> {
        self.locked(false, |kv, _| Ok(keys.iter().all(|k| kv.contains_key(k))))
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.locked(true, |kv, recs| {
            let (new, ret) = compare_set_outcome(kv.get(key).map(Vec::as_slice), expected, desired);
            if let Some(new) = new {
                recs.push(TAG_SET, key, &new);
            }
            Ok(ret)
        })
    }
    fn delete_key(&self, key: &str) -> Result<bool> {
        self.locked(true, |kv, recs| {
            let existed = kv.contains_key(key);
            if existed {
                recs.push(TAG_DELETE, key, b"");
            }
            Ok(existed)
        })
    }
    fn multi_get(&self, keys: &[String], timeout: Option<Duration>) -> Result<Vec<Vec<u8>>> {
        self.wait_values(keys, timeout, true)
    }
    fn multi_set(&self, keys: &[String], values: &[Vec<u8>]) -> Result<()> {
        check_multi_set(keys, values)?;
        self.locked(true, |_, recs| {
            for (k, v) in keys.iter().zip(values) {
                recs.push(TAG_SET, k, v);
            }
            Ok(())
        })
    }
    fn num_keys(&self) -> Result<i64> {
        self.locked(false, |kv, _| Ok(kv.len() as i64))
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::thread;

    use super::*;
    use crate::store::hash::conformance;

    fn temp_path(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("rustdist-fs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn store_file_all_methods() {
        let p = temp_path("all");
        let s = FileStore::new(&p, -1).unwrap();
        conformance::all_methods(&s);
        assert_eq!(s.path(), p.as_path());
        drop(s);
        // A fresh instance replays the log.
        let s = FileStore::new(&p, -1).unwrap();
        assert_eq!(s.get("a", None).unwrap(), b"hello world");
        assert_eq!(s.num_keys().unwrap(), 7);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn store_file_timeouts() {
        let p = temp_path("timeouts");
        conformance::timeouts(&FileStore::new(&p, -1).unwrap());
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn store_file_shared_between_instances() {
        let p = temp_path("shared");
        let a: Arc<dyn Store> = Arc::new(FileStore::new(&p, -1).unwrap());
        let b: Arc<dyn Store> = Arc::new(FileStore::new(&p, -1).unwrap());
        let waiter = {
            let b = Arc::clone(&b);
            thread::spawn(move || b.get("k", Some(Duration::from_secs(20))))
        };
        a.set("k", b"from a").unwrap();
        assert_eq!(waiter.join().unwrap().unwrap(), b"from a");
        // Atomic adds across instances (separate open files, so flock really arbitrates).
        let hs: Vec<_> = [&a, &b]
            .into_iter()
            .map(|s| {
                let s = Arc::clone(s);
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
        assert_eq!(a.add("ctr", 0).unwrap(), 100);
        assert!(b.delete_key("k").unwrap());
        assert!(!a.check(&["k".into()]).unwrap());
        conformance::wakes_waiter(Arc::clone(&a));
        drop((a, b));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn store_file_removed_after_world_size_instances() {
        let p = temp_path("cleanup");
        let a = FileStore::new(&p, 2).unwrap();
        let b = FileStore::new(&p, 2).unwrap();
        a.set("k", b"v").unwrap();
        drop(a);
        assert!(p.exists());
        assert_eq!(b.num_keys().unwrap(), 1, "the finished marker is not a key");
        drop(b);
        assert!(!p.exists());
    }

    #[test]
    fn store_file_corrupt_and_unopenable() {
        let p = temp_path("corrupt");
        std::fs::write(&p, [9u8, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        let s = FileStore::new(&p, -1).unwrap();
        assert!(matches!(s.set("k", b"v"), Err(Error::Store(m)) if m.contains("corrupt")));
        std::fs::remove_file(&p).unwrap();
        assert!(matches!(
            FileStore::new("/nonexistent-dir/x/y", -1),
            Err(Error::Store(_))
        ));
    }
}
