//! A named POSIX shared-memory object mapped into this process: one rank creates it, the ranks
//! on its host map it by name, and its maker unlinks the name once they have (the mappings
//! stay), so nothing outlives the processes in /dev/shm.

use std::ffi::CString;
use std::io;

use crate::error::{Error, Result};

/// A shared mapping of `len` bytes of a named shared-memory object.
pub struct SharedObject {
    base: *mut u8,
    len: usize,
    name: CString,
    /// Whether this process created the name and has not unlinked it yet.
    owner: bool,
}

// SAFETY: the mapping is shared memory whose users synchronise through atomics in it; the
// pointer itself may move between threads.
unsafe impl Send for SharedObject {}
// SAFETY: as above; concurrent access goes through atomics.
unsafe impl Sync for SharedObject {}

pub(crate) fn os_error(what: &str) -> Error {
    Error::network(format!("{what}: {}", io::Error::last_os_error()))
}

impl SharedObject {
    /// Creates the object `name` (which must not exist) of `len` zero bytes, sparse, and maps it.
    pub fn create(name: &str, len: usize) -> Result<SharedObject> {
        let cname = CString::new(name).map_err(|_| Error::invalid("bad shared-memory name"))?;
        // SAFETY: shm_open with a valid NUL-terminated name; the fd is closed below.
        let fd = unsafe {
            libc::shm_open(
                cname.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o600,
            )
        };
        if fd < 0 {
            return Err(os_error("cannot create shared memory"));
        }
        // SAFETY: fd is a valid shared-memory descriptor we own.
        let sized = unsafe { libc::ftruncate(fd, len as libc::off_t) };
        let obj = if sized == 0 {
            Self::map(fd, cname.clone(), len, true)
        } else {
            Err(os_error("cannot size shared memory"))
        };
        // SAFETY: fd is valid and no longer needed once mapped (the mapping keeps the object).
        unsafe { libc::close(fd) };
        if obj.is_err() {
            // SAFETY: removing the name we just created.
            unsafe { libc::shm_unlink(cname.as_ptr()) };
        }
        obj
    }

    /// Maps the first `len` bytes of the object `name` another process created.
    pub fn open(name: &str, len: usize) -> Result<SharedObject> {
        let cname = CString::new(name).map_err(|_| Error::invalid("bad shared-memory name"))?;
        // SAFETY: shm_open with a valid NUL-terminated name; the fd is closed below.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(os_error("cannot open a peer's shared memory"));
        }
        let obj = Self::map(fd, cname, len, false);
        // SAFETY: fd is valid and no longer needed once mapped.
        unsafe { libc::close(fd) };
        obj
    }

    fn map(fd: i32, name: CString, len: usize, owner: bool) -> Result<SharedObject> {
        // SAFETY: mapping `len` bytes of a shared-memory object sized to at least `len`.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(os_error("cannot map shared memory"));
        }
        Ok(SharedObject {
            base: base as *mut u8,
            len,
            name,
            owner,
        })
    }

    /// The first byte of the mapping (page-aligned).
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reserves the byte ranges `(offset, len)` of the object, so that a full /dev/shm fails
    /// here (naming `what`), not with SIGBUS on first use. The name must still be linked.
    pub fn reserve(&self, ranges: impl Iterator<Item = (usize, usize)>, what: &str) -> Result<()> {
        // SAFETY: shm_open of this object's own name (still linked: peers map it by name).
        let fd = unsafe { libc::shm_open(self.name.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(os_error("cannot reopen this rank's shared memory"));
        }
        let mut failed = 0;
        for (at, len) in ranges {
            // SAFETY: fd is a valid shared-memory descriptor; the range lies in the object.
            failed = unsafe { libc::posix_fallocate(fd, at as libc::off_t, len as libc::off_t) };
            if failed != 0 {
                break;
            }
        }
        // SAFETY: fd is valid and ours.
        unsafe { libc::close(fd) };
        if failed != 0 {
            return Err(Error::network(format!(
                "cannot reserve shared memory for {what} (is /dev/shm full?): {}",
                io::Error::from_raw_os_error(failed)
            )));
        }
        Ok(())
    }

    /// Removes the name once every peer has mapped it; mappings stay valid.
    pub fn unlink(&mut self) {
        if self.owner {
            // SAFETY: unlinking a name this process created.
            unsafe { libc::shm_unlink(self.name.as_ptr()) };
            self.owner = false;
        }
    }
}

impl Drop for SharedObject {
    fn drop(&mut self) {
        self.unlink();
        // SAFETY: unmapping exactly the mapping made in `map`.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}
