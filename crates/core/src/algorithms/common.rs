//! Pieces shared by several algorithms: element partitions, disjoint borrows of one buffer,
//! and the two ring phases over chunks of one buffer.

use std::ops::Range;

use crate::error::Result;
use crate::transport::{Op, OpCtx, Transport};

/// Elements `[start, end)` of part `i` when `numel` elements are split into `parts` parts whose
/// sizes differ by at most one (the first `numel % parts` parts get the extra element).
pub(crate) fn part(numel: usize, parts: usize, i: usize) -> Range<usize> {
    let (base, rem) = (numel / parts, numel % parts);
    let start = i * base + i.min(rem);
    start..start + base + usize::from(i < rem)
}

/// Byte ranges of consecutive segments of at most `max_bytes` (rounded down to whole elements
/// of `elem` bytes, at least one element) covering `len` bytes. Empty for `len == 0`.
pub(crate) fn segments(
    len: usize,
    elem: usize,
    max_bytes: usize,
) -> impl Iterator<Item = Range<usize>> {
    let step = (max_bytes / elem).max(1) * elem;
    (0..len).step_by(step).map(move |s| s..(s + step).min(len))
}

/// Borrows two disjoint ranges of `buf`: one to send from, one to receive into.
pub(crate) fn send_recv_pair(
    buf: &mut [u8],
    send: Range<usize>,
    recv: Range<usize>,
) -> (&[u8], &mut [u8]) {
    if recv.is_empty() {
        return (&buf[send], &mut []);
    }
    if send.is_empty() {
        return (&[], &mut buf[recv]);
    }
    if send.end <= recv.start {
        let (lo, hi) = buf.split_at_mut(recv.start);
        (&lo[send], &mut hi[..recv.len()])
    } else {
        let (lo, hi) = buf.split_at_mut(send.start);
        (&hi[..send.len()], &mut lo[recv])
    }
}

/// Ring reduce-scatter over `chunks` (one per rank, disjoint ranges of `buf`): after n-1 steps
/// chunk `rank` holds the reduction over all ranks. Each step sends one chunk right and
/// reduces one arriving from the left in the same exchange.
pub(crate) fn ring_reduce_scatter(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    buf: &mut [u8],
    chunks: &[Range<usize>],
) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    for s in 0..n - 1 {
        let send = chunks[(r + 2 * n - 1 - s) % n].clone();
        let recv = chunks[(r + 2 * n - 2 - s) % n].clone();
        let (data, buf) = send_recv_pair(buf, send, recv);
        t.exchange(
            ctx,
            &mut [
                Op::Send { peer: right, data },
                Op::RecvReduce { peer: left, buf },
            ],
        )?;
    }
    Ok(())
}

/// Ring all-gather over `chunks` of `buf`: chunk `rank` is complete on entry, every chunk is
/// on exit.
pub(crate) fn ring_all_gather(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    buf: &mut [u8],
    chunks: &[Range<usize>],
) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    for s in 0..n - 1 {
        let send = chunks[(r + n - s) % n].clone();
        let recv = chunks[(r + 2 * n - 1 - s) % n].clone();
        let (data, buf) = send_recv_pair(buf, send, recv);
        t.exchange(
            ctx,
            &mut [Op::Send { peer: right, data }, Op::Recv { peer: left, buf }],
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_without_gaps() {
        for numel in [0, 1, 4, 5, 103] {
            for parts in 1..=6 {
                let mut next = 0;
                for i in 0..parts {
                    let p = part(numel, parts, i);
                    assert_eq!(p.start, next);
                    assert!(p.len() <= numel / parts + 1);
                    next = p.end;
                }
                assert_eq!(next, numel);
            }
        }
    }

    #[test]
    fn segments_are_element_aligned() {
        let s: Vec<_> = segments(20, 4, 10).collect();
        assert_eq!(s, vec![0..8, 8..16, 16..20]);
        assert_eq!(segments(0, 4, 10).count(), 0);
        assert_eq!(segments(6, 2, 1).count(), 3);
    }

    #[test]
    fn send_recv_pair_handles_order_and_empty_ranges() {
        let mut b: Vec<u8> = (0..10).collect();
        let (s, r) = send_recv_pair(&mut b, 6..9, 1..3);
        assert_eq!((s, &*r), (&[6u8, 7, 8][..], &[1u8, 2][..]));
        let (s, r) = send_recv_pair(&mut b, 5..5, 2..8);
        assert_eq!((s.len(), r.len()), (0, 6));
        let (s, r) = send_recv_pair(&mut b, 2..8, 5..5);
        assert_eq!((s.len(), r.len()), (6, 0));
    }
}
