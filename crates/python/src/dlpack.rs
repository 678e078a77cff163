//! Reading a torch tensor's buffer through DLPack's C exchange API (`dlpack.h` 1.x,
//! `torch.Tensor.__dlpack_c_exchange_api__`, torch 2.10 and later): one C call fills a
//! `DLTensor` without allocating, where torch's Python API costs five attribute calls (dtype,
//! is_cpu, is_contiguous, data_ptr, numel), about 0.3 us per tensor.

use std::ffi::{c_int, c_void, CStr};
use std::mem::MaybeUninit;

use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyType};

/// `DLTensor` (dlpack.h): data, device (type, id), ndim, dtype (code, bits, lanes), shape,
/// strides (null: compact row-major), byte_offset.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device_type: i32,
    device_id: i32,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `int (*)(void* py_object, DLTensor* out)`: 0, or -1 with a Python exception set.
type FromPyObject = unsafe extern "C" fn(*mut c_void, *mut DlTensor) -> c_int;

/// `DLPackExchangeAPIHeader` (dlpack.h): the part that stays the same across versions.
#[repr(C)]
struct ApiHeader {
    major: u32,
    minor: u32,
    prev_api: *const c_void,
}

/// `DLPackExchangeAPI` (dlpack.h), major version 1: the header, then five function pointers.
#[repr(C)]
struct ExchangeApi {
    header: ApiHeader,
    managed_tensor_allocator: *const c_void,
    managed_tensor_from_py_object_no_sync: *const c_void,
    managed_tensor_to_py_object_no_sync: *const c_void,
    dltensor_from_py_object_no_sync: Option<FromPyObject>,
    current_work_stream: *const c_void,
}

const KDL_CPU: i32 = 1;
const KDL_CUDA: i32 = 2;
const CAPSULE_NAME: &CStr = c"dlpack_exchange_api";

/// A contiguous tensor of a supported dtype, as the fast path reads it.
pub struct DenseBuffer {
    /// The data's address (on the device, for a CUDA tensor).
    pub ptr: usize,
    pub numel: usize,
    /// rustdist's dtype code.
    pub code: u8,
    /// Its length along dimension 0 (None for a 0-dim tensor), when read with the buffer;
    /// None: not read.
    pub rows: Option<Option<usize>>,
}

/// Reads plain tensors of one type through its exchange API.
pub struct DlpackReader {
    read: FromPyObject,
    /// The DLPack dtype of each rustdist dtype code (learnt from torch itself).
    dtypes: Vec<(DlDataType, u8)>,
}

impl DlpackReader {
    /// The reader for `tensor` (torch.Tensor), whose supported dtypes and `_core` codes are
    /// `dtype_codes`; None when torch has no exchange API (before 2.10) or another major
    /// version of it.
    pub fn new(tensor: &Bound<'_, PyType>, dtype_codes: &[(Py<PyAny>, u8)]) -> Option<Self> {
        let capsule = tensor.getattr("__dlpack_c_exchange_api__").ok()?;
        let capsule = capsule.cast::<PyCapsule>().ok()?;
        let api = capsule.pointer_checked(Some(CAPSULE_NAME)).ok()?.as_ptr();
        // SAFETY: a capsule of this name holds a `DLPackExchangeAPI*` that lives as long as
        // the process (dlpack.h), and every version of it starts with this header.
        if unsafe { &*api.cast::<ApiHeader>() }.major != 1 {
            return None;
        }
        // SAFETY: as above; major version 1 has this layout.
        let api = unsafe { &*api.cast::<ExchangeApi>() };
        let mut reader = DlpackReader {
            read: api.dltensor_from_py_object_no_sync?,
            dtypes: Vec::new(),
        };
        let py = tensor.py();
        for (dtype, code) in dtype_codes {
            let sample = tensor
                .call0()
                .and_then(|t| t.call_method1("to", (dtype.bind(py),)));
            if let Ok(Some(t)) = sample.map(|t| reader.dl_tensor(&t)) {
                reader.dtypes.push((t.dtype, *code));
            }
        }
        Some(reader)
    }

    /// `x`'s DLTensor, valid while `x` lives and is not resized; None (the Python error
    /// cleared) when torch cannot describe it.
    fn dl_tensor(&self, x: &Bound<'_, PyAny>) -> Option<DlTensor> {
        let mut out = MaybeUninit::<DlTensor>::uninit();
        // SAFETY: `x` is a live object of the type the API came from (the caller checks),
        // the GIL is held, and `out` is writable space for one DLTensor.
        if unsafe { (self.read)(x.as_ptr().cast(), out.as_mut_ptr()) } != 0 {
            let _ = PyErr::take(x.py());
            return None;
        }
        // SAFETY: a return of 0 means the producer filled in every field.
        Some(unsafe { out.assume_init() })
    }

    /// `x`, a torch.Tensor, when it is a contiguous CPU tensor of a supported dtype; None
    /// otherwise (the caller takes the Python path).
    pub fn cpu_buffer(&self, x: &Bound<'_, PyAny>) -> Option<DenseBuffer> {
        self.dense(x, KDL_CPU).map(|(buf, _)| buf)
    }

    /// `x`, a torch.Tensor, with its device index when it is a contiguous CUDA tensor of a
    /// supported dtype; None otherwise.
    pub fn cuda_buffer(&self, x: &Bound<'_, PyAny>) -> Option<(DenseBuffer, i32)> {
        self.dense(x, KDL_CUDA)
    }

    /// `x` and its device index when it is a contiguous tensor of a supported dtype on a
    /// device of DLPack type `device_type`.
    fn dense(&self, x: &Bound<'_, PyAny>, device_type: i32) -> Option<(DenseBuffer, i32)> {
        let t = self.dl_tensor(x)?;
        if t.device_type != device_type {
            return None;
        }
        let code = self.dtypes.iter().find(|(d, _)| *d == t.dtype)?.1;
        let ndim = usize::try_from(t.ndim).ok()?;
        if ndim > 0 && t.shape.is_null() {
            return None;
        }
        let shape: &[i64] = if ndim == 0 {
            &[]
        } else {
            // SAFETY: the producer's shape array has `ndim` entries and lives as long as `x`.
            unsafe { std::slice::from_raw_parts(t.shape, ndim) }
        };
        let numel: i64 = shape.iter().product();
        if !t.strides.is_null() && numel > 0 {
            // SAFETY: as for `shape`, when strides are given.
            let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
            // torch's is_contiguous: row-major, ignoring the strides of dimensions of size 1.
            let mut expected = 1i64;
            for (&size, &stride) in shape.iter().zip(strides).rev() {
                if size != 1 && stride != expected {
                    return None;
                }
                expected *= size;
            }
        }
        let ptr = (t.data as usize).checked_add(usize::try_from(t.byte_offset).ok()?)?;
        let rows = match shape.first() {
            Some(&rows) => Some(usize::try_from(rows).ok()?),
            None => None,
        };
        let buf = DenseBuffer {
            ptr,
            numel: usize::try_from(numel).ok()?,
            code,
            rows: Some(rows),
        };
        Some((buf, t.device_id))
    }
}
