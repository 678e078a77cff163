//! Ring all_reduce: reduce-scatter then all-gather around the ring, 2(n-1) steps per segment.
//!
//! Bandwidth-optimal: each rank sends and receives 2(n-1)/n of the buffer. Buffers larger
//! than n chunks of `chunk_bytes` run as consecutive segments, bounding per-step size. Each
//! chunk is reduced on exactly one path and then copied, so all ranks end bitwise equal.
//!
//! A step forwards what the step before received, so a rank that waits for a whole chunk
//! before sending on leaves its link idle for one latency per step. Where that matters (slow,
//! distant links) chunks travel in pieces and a rank keeps up to [`WINDOW`] pieces in
//! flight: it sends piece i + WINDOW - 1 while it receives piece i, which left sent that many
//! pieces earlier. With one piece per chunk every step is a single exchange (send right,
//! reduce from left), which the transport overlaps.

use std::ops::Range;

use crate::algorithms::common::{part, send_recv_pair};
use crate::algorithms::params::RingShape;
use crate::error::Result;
use crate::transport::{Op, OpCtx, Transport};

/// Pieces a rank has sent ahead of the one it receives, plus one. Two pieces ahead fit the
/// receiver's early-frame stash, so no sender can block on a receiver that waits for it.
pub const WINDOW: usize = 3;

/// All-reduces `buf` in place with `ctx.reduce`.
pub fn all_reduce(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    buf: &mut [u8],
    shape: RingShape,
) -> Result<()> {
    let n = t.size();
    if n == 1 {
        return Ok(());
    }
    let es = ctx.sig.dtype.size();
    let numel = buf.len() / es;
    let seg_elems = (shape.chunk_bytes / es).max(1) * n;
    let mut start = 0;
    while start < numel {
        let len = seg_elems.min(numel - start);
        let chunks: Vec<_> = (0..n)
            .map(|i| {
                let p = part(len, n, i);
                (start + p.start) * es..(start + p.end) * es
            })
            .collect();
        // Every rank computes the same count from the same (largest) chunk.
        let parts = (chunks[0].len().div_ceil(shape.piece_bytes.max(es))).max(1);
        segment(t, ctx, buf, &chunks, parts)?;
        start += len;
    }
    Ok(())
}

/// One segment as a stream of 2(n-1) steps of `parts` pieces: piece i is part i % parts of
/// step i / parts, reduce-scatter steps first. Sending piece i needs piece i - parts
/// received (the same part, one step earlier), so up to `parts` pieces may be in flight.
fn segment(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    buf: &mut [u8],
    chunks: &[Range<usize>],
    parts: usize,
) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let es = ctx.sig.dtype.size();
    let total = 2 * (n - 1) * parts;
    let reduces = |i: usize| i / parts < n - 1;
    // The chunk a step sends; it receives the one before it on the ring. After n-1
    // reduce-scatter steps rank r holds chunk r reduced, which the all-gather sends first.
    let sent_chunk = |step: usize| match step.checked_sub(n - 1) {
        None => (r + 2 * n - 1 - step) % n,
        Some(gather) => (r + n - gather) % n,
    };
    let piece = |i: usize, chunk: usize| {
        let c = &chunks[chunk];
        let e = part(c.len() / es, parts, i % parts);
        c.start + e.start * es..c.start + e.end * es
    };
    let sent = |i: usize| piece(i, sent_chunk(i / parts));
    let received = |i: usize| piece(i, (sent_chunk(i / parts) + n - 1) % n);
    let ahead = parts.min(WINDOW) - 1;
    // The first pieces of the first step are this rank's own data: nothing to wait for.
    for i in 0..ahead {
        let data = &buf[sent(i)];
        t.exchange(ctx, &mut [Op::Send { peer: right, data }])?;
    }
    for i in 0..total {
        let next = i + ahead;
        let send = if next < total { sent(next) } else { 0..0 };
        let (data, into) = send_recv_pair(buf, send, received(i));
        let recv = if reduces(i) {
            Op::RecvReduce {
                peer: left,
                buf: into,
            }
        } else {
            Op::Recv {
                peer: left,
                buf: into,
            }
        };
        if next < total {
            t.exchange(ctx, &mut [Op::Send { peer: right, data }, recv])?;
        } else {
            t.exchange(ctx, &mut [recv])?;
        }
    }
    Ok(())
}
