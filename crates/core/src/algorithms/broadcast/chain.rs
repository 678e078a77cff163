//! Pipelined chain broadcast for large messages: ranks form a chain starting at the root and
//! the buffer flows down it in segments; each step receives segment k from the predecessor
//! while forwarding segment k-1 to the successor. Every link carries the buffer once, so the
//! time is about one buffer transfer plus (n-2) segment transfers, independent of log2 n.

use crate::algorithms::common::{segments, send_recv_pair};
use crate::error::Result;
use crate::transport::{Op, OpCtx, Transport};

/// Bounds on a segment: at least 8 segments per buffer between them, so that every hop of the
/// chain has work early, and every step moves enough to amortise its exchange.
const MIN_SEGMENT_BYTES: usize = 64 << 10;
const MAX_SEGMENT_BYTES: usize = 512 << 10;

/// The segment size for a broadcast of `len` bytes.
pub fn segment_bytes(len: usize) -> usize {
    (len / 8).clamp(MIN_SEGMENT_BYTES, MAX_SEGMENT_BYTES)
}

/// Broadcasts `buf` from `root` in segments of at most `segment_bytes`.
pub fn broadcast(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    buf: &mut [u8],
    root: usize,
    segment_bytes: usize,
) -> Result<()> {
    let (n, r) = (t.size(), t.rank());
    let v = (r + n - root) % n;
    let prev = (r + n - 1) % n;
    let next = (v + 1 < n).then_some((r + 1) % n);
    let segs: Vec<_> = segments(buf.len(), 1, segment_bytes).collect();
    if v == 0 {
        if let Some(next) = next {
            for seg in segs {
                t.exchange(
                    ctx,
                    &mut [Op::Send {
                        peer: next,
                        data: &buf[seg],
                    }],
                )?;
            }
        }
        return Ok(());
    }
    // Step k receives segment k and forwards segment k-1.
    for k in 0..=segs.len() {
        let recv = segs.get(k).cloned().unwrap_or(0..0);
        let send = match (k, next) {
            (1.., Some(_)) => segs[k - 1].clone(),
            _ => 0..0,
        };
        let (data, rbuf) = send_recv_pair(buf, send, recv);
        let mut ops = Vec::with_capacity(2);
        if k < segs.len() {
            ops.push(Op::Recv {
                peer: prev,
                buf: rbuf,
            });
        }
        if let (1.., Some(peer)) = (k, next) {
            ops.push(Op::Send { peer, data });
        }
        if !ops.is_empty() {
            t.exchange(ctx, &mut ops)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::segment_bytes;

    #[test]
    fn segments_are_an_eighth_within_bounds() {
        assert_eq!(segment_bytes(0), 64 << 10);
        assert_eq!(segment_bytes(256 << 10), 64 << 10);
        assert_eq!(segment_bytes(2 << 20), 256 << 10);
        assert_eq!(segment_bytes(64 << 20), 512 << 10);
    }
}
