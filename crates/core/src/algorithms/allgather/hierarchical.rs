//! Hierarchical all_gather for groups spread over hosts with several ranks each: an
//! all_gather in shared memory on each host, an all_gather of every host's blocks between the
//! hosts' leaders (their lowest ranks) over TCP, and a shared-memory broadcast of the other
//! hosts' blocks from each leader.

use crate::algorithms::common::leaders;
use crate::algorithms::params::LeadersAllGather;
use crate::error::Result;
use crate::transport::members::Members;
use crate::transport::{Op, OpCtx, Transport};

/// `blocks[rank]` holds this rank's data; fills `blocks[r]` with rank r's. The leaders run
/// `between` among themselves.
pub fn all_gather(
    t: &mut dyn Transport,
    ctx: &OpCtx,
    blocks: &mut [&mut [u8]],
    between: LeadersAllGather,
) -> Result<()> {
    let host_of = t.host_of().to_vec();
    let me = t.rank();
    let here = host_of[me];
    if let Some(ws) = t.shared() {
        let mut local: Vec<&mut [u8]> = blocks
            .iter_mut()
            .zip(&host_of)
            .filter(|(_, &h)| h == here)
            .map(|(b, _)| &mut **b)
            .collect();
        super::shm::on_host(ws, ctx, None, &mut local)?;
    }
    let leaders = leaders(&host_of, None);
    if let Some(i) = leaders.iter().position(|&l| l == me) {
        if leaders.len() > 1 {
            let view = &mut Members::new(t, &leaders, i);
            match between {
                LeadersAllGather::Direct => exchange_directly(view, ctx, blocks, &host_of)?,
                LeadersAllGather::Bruck => by_host(ctx, blocks, &host_of, i, |c, b| {
                    super::bruck::all_gather(view, c, b)
                })?,
                LeadersAllGather::Ring => by_host(ctx, blocks, &host_of, i, |c, b| {
                    super::ring::all_gather(view, c, b)
                })?,
            }
        }
    }
    if let Some(ws) = t.shared() {
        for (q, b) in blocks.iter_mut().enumerate() {
            if host_of[q] != here {
                crate::algorithms::broadcast::shm::on_host(ws, ctx, b, 0)?;
            }
        }
    }
    Ok(())
}

/// Every block of this leader's host sent to every other leader, as it lies (no copies): for
/// the few hosts where the direct exchange wins. Leader `h` is host `h`'s.
fn exchange_directly(
    view: &mut Members<'_>,
    ctx: &OpCtx,
    blocks: &mut [&mut [u8]],
    host_of: &[usize],
) -> Result<()> {
    let (i, hosts) = (view.rank(), view.size());
    // Per pair of leaders, the messages match in rank order on both sides.
    let mut ops: Vec<Op<'_>> = Vec::new();
    for (q, b) in blocks.iter_mut().enumerate() {
        if host_of[q] == i {
            let data: &[u8] = b;
            ops.extend(
                (0..hosts)
                    .filter(|&j| j != i)
                    .map(|peer| Op::Send { peer, data }),
            );
        } else {
            ops.push(Op::Recv {
                peer: host_of[q],
                buf: b,
            });
        }
    }
    view.exchange(ctx, &mut ops)
}

/// `gather` (Bruck's or the ring) run among the leaders on one block per host: this leader's
/// host's blocks (host `here`) packed in rank order, the others' unpacked when they arrive.
/// A copy of the gathered bytes more than the direct exchange, for few peers per leader.
fn by_host(
    ctx: &OpCtx,
    blocks: &mut [&mut [u8]],
    host_of: &[usize],
    here: usize,
    gather: impl FnOnce(&OpCtx, &mut [&mut [u8]]) -> Result<()>,
) -> Result<()> {
    let hosts = host_of.iter().max().map_or(0, |&h| h + 1);
    let mut packed: Vec<Vec<u8>> = vec![Vec::new(); hosts];
    for (b, &h) in blocks.iter().zip(host_of) {
        let p = &mut packed[h];
        if h == here {
            p.extend_from_slice(b);
        } else {
            p.resize(p.len() + b.len(), 0);
        }
    }
    let mut views: Vec<&mut [u8]> = packed.iter_mut().map(|p| p.as_mut_slice()).collect();
    gather(ctx, &mut views)?;
    let mut at = vec![0usize; hosts];
    for (b, &h) in blocks.iter_mut().zip(host_of) {
        if h != here {
            b.copy_from_slice(&packed[h][at[h]..at[h] + b.len()]);
        }
        at[h] += b.len();
    }
    Ok(())
}
