//! Pieces shared by several algorithms: element partitions, disjoint borrows of one buffer,
//! the two ring phases over chunks of one buffer, and the steps of the shared-memory
//! algorithms.

use std::ops::Range;

use crate::algorithms::params::pair_reduces_into_own;
use crate::error::{Error, Result};
use crate::reduce::{accumulates_in_f32, reduce_in_f32, reduce_into};
use crate::transport::workspace::{SingleCopy, INLINE_BYTES, SLOT_BYTES};
use crate::transport::{Op, OpCtx, Peers, SharedMemory, Transport};

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

/// The workspace of `t`, or the error of a shared-memory algorithm forced (`RUSTDIST_ALGO`)
/// on a group whose ranks do not all share this host.
pub(crate) fn shared<'a>(
    t: &'a mut dyn Transport,
    ctx: &OpCtx,
) -> Result<&'a mut dyn SharedMemory> {
    let (size, kind) = (t.size(), ctx.sig.kind.name());
    match t.shared() {
        Some(ws) if ws.local_size() == size => Ok(ws),
        _ => Err(Error::Runtime(format!(
            "{kind}: a shared-memory algorithm needs every rank of the group on this host \
             (check RUSTDIST_ALGO)"
        ))),
    }
}

/// Whether `t`'s ranks share a workspace and may read each other's memory (what the
/// single-copy algorithms need), and whether each has a core.
pub(crate) fn single_copy_available(t: &mut dyn Transport) -> SingleCopy {
    match t.shared() {
        Some(ws) if ws.single_copy() && ws.oversubscribed() => SingleCopy::SharedCores,
        Some(ws) if ws.single_copy() => SingleCopy::CoreEach,
        _ => SingleCopy::Unavailable,
    }
}

/// The workspace of `t` when its ranks may read each other's memory, or the error of a
/// single-copy algorithm forced (`RUSTDIST_ALGO`) where they may not.
pub(crate) fn single_copy_workspace<'a>(
    t: &'a mut dyn Transport,
    ctx: &OpCtx,
) -> Result<&'a mut dyn SharedMemory> {
    let ws = shared(t, ctx)?;
    if !ws.single_copy() {
        return Err(Error::Runtime(format!(
            "{}: the single-copy algorithm needs ranks that may read each other's memory \
             (process_vm_readv); check RUSTDIST_ALGO",
            ctx.sig.kind.name()
        )));
    }
    Ok(ws)
}

/// Bytes that describe a block for single-copy reads: its address and length.
pub(crate) const BLOCK_AT_BYTES: usize = 16;

/// Where `block` lies, as peers read it back with [`read_block`].
pub(crate) fn block_at(block: &[u8]) -> [u8; BLOCK_AT_BYTES] {
    let mut at = [0u8; BLOCK_AT_BYTES];
    at[..8].copy_from_slice(&(block.as_ptr() as u64).to_le_bytes());
    at[8..].copy_from_slice(&(block.len() as u64).to_le_bytes());
    at
}

/// The (address, length) that [`block_at`] wrote into `at`.
pub(crate) fn parse_block_at(at: &[u8]) -> (usize, usize) {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&at[i..i + 8]);
        u64::from_le_bytes(w) as usize
    };
    (word(0), word(8))
}

/// Reads local rank `p`'s block, described by `at` (see [`block_at`]), into `dst` in one
/// copy; fails naming both ranks when it is not as long as `dst`.
pub(crate) fn read_block(
    ws: &dyn SharedMemory,
    ctx: &OpCtx,
    p: usize,
    at: &[u8],
    dst: &mut [u8],
) -> Result<()> {
    let addr = block_of_len(ws, ctx, p, at, dst.len())?;
    ws.read_from(ctx, p, addr, dst)
}

/// The address of local rank `p`'s block described by `at`; fails naming both ranks when
/// the block is not `expected` bytes long.
pub(crate) fn block_of_len(
    ws: &dyn SharedMemory,
    ctx: &OpCtx,
    p: usize,
    at: &[u8],
    expected: usize,
) -> Result<usize> {
    let (addr, len) = parse_block_at(at);
    if len != expected {
        return Err(Error::backend(format!(
            "{} mismatch between ranks: rank {} expected {expected} bytes from rank {} but it \
             sends {len} (collective #{})",
            ctx.sig.kind.name(),
            ws.group_rank(ws.local_rank()),
            ws.group_rank(p),
            ctx.seq
        )));
    }
    Ok(addr)
}

/// The last step of a single-copy algorithm: a rank returns (and its caller may touch its
/// input again) only once every rank has read what it needed.
pub(crate) fn all_read(ws: &mut dyn SharedMemory, ctx: &OpCtx) -> Result<()> {
    publish_empty(ws, ctx)?;
    wait_all(ws, ctx)
}

