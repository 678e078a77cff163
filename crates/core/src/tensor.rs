//! Zero-copy views of buffers owned by the caller (torch tensors, numpy arrays, Rust vectors).

use crate::types::DType;

/// A raw, contiguous byte range owned elsewhere. The owner keeps it alive and does not touch it
/// until the Work that uses it completes; that contract is what makes the views below sound.
#[derive(Debug, Clone, Copy)]
pub struct RawBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a RawBuf is only a pointer and a length; the owner guarantees exclusive use by the one
// Work that holds it, on whichever thread runs that Work.
unsafe impl Send for RawBuf {}

impl RawBuf {
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as any slice made from
    /// this view is in use, and nothing else may access that memory meanwhile.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        RawBuf { ptr, len }
    }

    pub fn from_mut_slice(s: &mut [u8]) -> Self {
        RawBuf {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// # Safety
    /// As for [`RawBuf::new`]; the caller picks a lifetime no longer than the owner's promise.
    pub unsafe fn as_mut_slice<'a>(&self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: guaranteed by the caller (see above); len > 0 so ptr is non-null.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// # Safety
    /// As for [`RawBuf::as_mut_slice`].
    pub unsafe fn as_slice<'a>(&self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: guaranteed by the caller (see above); len > 0 so ptr is non-null.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// A typed view: a contiguous buffer of `numel` elements of `dtype`.
#[derive(Debug, Clone, Copy)]
pub struct Tensor {
    pub buf: RawBuf,
    pub dtype: DType,
    pub numel: usize,
}

impl Tensor {
    /// # Safety
    /// As for [`RawBuf::new`] with `len = numel * dtype.size()`.
    pub unsafe fn new(ptr: *mut u8, dtype: DType, numel: usize) -> Self {
        // SAFETY: forwarded to the caller.
        let buf = unsafe { RawBuf::new(ptr, numel * dtype.size()) };
        Tensor { buf, dtype, numel }
    }

    pub fn nbytes(&self) -> usize {
        self.buf.len()
    }
}
