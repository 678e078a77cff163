//! Reading an object's memory through Python's buffer protocol (numpy arrays): a C-contiguous,
//! writable-or-not view with its element format, in one call. `PyObject_GetBuffer` joined the
//! limited API only in Python 3.11 and the module is built for abi3-py310, so the two
//! functions and `Py_buffer` (unchanged since Python 3.3) are declared here; every CPython the
//! module loads into exports them.

use std::ffi::{c_char, c_int, c_void, CStr};

use pyo3::ffi;
use pyo3::prelude::*;

/// `Py_buffer` (Include/pybuffer.h).
#[repr(C)]
struct PyBufferView {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: isize,
    itemsize: isize,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut isize,
    strides: *mut isize,
    suboffsets: *mut isize,
    internal: *mut c_void,
}

extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut PyBufferView, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut PyBufferView);
}

/// PyBUF_C_CONTIGUOUS | PyBUF_FORMAT: a C-contiguous view that says its element format.
const C_CONTIGUOUS_WITH_FORMAT: c_int = 0x38 | 0x04;

/// rustdist's dtype code of a struct-module format (numpy's element formats).
fn dtype_code(format: &[u8]) -> Option<u8> {
    let format = match format.first() {
        Some(b'<' | b'=' | b'@') => &format[1..],
        _ => format,
    };
    Some(match format {
        b"f" => 0,
        b"d" => 1,
        b"e" => 2,
        b"b" => 4,
        b"h" => 5,
        b"i" => 6,
        b"l" | b"q" => 7,
        b"B" => 8,
        b"?" => 9,
        b"Zf" => 10,
        b"Zd" => 11,
        _ => return None,
    })
}

/// `x`'s (address, element count, dtype code) when it exposes a C-contiguous buffer of a
/// supported element type; None otherwise (the Python error cleared), for the caller's slow
/// path. The address stays valid while `x` lives and is not resized, as for any buffer the
/// caller holds `x` for.
pub fn contiguous(x: &Bound<'_, PyAny>) -> Option<(usize, usize, u8)> {
    let mut view = std::mem::MaybeUninit::<PyBufferView>::uninit();
    // SAFETY: `x` is a live object, the GIL is held, and `view` is space for one Py_buffer.
    if unsafe { PyObject_GetBuffer(x.as_ptr(), view.as_mut_ptr(), C_CONTIGUOUS_WITH_FORMAT) } != 0 {
        let _ = PyErr::take(x.py());
        return None;
    }
    // SAFETY: a return of 0 means the exporter filled in the view.
    let mut view = unsafe { view.assume_init() };
    let code = if view.format.is_null() {
        None
    } else {
        // SAFETY: the exporter's format is a NUL-terminated string living as long as the view.
        dtype_code(unsafe { CStr::from_ptr(view.format) }.to_bytes())
    };
    let found = code.and_then(|code| {
        let itemsize = usize::try_from(view.itemsize).ok().filter(|&s| s > 0)?;
        let len = usize::try_from(view.len).ok()?;
        Some((view.buf as usize, len / itemsize, code))
    });
    // SAFETY: releasing the view obtained above, once.
    unsafe { PyBuffer_Release(&mut view) };
    found
}

#[cfg(test)]
mod tests {
    use super::dtype_code;

    #[test]
    fn numpy_formats_map_to_dtype_codes() {
        assert_eq!(dtype_code(b"<f"), Some(0));
        assert_eq!(dtype_code(b"d"), Some(1));
        assert_eq!(dtype_code(b"Zf"), Some(10));
        assert_eq!(dtype_code(b"l"), Some(7));
        assert_eq!(dtype_code(b"O"), None);
        assert_eq!(dtype_code(b">f"), None);
    }
}