/// Publishes `data` (at most a slot) as this rank's contribution to the next step: in the
/// flag entry when it fits, else in the slot.
pub(crate) fn publish_data(ws: &mut dyn SharedMemory, ctx: &OpCtx, data: &[u8]) -> Result<()> {
    if data.len() <= INLINE_BYTES {
        ws.prepare_flag(ctx)?;
        ws.publish(data);
    } else {
        ws.prepare_data(ctx, data.len())?.copy_from_slice(data);
        ws.publish(&[]);
    }
    Ok(())
}

/// Publishes the next step without data (the rank only says it got there).
pub(crate) fn publish_empty(ws: &mut dyn SharedMemory, ctx: &OpCtx) -> Result<()> {
    ws.prepare_flag(ctx)?;
    ws.publish(&[]);
    Ok(())
}

/// Local rank `p`'s contribution of `len` bytes to the current step (see [`publish_data`]).
pub(crate) fn contribution(ws: &dyn SharedMemory, p: usize, len: usize) -> &[u8] {
    if len <= INLINE_BYTES {
        ws.inline(p, len)
    } else {
        ws.data(p, len)
    }
}

/// Reduces the current step's contributions of every local rank (`out.len()` bytes each, at
/// `at` in the slots when given, else published with [`publish_data`]) into `out`, in rank
/// order, so that every rank computing it gets the same bits (half precision accumulated in
/// f32, see [`reduce_in_f32`]). Two ranks' SUM or PRODUCT of published data is `out op=
/// theirs` on each (`out` holds this rank's own): commutative bit for bit but NaN payloads
/// (where both are NaN, each rank's result is a NaN of either), and rank 1 neither copies
/// rank 0's contribution nor reads its own back.
pub(crate) fn reduce_contributions(
    ws: &dyn SharedMemory,
    ctx: &OpCtx,
    out: &mut [u8],
    at: Option<usize>,
) -> Result<()> {
    let len = out.len();
    let part = |p: usize| match at {
        Some(off) => &ws.slot(p)[off..off + len],
        None => contribution(ws, p, len),
    };
    let (dtype, op, n) = (ctx.sig.dtype, ctx.reduce, ws.local_size());
    if accumulates_in_f32(dtype, op, n) {
        return reduce_in_f32(dtype, op, out, n, part);
    }
    if at.is_none() && pair_reduces_into_own(n, op) {
        return reduce_into(dtype, op, out, part(1 - ws.local_rank()));
    }
    if ws.local_rank() != 0 || at.is_some() {
        out.copy_from_slice(part(0));
    }
    for p in 1..ws.local_size() {
        reduce_into(ctx.sig.dtype, ctx.reduce, out, part(p))?;
    }
    Ok(())
}

/// Byte ranges of the pieces a shared-memory algorithm moves per step: `len` bytes in
/// pieces of at most `max` bytes (element-aligned, see [`segments`]); one empty piece for
/// an empty buffer is not a step, so there are none.
pub(crate) fn slot_pieces(len: usize, elem: usize, max: usize) -> Vec<Range<usize>> {
    segments(len, elem, max).collect()
}

/// Bytes of one of `n` equal regions of a slot (cache-line aligned), for algorithms that
/// give each rank a region.
pub(crate) fn region_bytes(n: usize, elem: usize) -> usize {
    let raw = SLOT_BYTES / n.max(1) / 64 * 64;
    (raw / elem).max(1) * elem
}

/// How many hosts the ranks sit on (`host_of`: host index per rank, numbered from 0).
pub(crate) fn host_count(host_of: &[usize]) -> usize {
    host_of.iter().max().map_or(0, |&h| h + 1)
}

/// The leader of every host, in host order: its lowest rank, or `root` on the root's host.
pub(crate) fn leaders(host_of: &[usize], root: Option<usize>) -> Vec<usize> {
    (0..host_count(host_of))
        .filter_map(|h| match root {
            Some(r) if host_of[r] == h => Some(r),
            _ => host_of.iter().position(|&x| x == h),
        })
        .collect()
}

/// The local index of group rank `rank` in workspace `ws` (0 when it is not local).
pub(crate) fn local_index(ws: &dyn SharedMemory, rank: usize) -> usize {
    (0..ws.local_size())
        .find(|&l| ws.group_rank(l) == rank)
        .unwrap_or(0)
}

/// Waits for every local rank's step.
pub(crate) fn wait_all(ws: &mut dyn SharedMemory, ctx: &OpCtx) -> Result<()> {
    ws.wait(ctx, Peers::All)
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
