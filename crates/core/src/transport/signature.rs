//! The signature of a collective, below both the transport traits and the workspace that
//! stamps it into every step.

use crate::types::{CollectiveKind, DType, ReduceOp};

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
