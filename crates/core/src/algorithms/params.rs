//! The parameters a choice carries into the algorithm it picks: the policy (`select`) computes
//! them and the dispatcher passes them on, so the algorithms never ask the policy themselves.

use crate::types::ReduceOp;

/// Whether a shared-memory all_reduce of `ranks` ranks has each rank reduce the other's
/// contribution into its own buffer (one-shot and two-shot alike): two ranks, SUM or PRODUCT,
/// which commute bit for bit but NaN payloads. It copies less, so the policy's crossovers
/// differ too.
pub fn pair_reduces_into_own(ranks: usize, op: ReduceOp) -> bool {
    ranks == 2 && matches!(op, ReduceOp::Sum | ReduceOp::Product)
}

/// How the ring all_reduce cuts a buffer (`AlgoOverrides::ring_shape` gives the policy's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingShape {
    /// Bound on one rank's chunk of a segment.
    pub chunk_bytes: usize,
    /// Bound on one message: a chunk travels in pieces of at most this.
    pub piece_bytes: usize,
}

/// The all_reduce the hosts' leaders of a hierarchical all_reduce run among themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeadersAllReduce {
    RecursiveDoubling,
    Ring(RingShape),
}

/// The all_gather the hosts' leaders of a hierarchical all_gather run among themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeadersAllGather {
    Bruck,
    Direct,
    Ring,
}

/// The broadcast the hosts' leaders of a hierarchical broadcast run among themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeadersBroadcast {
    BinomialTree,
    Chain,
}
