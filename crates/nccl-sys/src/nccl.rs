//! The NCCL function table.

use std::ffi::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use libloading::Library;

use crate::load::{self, optional, symbol, Loaded};
use crate::types::*;
use crate::{c_string, Error};

type Comm = NcclComm;
type Stream = CudaStream;
type Res = NcclResult;

/// NCCL's functions, as `nccl.h` declares them. Those newer than NCCL 2.11 are `Option`s.
pub struct Nccl {
    pub get_version: unsafe extern "C" fn(*mut c_int) -> Res,
    pub get_unique_id: unsafe extern "C" fn(*mut NcclUniqueId) -> Res,
    pub comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, NcclUniqueId, c_int) -> Res,
    /// NCCL >= 2.14.
    pub comm_init_rank_config:
        Option<unsafe extern "C" fn(*mut Comm, c_int, NcclUniqueId, c_int, *mut NcclConfig) -> Res>,
    /// NCCL >= 2.18.
    pub comm_split:
        Option<unsafe extern "C" fn(Comm, c_int, c_int, *mut Comm, *mut NcclConfig) -> Res>,
    /// NCCL >= 2.27: (comm, excluded ranks, their count, new comm, config, flags).
    pub comm_shrink: Option<
        unsafe extern "C" fn(Comm, *mut c_int, c_int, *mut Comm, *mut NcclConfig, c_int) -> Res,
    >,
    pub comm_abort: unsafe extern "C" fn(Comm) -> Res,
    pub comm_destroy: unsafe extern "C" fn(Comm) -> Res,
    /// NCCL >= 2.14.
    pub comm_finalize: Option<unsafe extern "C" fn(Comm) -> Res>,
    pub comm_get_async_error: unsafe extern "C" fn(Comm, *mut Res) -> Res,
    pub get_error_string: unsafe extern "C" fn(Res) -> *const c_char,
    /// NCCL >= 2.13.
    pub get_last_error: Option<unsafe extern "C" fn(Comm) -> *const c_char>,
    pub all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        NcclDataType,
        NcclRedOp,
        Comm,
        Stream,
    ) -> Res,
    pub broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        NcclDataType,
        c_int,
        Comm,
        Stream,
    ) -> Res,
    pub reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        NcclDataType,
        NcclRedOp,
        c_int,
        Comm,
        Stream,
    ) -> Res,
    pub all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, NcclDataType, Comm, Stream) -> Res,
    pub reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        NcclDataType,
        NcclRedOp,
        Comm,
        Stream,
    ) -> Res,
    pub send: unsafe extern "C" fn(*const c_void, usize, NcclDataType, c_int, Comm, Stream) -> Res,
    pub recv: unsafe extern "C" fn(*mut c_void, usize, NcclDataType, c_int, Comm, Stream) -> Res,
    pub group_start: unsafe extern "C" fn() -> Res,
    pub group_end: unsafe extern "C" fn() -> Res,
    pub red_op_create_pre_mul_sum: unsafe extern "C" fn(
        *mut NcclRedOp,
        *mut c_void,
        NcclDataType,
        NcclScalarResidence,
        Comm,
    ) -> Res,
    pub red_op_destroy: unsafe extern "C" fn(NcclRedOp, Comm) -> Res,
    loaded: Loaded,
    // Last: the pointers above stay valid while this is alive.
    _lib: Library,
}

// SAFETY: the table holds plain function pointers into a library that is never unloaded while
// they are in use; NCCL's entry points may be called from any thread.
unsafe impl Send for Nccl {}
// SAFETY: as above; the table is immutable.
unsafe impl Sync for Nccl {}

static GLOBAL: Mutex<Option<&'static Nccl>> = Mutex::new(None);

impl Nccl {
    /// Opens libnccl (see the crate docs for the search order) and reads its functions.
    pub fn load(search_dirs: &[PathBuf]) -> Result<Nccl, Error> {
        let (lib, path) = load::open(
            "NCCL",
            &["libnccl.so.2", "libnccl.so"],
            search_dirs,
            "RUSTDIST_NCCL_LIBRARY",
        )?;
        // SAFETY: every type below is the function pointer type of the same-named declaration
        // in nccl.h (2.11 through 2.29).
        unsafe { Self::from_library(lib, &path) }
    }

