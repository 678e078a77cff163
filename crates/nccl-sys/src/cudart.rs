//! The CUDA runtime function table.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use libloading::Library;

use crate::load::{self, symbol, Loaded};
use crate::types::*;
use crate::{c_string, Error};

type Err = CudaError;

/// The CUDA runtime functions rustdist uses, as `cuda_runtime_api.h` declares them.
pub struct Cudart {
    pub get_device_count: unsafe extern "C" fn(*mut c_int) -> Err,
    pub set_device: unsafe extern "C" fn(c_int) -> Err,
    pub get_device: unsafe extern "C" fn(*mut c_int) -> Err,
    pub device_get_pci_bus_id: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> Err,
    pub stream_create_with_flags: unsafe extern "C" fn(*mut CudaStream, c_uint) -> Err,
    pub stream_destroy: unsafe extern "C" fn(CudaStream) -> Err,
    pub stream_wait_event: unsafe extern "C" fn(CudaStream, CudaEvent, c_uint) -> Err,
    pub event_create_with_flags: unsafe extern "C" fn(*mut CudaEvent, c_uint) -> Err,
    pub event_record: unsafe extern "C" fn(CudaEvent, CudaStream) -> Err,
    pub event_query: unsafe extern "C" fn(CudaEvent) -> Err,
    pub event_synchronize: unsafe extern "C" fn(CudaEvent) -> Err,
    pub event_destroy: unsafe extern "C" fn(CudaEvent) -> Err,
    pub memcpy_async:
        unsafe extern "C" fn(*mut c_void, *const c_void, usize, CudaMemcpyKind, CudaStream) -> Err,
    pub host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> Err,
    pub free_host: unsafe extern "C" fn(*mut c_void) -> Err,
    pub malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> Err,
    pub free: unsafe extern "C" fn(*mut c_void) -> Err,
    pub get_error_string: unsafe extern "C" fn(Err) -> *const c_char,
    pub runtime_get_version: unsafe extern "C" fn(*mut c_int) -> Err,
    pub driver_get_version: unsafe extern "C" fn(*mut c_int) -> Err,
    loaded: Loaded,
    // Last: the pointers above stay valid while this is alive.
    _lib: Library,
}

// SAFETY: plain function pointers into a library kept loaded while they are in use; the CUDA
// runtime is thread-safe.
unsafe impl Send for Cudart {}
// SAFETY: as above; the table is immutable.
unsafe impl Sync for Cudart {}

static GLOBAL: Mutex<Option<&'static Cudart>> = Mutex::new(None);

impl Cudart {
    /// Opens libcudart 13 or 12 (see the crate docs for the search order).
    pub fn load(search_dirs: &[PathBuf]) -> Result<Cudart, Error> {
        let (lib, path) = load::open(
            "the CUDA runtime",
            &["libcudart.so.13", "libcudart.so.12"],
            search_dirs,
            "RUSTDIST_CUDART_LIBRARY",
        )?;
        // SAFETY: every type below is that of the same-named declaration in
        // cuda_runtime_api.h (CUDA 11 through 13).
        unsafe { Self::from_library(lib, &path) }
    }

