//! NCCL and the CUDA runtime, loaded at run time.
//!
//! Nothing here links against CUDA: [`Nccl::load`] and [`Cudart::load`] open `libnccl.so.2` and
//! `libcudart.so.{13,12}` with `libloading`, so the wheel builds, imports and runs its CPU paths
//! on machines without CUDA, and the CUDA path uses the libraries torch's wheels ship.
//!
//! Search order (first that opens wins): the caller's `search_dirs` (the torch wheel's
//! `nvidia/*/lib` folders: the same files torch itself has loaded), then the environment
//! override (`RUSTDIST_NCCL_LIBRARY` / `RUSTDIST_CUDART_LIBRARY`, a full path), then the
//! system's loader search by soname.
//!
//! The function tables hold raw `unsafe extern "C"` pointers with the signatures of `nccl.h` and
//! `cuda_runtime_api.h`; calling them is the user's `unsafe`. [`Nccl::check`] and
//! [`Cudart::check`] turn result codes into [`Error`]s that name the call and the library's
//! own message.
//!
//! Hand-written rather than on cudarc, whose loader cannot open torch's `libnccl.so.2`, takes
//! no path and panics when nothing loads, and whose result codes are Rust enums (a code newer
//! than its bindings would be undefined behaviour): docs/cuda.md, "Why not cudarc". Here
//! [`NcclResult`], [`NcclRedOp`] and [`CudaError`] are integer newtypes.

use std::ffi::{c_char, CStr};

mod cudart;
mod load;
mod nccl;
mod types;

pub use cudart::Cudart;
pub use load::Loaded;
pub use nccl::Nccl;
pub use types::*;

/// What can go wrong loading or calling NCCL or the CUDA runtime.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No candidate file could be opened; `tried` says why for each.
    #[error("cannot load {library}: {}", tried.join("; "))]
    Load {
        library: &'static str,
        tried: Vec<String>,
    },
    /// The library opened but lacks a required function (too old a version).
    #[error("{path} has no {symbol} ({reason}); rustdist needs NCCL >= 2.11 and CUDA >= 11")]
    Symbol {
        path: String,
        symbol: &'static str,
        reason: String,
    },
    /// An NCCL call returned an error.
    #[error("{call} failed: {name}{}", if detail.is_empty() { String::new() } else { format!(" ({detail})") })]
    Nccl {
        call: &'static str,
        code: NcclResult,
        name: String,
        detail: String,
    },
    /// A CUDA runtime call returned an error.
    #[error("{call} failed: {message} (cudaError {code})")]
    Cuda {
        call: &'static str,
        code: i32,
        message: String,
    },
}

/// An owned copy of a C string returned by a library (empty for NULL).
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid during the call.
unsafe fn c_string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated, as the caller promises.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
