//! The one place that picks an algorithm per collective, from the bytes it moves, the world
//! size and the links between the ranks ([`LinkKind`], and for TCP the [`LinkModel`]: latency
//! and bandwidth), unless the user forced one with `RUSTDIST_ALGO`.
//! `python -m rustdist.bench --show-selection` prints the table.
//!
//! Over TCP a latency-bound algorithm (recursive doubling, a binomial tree, the direct
//! exchange) and a bandwidth-bound one (the ring, the chain) cross where the bytes moved are a
//! multiple of the link's bandwidth-delay product (the alpha-beta model), so the TCP
//! thresholds, measured on loopback ([`LinkModel::REFERENCE`]), scale with the group's
//! bandwidth-delay product against that reference's.
//!
//! `RUSTDIST_ALGO` is a comma-separated list of `collective=algorithm` entries and bare
//! algorithm names; a bare name applies to every collective that has an algorithm of that name
//! (`RUSTDIST_ALGO=ring`, `RUSTDIST_ALGO=allreduce=ring,broadcast=binomial_tree`). Every rank
//! of a group must use the same setting. A shared-memory algorithm forced on a group whose
//! ranks do not all share a host fails when it runs.
//!
//! The parts:
//! - `policy`: the decisions, pure functions of (collective, link kind, world, bytes, CPU
//!   kind, link model, overrides) returning the choice;
//! - `thresholds`: the sizes the decisions compare against, one table per CPU kind and one
//!   for TCP, each with where it was measured (the measurements: `docs/tuning.md`);
//! - `cpu`: [`HostCpu`], from `/proc/cpuinfo`;
//! - `overrides`: `RUSTDIST_ALGO` ([`AlgoOverrides`] and the algorithm enums);
//! - `link_model`: [`LinkModel`] and [`Measured`], `RUSTDIST_LINK_LATENCY_US` and
//!   `RUSTDIST_LINK_BANDWIDTH`;
//! - `streams`: TCP streams per peer (`RUSTDIST_STREAMS_PER_PEER`);
//! - `table`: the `--show-selection` table.
//!
//! Dependencies run one way: the dispatcher (`algorithms/mod.rs`) uses `select` and hands the
//! algorithm it picked the parameters of the choice (`algorithms/params.rs`: the ring's
//! [`RingShape`], the leaders' algorithm of a hierarchical one); no algorithm uses `select`.
//! `select` uses `params`, `alltoall::single_copy` (`MAX_RANKS`) and the transport
//! ([`LinkKind`], [`SingleCopy`]); `algorithms/common.rs`, which the algorithms use, does not
//! use `select` (it takes [`SingleCopy`] from `transport::workspace`).
//!
//! [`RingShape`]: crate::algorithms::params::RingShape
//! [`LinkKind`]: crate::transport::LinkKind

mod cpu;
mod link_model;
mod overrides;
mod policy;
mod streams;
mod table;
mod thresholds;

#[cfg(test)]
mod tests;

/// Re-exported from the transport, where it is defined, for the paths that named it here.
pub use crate::transport::workspace::SingleCopy;
pub use cpu::HostCpu;
pub use link_model::{LinkModel, Measured, BANDWIDTH_ENV, LATENCY_ENV};
pub use overrides::{
    AlgoOverrides, AllGatherAlgo, AllReduceAlgo, AllToAllAlgo, BarrierAlgo, BroadcastAlgo,
    GatherAlgo, ReduceAlgo, ReduceScatterAlgo, ScatterAlgo, ENV_VAR,
};
pub use streams::{streams_per_peer, streams_setting, STREAMS_ENV};
pub use table::{table, Choice};
