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

    /// The first byte, for copies that may overlap (`std::ptr::copy`).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether a byte of this view is also in `other` (an empty view shares nothing).
    pub fn overlaps(&self, other: &RawBuf) -> bool {
        let (a, b) = (self.ptr as usize, other.ptr as usize);
        self.len > 0 && other.len > 0 && a < b + other.len && b < a + self.len
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

/// Up to this many (read, write) pairs [`any_overlap`] compares each pair.
const PAIRWISE_MAX: usize = 64;

/// Whether a byte of any of `reads` is also in one of `writes` (empty buffers share nothing).
pub fn any_overlap(reads: &[RawBuf], writes: &[RawBuf]) -> bool {
    // Few pairs (one input against a world's outputs, on every call): compare them all, with
    // no allocation; many: sort once, O(n log n).
    if reads.len().saturating_mul(writes.len()) <= PAIRWISE_MAX {
        return reads.iter().any(|r| writes.iter().any(|w| r.overlaps(w)));
    }
    overlap_by_sorting(reads, writes)
}

fn overlap_by_sorting(reads: &[RawBuf], writes: &[RawBuf]) -> bool {
    let mut spans: Vec<(usize, usize, bool)> = reads
        .iter()
        .map(|b| (b, true))
        .chain(writes.iter().map(|b| (b, false)))
        .filter(|(b, _)| b.len > 0)
        .map(|(b, is_read)| (b.ptr as usize, b.ptr as usize + b.len, is_read))
        .collect();
    spans.sort_unstable_by_key(|&(start, _, _)| start);
    // In start order, a span overlaps an earlier one of the other kind iff it starts before
    // the furthest end among them.
    let (mut read_end, mut write_end) = (0, 0);
    for (start, end, is_read) in spans {
        let (other_end, own_end) = if is_read {
            (write_end, &mut read_end)
        } else {
            (read_end, &mut write_end)
        };
        if start < other_end {
            return true;
        }
        *own_end = end.max(*own_end);
    }
    false
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every case through both ways of looking: pair by pair and by sorting.
    fn check(reads: &[RawBuf], writes: &[RawBuf], expected: bool, what: &str) {
        assert_eq!(any_overlap(reads, writes), expected, "pairwise: {what}");
        assert_eq!(
            overlap_by_sorting(reads, writes),
            expected,
            "sorted: {what}"
        );
    }

    #[test]
    fn overlap_is_found_between_reads_and_writes_only() {
        let mut mem = [0u8; 64];
        let base = mem.as_mut_ptr();
        // SAFETY: every view lies inside `mem`, and none is read or written.
        let at = |off: usize, len: usize| unsafe { RawBuf::new(base.add(off), len) };
        let (reads, writes) = ([at(0, 16), at(16, 16)], [at(32, 16), at(48, 16)]);
        check(&reads, &writes, false, "apart");
        check(&writes, &reads, false, "apart, swapped");
        check(
            &[at(0, 16), at(8, 16)],
            &[at(24, 8)],
            false,
            "reads may overlap reads",
        );
        check(
            &reads,
            &[at(31, 2)],
            true,
            "one shared byte at the end of a read",
        );
        check(&[at(40, 4)], &[at(32, 16)], true, "a read inside a write");
        check(&[at(0, 64)], &[at(60, 1)], true, "a write inside a read");
        check(
            &[at(0, 4), at(30, 2)],
            &[at(8, 40), at(10, 2)],
            true,
            "a short write after a long one: the furthest end counts, not the last",
        );
        check(
            &[at(8, 0)],
            &[at(0, 64)],
            false,
            "an empty read shares nothing",
        );
        check(&[at(0, 8)], &[at(0, 8)], true, "the same block");
    }

    #[test]
    fn many_blocks_are_sorted_and_agree_with_pairs() {
        let mut mem = [0u8; 256];
        let base = mem.as_mut_ptr();
        // SAFETY: every view lies inside `mem`, and none is read or written.
        let at = |off: usize, len: usize| unsafe { RawBuf::new(base.add(off), len) };
        // 9 x 9 pairs: past PAIRWISE_MAX, so any_overlap sorts.
        let reads: Vec<RawBuf> = (0..9).map(|i| at(i * 8, 8)).collect();
        let writes: Vec<RawBuf> = (0..9).map(|i| at(128 + i * 8, 8)).collect();
        assert!(reads.len() * writes.len() > PAIRWISE_MAX);
        assert!(!any_overlap(&reads, &writes));
        let mut touching = writes.clone();
        touching[4] = at(71, 1);
        assert!(
            any_overlap(&reads, &touching),
            "the last byte of the last read"
        );
        // Pseudo-random views: both ways agree.
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |bound: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % bound as u64) as usize
        };
        for _ in 0..500 {
            let (nr, nw) = (1 + next(12), 1 + next(12));
            let mut view = || {
                let off = next(240);
                at(off, next(16))
            };
            let reads: Vec<RawBuf> = (0..nr).map(|_| view()).collect();
            let writes: Vec<RawBuf> = (0..nw).map(|_| view()).collect();
            let pairwise = reads.iter().any(|r| writes.iter().any(|w| r.overlaps(w)));
            assert_eq!(overlap_by_sorting(&reads, &writes), pairwise);
        }
    }
}