    /// # Safety
    /// `lib` must be an NCCL 2.x library (the symbols are read with `nccl.h`'s types).
    unsafe fn from_library(lib: Library, path: &Path) -> Result<Nccl, Error> {
        // SAFETY (every `symbol`/`optional` below): the type is that of the same-named
        // declaration in nccl.h, as the caller promises.
        let mut nccl = unsafe {
            Nccl {
                get_version: symbol(&lib, path, "ncclGetVersion")?,
                get_unique_id: symbol(&lib, path, "ncclGetUniqueId")?,
                comm_init_rank: symbol(&lib, path, "ncclCommInitRank")?,
                comm_init_rank_config: optional(&lib, "ncclCommInitRankConfig"),
                comm_split: optional(&lib, "ncclCommSplit"),
                comm_shrink: optional(&lib, "ncclCommShrink"),
                comm_abort: symbol(&lib, path, "ncclCommAbort")?,
                comm_destroy: symbol(&lib, path, "ncclCommDestroy")?,
                comm_finalize: optional(&lib, "ncclCommFinalize"),
                comm_get_async_error: symbol(&lib, path, "ncclCommGetAsyncError")?,
                get_error_string: symbol(&lib, path, "ncclGetErrorString")?,
                get_last_error: optional(&lib, "ncclGetLastError"),
                all_reduce: symbol(&lib, path, "ncclAllReduce")?,
                broadcast: symbol(&lib, path, "ncclBroadcast")?,
                reduce: symbol(&lib, path, "ncclReduce")?,
                all_gather: symbol(&lib, path, "ncclAllGather")?,
                reduce_scatter: symbol(&lib, path, "ncclReduceScatter")?,
                send: symbol(&lib, path, "ncclSend")?,
                recv: symbol(&lib, path, "ncclRecv")?,
                group_start: symbol(&lib, path, "ncclGroupStart")?,
                group_end: symbol(&lib, path, "ncclGroupEnd")?,
                red_op_create_pre_mul_sum: symbol(&lib, path, "ncclRedOpCreatePreMulSum")?,
                red_op_destroy: symbol(&lib, path, "ncclRedOpDestroy")?,
                loaded: Loaded {
                    path: path.to_path_buf(),
                    version: (0, 0, 0),
                },
                _lib: lib,
            }
        };
        nccl.loaded.version = nccl.version()?;
        Ok(nccl)
    }

    /// The process-wide NCCL, loaded on first success and kept for the life of the process:
    /// NCCL starts threads that run its code until exit, and one process must not mix two
    /// NCCL builds. A failed load is retried on the next call.
    pub fn global(search_dirs: &[PathBuf]) -> Result<&'static Nccl, Error> {
        let mut slot = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(nccl) = *slot {
            return Ok(nccl);
        }
        let nccl: &'static Nccl = Box::leak(Box::new(Nccl::load(search_dirs)?));
        *slot = Some(nccl);
        Ok(nccl)
    }

    /// The file and version loaded.
    pub fn loaded(&self) -> &Loaded {
        &self.loaded
    }

    /// (major, minor, patch) from `ncclGetVersion`.
    pub fn version(&self) -> Result<(u32, u32, u32), Error> {
        let mut code: c_int = 0;
        // SAFETY: `code` is a valid out-pointer for the call.
        let r = unsafe { (self.get_version)(&mut code) };
        self.check(r, "ncclGetVersion")?;
        Ok(decode_version(code))
    }

    /// A fresh `ncclUniqueId` (opens NCCL's bootstrap listener; needs no GPU).
    pub fn unique_id(&self) -> Result<NcclUniqueId, Error> {
        let mut id = NcclUniqueId::zeroed();
        // SAFETY: `id` is a valid out-pointer of the declared type.
        let r = unsafe { (self.get_unique_id)(&mut id) };
        self.check(r, "ncclGetUniqueId")?;
        Ok(id)
    }

    /// `Ok` for `ncclSuccess`, else an error naming `call` with NCCL's description of the code
    /// and its last error message.
    pub fn check(&self, r: NcclResult, call: &'static str) -> Result<(), Error> {
        // SAFETY: NULL is always accepted by ncclGetLastError.
        unsafe { self.check_comm(r, call, std::ptr::null_mut()) }
    }

    /// [`Nccl::check`] with the last error recorded for `comm`.
    ///
    /// # Safety
    /// `comm` is NULL or a communicator that is neither destroyed nor aborted.
    pub unsafe fn check_comm(
        &self,
        r: NcclResult,
        call: &'static str,
        comm: NcclComm,
    ) -> Result<(), Error> {
        if r == NcclResult::SUCCESS {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static string for any code.
        let name = unsafe { c_string((self.get_error_string)(r)) };
        let detail = match self.get_last_error {
            // SAFETY: `comm` is NULL or live (the caller's promise); the string is NCCL's and
            // lives until the next NCCL call on this thread.
            Some(last) => unsafe { c_string(last(comm)) },
            None => String::new(),
        };
        Err(Error::Nccl {
            call,
            code: r,
            name: format!("{name} ({})", r.name()),
            detail,
        })
    }
}

/// NCCL_VERSION_CODE to (major, minor, patch): `X*1000 + Y*100 + Z` up to 2.8, `X*10000 +
/// Y*100 + Z` since 2.9.
fn decode_version(code: c_int) -> (u32, u32, u32) {
    let code = code.max(0) as u32;
    if code >= 10000 {
        (code / 10000, (code % 10000) / 100, code % 100)
    } else {
        (code / 1000, (code % 1000) / 100, code % 100)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decode_both_encodings() {
        assert_eq!(decode_version(22907), (2, 29, 7));
        assert_eq!(decode_version(21804), (2, 18, 4));
        assert_eq!(decode_version(2803), (2, 8, 3));
    }
}