    /// # Safety
    /// `lib` must be a CUDA runtime library.
    unsafe fn from_library(lib: Library, path: &Path) -> Result<Cudart, Error> {
        // SAFETY (every `symbol` below): the type is that of the same-named declaration in
        // cuda_runtime_api.h, as the caller promises.
        let mut rt = unsafe {
            Cudart {
                get_device_count: symbol(&lib, path, "cudaGetDeviceCount")?,
                set_device: symbol(&lib, path, "cudaSetDevice")?,
                get_device: symbol(&lib, path, "cudaGetDevice")?,
                device_get_pci_bus_id: symbol(&lib, path, "cudaDeviceGetPCIBusId")?,
                stream_create_with_flags: symbol(&lib, path, "cudaStreamCreateWithFlags")?,
                stream_destroy: symbol(&lib, path, "cudaStreamDestroy")?,
                stream_wait_event: symbol(&lib, path, "cudaStreamWaitEvent")?,
                event_create_with_flags: symbol(&lib, path, "cudaEventCreateWithFlags")?,
                event_record: symbol(&lib, path, "cudaEventRecord")?,
                event_query: symbol(&lib, path, "cudaEventQuery")?,
                event_synchronize: symbol(&lib, path, "cudaEventSynchronize")?,
                event_destroy: symbol(&lib, path, "cudaEventDestroy")?,
                memcpy_async: symbol(&lib, path, "cudaMemcpyAsync")?,
                host_alloc: symbol(&lib, path, "cudaHostAlloc")?,
                free_host: symbol(&lib, path, "cudaFreeHost")?,
                malloc: symbol(&lib, path, "cudaMalloc")?,
                free: symbol(&lib, path, "cudaFree")?,
                get_error_string: symbol(&lib, path, "cudaGetErrorString")?,
                runtime_get_version: symbol(&lib, path, "cudaRuntimeGetVersion")?,
                driver_get_version: symbol(&lib, path, "cudaDriverGetVersion")?,
                loaded: Loaded {
                    path: path.to_path_buf(),
                    version: (0, 0, 0),
                },
                _lib: lib,
            }
        };
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer; the call needs no device.
        let r = unsafe { (rt.runtime_get_version)(&mut v) };
        rt.check(r, "cudaRuntimeGetVersion")?;
        rt.loaded.version = decode_cuda_version(v);
        Ok(rt)
    }

    /// The process-wide runtime, loaded on first success and kept for the life of the process
    /// (CUDA state must not outlive its code). A failed load is retried on the next call.
    pub fn global(search_dirs: &[PathBuf]) -> Result<&'static Cudart, Error> {
        let mut slot = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(rt) = *slot {
            return Ok(rt);
        }
        let rt: &'static Cudart = Box::leak(Box::new(Cudart::load(search_dirs)?));
        *slot = Some(rt);
        Ok(rt)
    }

    /// The file and runtime version loaded.
    pub fn loaded(&self) -> &Loaded {
        &self.loaded
    }

    /// The driver's CUDA version ((0, 0, 0) when no driver is installed).
    pub fn driver_version(&self) -> Result<(u32, u32, u32), Error> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer.
        let r = unsafe { (self.driver_get_version)(&mut v) };
        self.check(r, "cudaDriverGetVersion")?;
        Ok(decode_cuda_version(v))
    }

    /// The number of CUDA devices; an error (no driver, insufficient driver, no device) says
    /// why there are none.
    pub fn device_count(&self) -> Result<usize, Error> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer.
        let r = unsafe { (self.get_device_count)(&mut n) };
        self.check(r, "cudaGetDeviceCount")?;
        Ok(n.max(0) as usize)
    }

    /// The PCI bus id (`domain:bus:device.function`) of `device`: the same on every process
    /// that sees the GPU, whatever `CUDA_VISIBLE_DEVICES` numbers it.
    pub fn pci_bus_id(&self, device: c_int) -> Result<String, Error> {
        let mut buf = [0 as c_char; 64];
        // SAFETY: `buf` has room for the 64 bytes passed as its length.
        let r =
            unsafe { (self.device_get_pci_bus_id)(buf.as_mut_ptr(), buf.len() as c_int, device) };
        self.check(r, "cudaDeviceGetPCIBusId")?;
        buf[buf.len() - 1] = 0;
        // SAFETY: the buffer is NUL-terminated (forced above) and lives through the call.
        Ok(unsafe { c_string(buf.as_ptr()) })
    }

    /// `Ok` for `cudaSuccess`, else an error naming `call` and CUDA's message.
    pub fn check(&self, r: CudaError, call: &'static str) -> Result<(), Error> {
        if r == CudaError::SUCCESS {
            return Ok(());
        }
        // SAFETY: cudaGetErrorString returns a static string for any code.
        let message = unsafe { c_string((self.get_error_string)(r)) };
        Err(Error::Cuda {
            call,
            code: r.0,
            message,
        })
    }
}

/// CUDA's `1000 * major + 10 * minor` to (major, minor, 0).
fn decode_cuda_version(v: c_int) -> (u32, u32, u32) {
    let v = v.max(0) as u32;
    (v / 1000, (v % 1000) / 10, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_versions_decode() {
        assert_eq!(decode_cuda_version(13000), (13, 0, 0));
        assert_eq!(decode_cuda_version(12040), (12, 4, 0));
        assert_eq!(decode_cuda_version(0), (0, 0, 0));
    }
}
