//! Transports: how bytes move between the ranks of a group.
//!
//! Algorithms are written against [`Transport`], so every transport (TCP today, shared memory
//! later, an in-memory one for tests) serves the same ring and tree code.

use std::time::Instant;

use crate::error::Result;
use crate::types::{CollectiveKind, DType, ReduceOp};

pub mod local;
pub mod shm;
pub mod tcp;

/// What every rank of one collective must agree on. It travels in every frame header, so a
/// rank that called a different collective, dtype, reduce op or element count is caught on
/// the first message, at no extra cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signature {
    pub kind: CollectiveKind,
    pub dtype: DType,
    /// The user's reduce op (also for ops that travel as SUM, like AVG).
    pub op: ReduceOp,
    /// Elements this collective moves per rank, as defined by each collective (e.g. the
    /// all_reduce tensor's numel). Ranks must agree on it.
    pub count: u64,
}

/// One collective in progress: its sequence number in the group, its signature, the kernel op
/// used by [`Op::RecvReduce`], and when it must have finished.
#[derive(Debug, Clone, Copy)]
pub struct OpCtx {
    pub seq: u64,
    pub sig: Signature,
    /// The elementwise op applied by `RecvReduce` (SUM for AVG and PREMUL_SUM).
    pub reduce: ReduceOp,
    pub deadline: Instant,
}

/// One transfer of an [`Transport::exchange`] step.
///
/// Messages between a pair of ranks are matched in order within a collective: the k-th `Send`
/// from a to b in collective `seq` is the k-th `Recv`/`RecvReduce` posted by b for a.
/// Lengths must match exactly; a zero-length message is still a message.
pub enum Op<'a> {
    /// Send `data` to `peer`.
    Send { peer: usize, data: &'a [u8] },
    /// Receive exactly `buf.len()` bytes from `peer` into `buf`.
    Recv { peer: usize, buf: &'a mut [u8] },
    /// Receive `buf.len()` bytes from `peer` and reduce them into `buf` elementwise with
    /// `ctx.reduce` over `ctx.sig.dtype` (`buf[i] = buf[i] op incoming[i]`).
    RecvReduce { peer: usize, buf: &'a mut [u8] },
}

/// Point-to-point and collective messaging between the ranks of one group.
pub trait Transport: Send {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;

    /// Runs all `ops` concurrently (sends never wait for this rank's receives) and returns
    /// once all completed, or with the first error. Errors: [`crate::Error::Network`] when a
    /// peer died or hung up, [`crate::Error::Backend`] on timeout or when a peer's header
    /// disagrees with `ctx.sig` (the message names both ranks and what differs).
    fn exchange(&mut self, ctx: &OpCtx, ops: &mut [Op<'_>]) -> Result<()>;

    /// Tagged point-to-point send, outside any collective's sequence.
    fn send_tagged(&mut self, peer: usize, tag: i64, data: &[u8], deadline: Instant) -> Result<()>;

    /// Receives a tagged message from `src` (any rank when `None`) into `buf`; returns the
    /// sender's rank. The message length must equal `buf.len()`.
    fn recv_tagged(
        &mut self,
        src: Option<usize>,
        tag: i64,
        buf: &mut [u8],
        deadline: Instant,
    ) -> Result<usize>;

    /// Tells every peer this group failed with `reason`, so that they fail fast too.
    fn abort(&mut self, reason: &str);

    /// Tells every peer this rank leaves the group cleanly.
    fn shutdown(&mut self);
}
