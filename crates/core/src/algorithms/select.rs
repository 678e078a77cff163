//! The one place that picks an algorithm per collective, from the bytes it moves, the world
//! size and the links between the ranks ([`LinkKind`], and for TCP the [`LinkModel`]: latency
//! and bandwidth), unless the user forced one with `RUSTDIST_ALGO`.
//! `python -m rustdist.bench --show-selection` prints the table.
//!
//! Over TCP a latency-bound algorithm (recursive doubling, a binomial tree, the direct
//! exchange) and a bandwidth-bound one (the ring, the chain) cross where the bytes moved are a
//! multiple of the link's bandwidth-delay product (the alpha-beta model), so the TCP
//! thresholds below, measured on loopback ([`LinkModel::REFERENCE`]), scale with the group's
//! bandwidth-delay product against that reference's.
//!
//! `RUSTDIST_ALGO` is a comma-separated list of `collective=algorithm` entries and bare
//! algorithm names; a bare name applies to every collective that has an algorithm of that name
//! (`RUSTDIST_ALGO=ring`, `RUSTDIST_ALGO=allreduce=ring,broadcast=binomial_tree`). Every rank
//! of a group must use the same setting. A shared-memory algorithm forced on a group whose
//! ranks do not all share a host fails when it runs.

use std::time::Duration;

use crate::algorithms::allreduce::ring::RingShape;
use crate::error::{Error, Result};
use crate::transport::LinkKind;

/// The environment variable holding the overrides.
pub const ENV_VAR: &str = "RUSTDIST_ALGO";
/// The environment variables that configure the TCP link model (else: what connecting
/// measured, see [`Measured`]).
pub const LATENCY_ENV: &str = "RUSTDIST_LINK_LATENCY_US";
pub const BANDWIDTH_ENV: &str = "RUSTDIST_LINK_BANDWIDTH";
/// The environment variable that sets how many TCP streams join a rank to each peer on
/// another host (`auto` or unset: [`LinkModel::streams`]).
pub const STREAMS_ENV: &str = "RUSTDIST_STREAMS_PER_PEER";
/// The most streams per peer `RUSTDIST_STREAMS_PER_PEER` may ask for.
const MAX_STREAMS: usize = 16;

/// What selection knows of a group's TCP links (the same on every rank of the group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkModel {
    /// One-way latency of a small message.
    pub latency: Duration,
    /// Bytes per second one connection moves.
    pub bandwidth: u64,
}

/// What connecting measured of a group's TCP links, the same on every rank (None: not
/// measured, e.g. no link joins two hosts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Measured {
    /// Half the shortest handshake round trip.
    pub latency: Option<Duration>,
    /// The slowest link between hosts, bytes per second.
    pub bandwidth: Option<u64>,
}

impl Default for LinkModel {
    fn default() -> Self {
        LinkModel::REFERENCE
    }
}

impl LinkModel {
    /// TCP loopback between processes on this project's 2-core VM, where the TCP thresholds
    /// were measured: half the connect handshake's round trip, and one stream's rate.
    pub const REFERENCE: LinkModel = LinkModel {
        latency: Duration::from_micros(40),
        bandwidth: 2_000_000_000,
    };

    /// A measured latency below this is mostly scheduling noise (loopback's handshakes take
    /// 35-110 us here): the reference's stands in, so that selection does not wander between
    /// runs. Above it the link is slow or far, and the measurement counts.
    const MEASURED_LATENCY_MIN: Duration = Duration::from_micros(160);
    /// Links slower than this (half the reference's) limit a collective more than the hosts
    /// do.
    const SLOW_BANDWIDTH: u64 = Self::REFERENCE.bandwidth / 2;
    /// A measured bandwidth counts only below this: a probe of a fast link is bound by the
    /// hosts (an unshaped veth pair times at 0.8-1 GB/s on the reference VM, a 10 Gbit/s one
    /// at 0.8-2), and selection must not wander between runs. Slower, the link limits and
    /// times true (1 Gbit/s at 119-128 MB/s).
    const MEASURED_BANDWIDTH_MAX: u64 = Self::REFERENCE.bandwidth / 4;

    /// The model with `RUSTDIST_LINK_LATENCY_US` and `RUSTDIST_LINK_BANDWIDTH` applied over
    /// what was `measured` (None, a latency under 160 us or a bandwidth over 500 MB/s: the
    /// reference's).
    pub fn from_env(measured: Measured) -> Result<LinkModel> {
        Self::from_settings(
            std::env::var(LATENCY_ENV).ok(),
            std::env::var(BANDWIDTH_ENV).ok(),
            measured,
        )
    }

    /// [`LinkModel::from_env`] with the variables' values given.
    fn from_settings(
        latency_us: Option<String>,
        bandwidth: Option<String>,
        measured: Measured,
    ) -> Result<LinkModel> {
        let latency = match latency_us {
            Some(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|us| us.is_finite() && *us > 0.0)
                .map(|us| Duration::from_secs_f64(us * 1e-6))
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "{LATENCY_ENV} must be a positive number of microseconds, not {v:?}"
                    ))
                })?,
            None => measured
                .latency
                .filter(|l| *l >= Self::MEASURED_LATENCY_MIN)
                .unwrap_or(Self::REFERENCE.latency),
        };
        let bandwidth = match bandwidth {
            Some(v) => parse_rate(&v).ok_or_else(|| {
                Error::invalid(format!(
                    "{BANDWIDTH_ENV} must be a rate such as 1gbit, 25gbit, 800mbit or 1.5GB                      (bytes per second), not {v:?}"
                ))
            })?,
            None => measured
                .bandwidth
                .filter(|&b| b > 0 && b < Self::MEASURED_BANDWIDTH_MAX)
                .unwrap_or(Self::REFERENCE.bandwidth),
        };
        Ok(LinkModel { latency, bandwidth })
    }

    /// Most streams per peer chosen by [`LinkModel::streams`]: a link that needs more is far
    /// beyond what these are for, and every stream costs a socket on both ends.
    const MAX_AUTO_STREAMS: usize = 8;

    /// Streams to each peer on another host, so that together they keep a round trip's worth
    /// of the link's bandwidth in flight when one stream holds at most `window` bytes (TCP
    /// sends no more than its buffers hold before the acknowledgement comes back): 1 where one
    /// stream fills the link, as on a LAN, more on a long fast link (1 Gbit/s 20 ms away with
    /// 4 MiB send buffers: 3).
    pub fn streams(&self, window: u64) -> usize {
        let in_flight = 2.0 * self.bdp();
        ((in_flight / window.max(1) as f64).ceil() as usize).clamp(1, Self::MAX_AUTO_STREAMS)
    }

    /// The bandwidth-delay product in bytes: what the link holds in flight.
    fn bdp(&self) -> f64 {
        self.latency.as_secs_f64() * self.bandwidth as f64
    }

    /// `reference_bytes`, a TCP crossover measured on [`LinkModel::REFERENCE`], on this link:
    /// scaled by the ratio of the bandwidth-delay products (within 1/64x..64x).
    fn scale(&self, reference_bytes: usize) -> usize {
        let factor = (self.bdp() / Self::REFERENCE.bdp()).clamp(1.0 / 64.0, 64.0);
        (reference_bytes as f64 * factor) as usize
    }
}

/// `RUSTDIST_STREAMS_PER_PEER` as a count of streams, None when unset or `auto` (chosen from
/// the link); anything else than 1 to 16 is an error naming the variable.
pub fn streams_setting() -> Result<Option<usize>> {
    parse_streams(std::env::var(STREAMS_ENV).ok().as_deref())
}

fn parse_streams(value: Option<&str>) -> Result<Option<usize>> {
    let Some(v) = value
        .map(str::trim)
        .filter(|v| !v.is_empty() && *v != "auto")
    else {
        return Ok(None);
    };
    match v.parse::<usize>() {
        Ok(n) if (1..=MAX_STREAMS).contains(&n) => Ok(Some(n)),
        _ => Err(Error::invalid(format!(
            "{STREAMS_ENV} must be auto or a number of streams from 1 to {MAX_STREAMS}, not {v:?}"
        ))),
    }
}

/// Streams to each peer on another host: `RUSTDIST_STREAMS_PER_PEER` when set, else what the
/// link model (the configured one over what connecting `measured`) needs with one stream
/// holding `window` bytes.
pub fn streams_per_peer(measured: Measured, window: u64) -> Result<usize> {
    match streams_setting()? {
        Some(n) => Ok(n),
        None => Ok(LinkModel::from_env(measured)?.streams(window)),
    }
}

/// Bytes per second of a rate written as tc writes them: `1gbit`, `800mbit`, `100kbit` (bits),
/// `1.5GB`, `200MB`, `64KB` (bytes), or a plain number of bytes per second.
fn parse_rate(text: &str) -> Option<u64> {
    let t = text.trim().to_ascii_lowercase();
    let units: [(&str, f64); 7] = [
        ("gbit", 1e9 / 8.0),
        ("mbit", 1e6 / 8.0),
        ("kbit", 1e3 / 8.0),
        ("gb", 1e9),
        ("mb", 1e6),
        ("kb", 1e3),
        ("", 1.0),
    ];
    let (number, unit) = units
        .iter()
        .find_map(|&(suffix, unit)| t.strip_suffix(suffix).map(|n| (n, unit)))?;
    let rate = number.trim().parse::<f64>().ok()? * unit;
    (rate.is_finite() && rate >= 1.0).then_some(rate as u64)
}

/// Over TCP, all_reduce up to this many bytes uses recursive doubling (fewer steps), above it
/// the ring (less data per rank); a quarter of it on 2 ranks, where the ring has only 2 steps.
/// Measured over TCP loopback (benches/allreduce.rs): RD wins at 4 KiB everywhere and at
/// 256 KiB on 4 ranks; the ring wins at 256 KiB on 2 ranks and from 4 MiB on.
const TCP_ALL_REDUCE_RD_MAX_BYTES: usize = 256 << 10;
/// On links where the hosts limit (loopback, and links at least half the reference's
/// bandwidth), a step of the ring all_reduce moves at most this many bytes each way (scaled
/// with the bandwidth-delay product): a step's buffers, sent, received, reduced and sent on,
/// then stay in the core's cache. Over loopback on the
/// Intel Xeon VM (2 cores, 2 MiB L2 each), ring all_reduce against gloo in the same runs: 64
/// MiB at world 2 1.5x-1.6x with 1 MiB chunks, 2.6x with 128 KiB; world 3 0.95x with 16 MiB
/// chunks, 1.7x; world 4 1.1x, 1.4x-1.6x; 2 MiB at world 2 takes 445 us against 850 us with
/// 256 KiB-1 MiB chunks (the step in between, 192 KiB, already as slow).
const RING_CHUNK_BYTES: usize = 128 << 10;
/// Chunks of the ring all_reduce on slow links, where they travel in pieces (below).
const RING_CHUNK_BYTES_SLOW_LINK: usize = 16 << 20;
/// On links slower than half the reference's bandwidth, where the network limits and the
/// hosts have time to spare, ring chunks travel in pieces of at least this many bytes (and at
/// least one bandwidth-delay product, so that the pieces in flight cover the latency): a rank
/// forwards each piece as it arrives, which keeps every link busy. As whole chunks of 256 KiB,
/// 64 MiB at 1 Gbit/s on 8 ranks moved at 94% of the link against 88% with 16 MiB chunks, but
/// 0.5-1 ms away each step idled its link for a latency (0.87x-0.93x gloo at 16 MiB).
const RING_PIECE_BYTES_SLOW_LINK: usize = 256 << 10;

/// Over TCP, broadcast from this many bytes on (and from one bandwidth-delay product), with
/// at least 3 ranks, uses the chain, on links slower than half the reference's bandwidth:
/// there the network limits, and the chain sends each byte over the root's link once, where
/// the binomial tree's root sends it once per child. On 1 Gbit/s links 1 ms away the chain was
/// ahead of the tree from 32 KiB at worlds 4 and 8 (256 KiB: 2.6 against 5.2 ms at world 4,
/// 4.4 against 11.4 ms at world 8, calls back to back).
const TCP_BROADCAST_CHAIN_MIN_BYTES: usize = 64 << 10;
/// On loopback and links as fast, where the hosts limit, the chain from this many bytes on
/// (at least 3 ranks): each rank forwards a segment while it is still in its cache, where a
/// tree's inner rank sends the whole buffer on after receiving all of it. Against gloo in the
/// same runs over loopback on the Intel Xeon VM (world 4): 4 MiB 1.55x against the tree's
/// 1.43x, 16 MiB 1.41x against 1.22x, 64 MiB 1.40x against 1.12x; at world 3 the tree is
/// still ahead at 4 MiB (1.25x against 1.18x), the chain at 8 MiB (1.31x against 1.23x).
const TCP_BROADCAST_CHAIN_HOST_BOUND_MIN_BYTES: usize = 8 << 20;
/// Over TCP, all_gather up to this many bytes in total uses the direct exchange.
const TCP_ALL_GATHER_DIRECT_MAX_BYTES: usize = 256 << 10;
/// The CPU of the host, on which the band of all_gathers that read the peers' inputs straight
/// from their memory (one copy by the kernel instead of two through the slots) depends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HostCpu {
    Intel,
    #[default]
    Other,
}

impl HostCpu {
    /// This host's, from `vendor_id` in /proc/cpuinfo (read once).
    pub fn of_this_host() -> HostCpu {
        static CPU: std::sync::OnceLock<HostCpu> = std::sync::OnceLock::new();
        *CPU.get_or_init(|| {
            let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
            HostCpu::from_cpuinfo(&info)
        })
    }

    fn from_cpuinfo(info: &str) -> HostCpu {
        let vendor = info
            .lines()
            .find_map(|l| l.strip_prefix("vendor_id"))
            .and_then(|rest| rest.split(':').nth(1))
            .map(str::trim);
        match vendor {
            Some("GenuineIntel") => HostCpu::Intel,
            _ => HostCpu::Other,
        }
    }

    /// From how many bytes an all_reduce in shared memory (past the one-shot's sizes) has every
    /// rank reduce its slice from the same slice of the peers' buffers, read straight from
    /// their memory, where the ranks may. World 2 on an Intel Xeon VM: 1.1-1.4x the slots'
    /// two-shot from 2 to 64 MiB, level at 1 MiB and behind below it; not measured on other
    /// CPUs, which keep the slots.
    pub fn single_copy_all_reduce_min_bytes(self) -> Option<usize> {
        match self {
            HostCpu::Intel => Some(2 << 20),
            HostCpu::Other => None,
        }
    }

    /// From how many bytes per rank an all_to_all of equal blocks in shared memory has every
    /// rank read its block straight from each peer's input, where the ranks may. World 2 on an
    /// Intel Xeon VM: 1.4x-2.6x the slots' speed from 32 KiB to 64 MiB, level at 8 KiB (with
    /// more ranks than cores, from 256 KiB: see `SHARED_CORES_SINGLE_COPY_ALL_TO_ALL_MIN_BYTES`).
    /// On an AMD EPYC VM it was faster only at 256 KiB (1.28x) and 0.82x-0.96x from 512 KiB
    /// at world 2, so other CPUs keep the slots.
    pub fn single_copy_all_to_all_min_bytes(self) -> Option<usize> {
        match self {
            HostCpu::Intel => Some(32 << 10),
            HostCpu::Other => None,
        }
    }

    /// A broadcast of this many bytes in shared memory copies straight between the root's
    /// memory and the others' where the ranks may (the readers read, the root writes each
    /// its own segment). World 2 on an Intel Xeon VM: 1.2x-3.5x the slots' speed from 16 KiB
    /// to 64 MiB (the slots' two copies of a piece run one after the other; the root's core
    /// now copies as much as the reader's), and behind below (1.6 against 0.8-1.2 us at 2-8
    /// KiB). On other CPUs the band is all_gather's where it overlaps this one, unmeasured for
    /// broadcast (and measured before the root wrote its share).
    pub fn single_copy_broadcast_bytes(self) -> std::ops::RangeInclusive<usize> {
        match self {
            HostCpu::Intel => (16 << 10)..=usize::MAX,
            HostCpu::Other => (256 << 10)..=(1 << 20),
        }
    }

    /// An all_gather of this many bytes (gathered) in shared memory reads every peer's input
    /// straight from its memory where the ranks may. World 2, an A/B of one build on each of
    /// two 2-core VMs: on an AMD EPYC, single copy ran 1.2-1.4x the slots' speed from 256 KiB
    /// to 4 MiB, below that the slots (in cache) cost less than the system calls, and above
    /// it the slots' pipelined 1 MiB pieces ran 1.0-1.3x faster (the kernel pins every page
    /// it copies from); on an Intel Xeon single copy ran 1.6-1.9x faster from 32 KiB to 256
    /// KiB and 1.15-1.25x from 4 to 16 MiB, level at 16 KiB and 64 MiB.
    pub fn single_copy_bytes(self) -> std::ops::RangeInclusive<usize> {
        match self {
            HostCpu::Intel => (32 << 10)..=(16 << 20),
            HostCpu::Other => (256 << 10)..=(4 << 20),
        }
    }
}

/// Whether the ranks of a host may read each other's memory (the single-copy algorithms), and
/// whether each has a core of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SingleCopy {
    Unavailable,
    /// More ranks on the host than cores: a rank waiting for a peer on its own core yields
    /// it, and the kernel charges the yielder CPU time until the peer has had its share, so
    /// an algorithm that waits for every rank after every read costs twice its copies. With
    /// 4 ranks on 2 cores of an Intel Xeon VM, all_gather and broadcast read straight from
    /// the peers ran 0.55x-0.75x the slots' speed from 32 KiB to 2 MiB and all_reduce level;
    /// all_to_all, whose slots copy every block twice, 1.5x-1.6x from 256 KiB per rank (see
    /// `SHARED_CORES_SINGLE_COPY_ALL_TO_ALL_MIN_BYTES`).
    SharedCores,
    CoreEach,
}

/// With more ranks than cores, single-copy all_to_all starts at this many bytes per rank at
/// the least: 4 ranks on 2 cores of an Intel Xeon VM ran it 0.7x the slots' speed at 32 KiB,
/// level at 128 KiB, 1.5x-1.6x from 256 KiB to 64 MiB.
const SHARED_CORES_SINGLE_COPY_ALL_TO_ALL_MIN_BYTES: usize = 256 << 10;

/// In shared memory, all_reduce up to this many bytes per rank runs one-shot (every rank
/// reduces every contribution); above it each rank reduces a slice (two-shot).
const SHM_ALL_REDUCE_ONESHOT_MAX_BYTES: usize = 64 << 10;

/// An algorithm choice for one collective, named as in `RUSTDIST_ALGO`.
trait Algo: Copy + 'static {
    const COLLECTIVE: &'static str;
    const CHOICES: &'static [(&'static str, Self)];
}

macro_rules! algo_enum {
    ($(#[$m:meta])* $name:ident, $coll:literal, { $($var:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($var),+ }
        impl Algo for $name {
            const COLLECTIVE: &'static str = $coll;
            const CHOICES: &'static [(&'static str, Self)] = &[$(($s, $name::$var)),+];
        }
        impl $name {
            /// The name used in `RUSTDIST_ALGO`.
            pub fn name(self) -> &'static str {
                match self { $($name::$var => $s),+ }
            }
        }
    };
}

algo_enum!(
    /// all_reduce algorithms.
    AllReduceAlgo, "all_reduce", {
        Ring = "ring",
        RecursiveDoubling = "recursive_doubling",
        ShmOneShot = "shm_oneshot",
        ShmTwoShot = "shm_twoshot",
        ShmSingleCopy = "shm_single_copy",
        Hierarchical = "hierarchical",
    }
);
algo_enum!(
    /// broadcast algorithms.
    BroadcastAlgo, "broadcast", {
        BinomialTree = "binomial_tree",
        Chain = "chain",
        Shm = "shm",
        SingleCopy = "shm_single_copy",
        Hierarchical = "hierarchical",
    }
);
algo_enum!(
    /// all_gather algorithms (blocks of any sizes).
    AllGatherAlgo, "all_gather", {
        Ring = "ring",
        Direct = "direct",
        Shm = "shm",
        SingleCopy = "shm_single_copy",
        Hierarchical = "hierarchical",
    }
);
algo_enum!(
    /// reduce_scatter algorithms.
    ReduceScatterAlgo, "reduce_scatter", { Ring = "ring", Shm = "shm" }
);
algo_enum!(
    /// reduce algorithms.
    ReduceAlgo, "reduce", {
        BinomialTree = "binomial_tree",
        Shm = "shm",
        Hierarchical = "hierarchical",
    }
);
algo_enum!(
    /// gather algorithms.
    GatherAlgo, "gather", { Direct = "direct", Shm = "shm" }
);
algo_enum!(
    /// scatter algorithms.
    ScatterAlgo, "scatter", { Direct = "direct", Shm = "shm" }
);
algo_enum!(
    /// all_to_all algorithms (blocks of any sizes).
    AllToAllAlgo, "all_to_all", {
        Pairwise = "pairwise",
        Shm = "shm",
        SingleCopy = "shm_single_copy",
    }
);
algo_enum!(
    /// barrier algorithms.
    BarrierAlgo, "barrier", {
        Dissemination = "dissemination",
        Shm = "shm",
        Hierarchical = "hierarchical",
    }
);

/// Algorithms forced by the user, per collective (`None` lets the policy below decide), and
/// the TCP link model the policy reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AlgoOverrides {
    pub tcp: LinkModel,
    pub cpu: HostCpu,
    pub all_reduce: Option<AllReduceAlgo>,
    pub broadcast: Option<BroadcastAlgo>,
    pub all_gather: Option<AllGatherAlgo>,
    pub reduce_scatter: Option<ReduceScatterAlgo>,
    pub reduce: Option<ReduceAlgo>,
    pub gather: Option<GatherAlgo>,
    pub scatter: Option<ScatterAlgo>,
    pub all_to_all: Option<AllToAllAlgo>,
    pub barrier: Option<BarrierAlgo>,
}

fn lookup<A: Algo>(name: &str) -> Option<A> {
    A::CHOICES.iter().find(|(n, _)| *n == name).map(|&(_, a)| a)
}

fn choices<A: Algo>() -> String {
    let names: Vec<_> = A::CHOICES.iter().map(|(n, _)| *n).collect();
    format!("{}={}", A::COLLECTIVE, names.join("|"))
}

/// Sets `slot` from `name`; with `keyed` an unknown name is an error, otherwise it reports
/// whether the name applied.
fn assign<A: Algo>(slot: &mut Option<A>, name: &str, keyed: bool) -> Result<bool> {
    match lookup::<A>(name) {
        Some(a) => {
            *slot = Some(a);
            Ok(true)
        }
        None if keyed => Err(Error::invalid(format!(
            "{ENV_VAR}: unknown {} algorithm '{name}'; valid choices: {}",
            A::COLLECTIVE,
            choices::<A>()
        ))),
        None => Ok(false),
    }
}

impl AlgoOverrides {
    /// Reads `RUSTDIST_ALGO` (unset or empty means no overrides) and the configured link
    /// model over what was `measured` (see [`LinkModel::from_env`]).
    pub fn from_env(measured: Measured) -> Result<Self> {
        let o = match std::env::var(ENV_VAR) {
            Ok(spec) => Self::parse(&spec)?,
            Err(std::env::VarError::NotPresent) => Self::default(),
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(Error::invalid(format!("{ENV_VAR} is not valid UTF-8")))
            }
        };
        // Checked here too, so that a bad value fails on every rank before connecting.
        streams_setting()?;
        Ok(AlgoOverrides {
            tcp: LinkModel::from_env(measured)?,
            cpu: HostCpu::of_this_host(),
            ..o
        })
    }

    /// Sets the override(s) `name` names: for `coll` only (`keyed`), or for every collective
    /// that has an algorithm of that name. Returns whether any applied.
    fn apply(&mut self, coll: Option<&str>, name: &str) -> Result<bool> {
        let keyed = coll.is_some();
        let wants = |c: &str| coll.is_none_or(|k| k == c);
        let mut hit = false;
        if wants("allreduce") {
            hit |= assign(&mut self.all_reduce, name, keyed)?;
        }
        if wants("broadcast") {
            hit |= assign(&mut self.broadcast, name, keyed)?;
        }
        if wants("allgather") {
            hit |= assign(&mut self.all_gather, name, keyed)?;
        }
        if wants("reducescatter") {
            hit |= assign(&mut self.reduce_scatter, name, keyed)?;
        }
        if wants("reduce") {
            hit |= assign(&mut self.reduce, name, keyed)?;
        }
        if wants("gather") {
            hit |= assign(&mut self.gather, name, keyed)?;
        }
        if wants("scatter") {
            hit |= assign(&mut self.scatter, name, keyed)?;
        }
        if wants("alltoall") {
            hit |= assign(&mut self.all_to_all, name, keyed)?;
        }
        if wants("barrier") {
            hit |= assign(&mut self.barrier, name, keyed)?;
        }
        Ok(hit)
    }

    /// Parses a `RUSTDIST_ALGO` value. Names are case-insensitive; `-` and `_` are equivalent
    /// and `allreduce` is `all_reduce`.
    pub fn parse(spec: &str) -> Result<Self> {
        const COLLECTIVES: [&str; 9] = [
            "allreduce",
            "broadcast",
            "allgather",
            "reducescatter",
            "reduce",
            "gather",
            "scatter",
            "alltoall",
            "barrier",
        ];
        let mut o = Self::default();
        let norm = |s: &str| s.trim().to_ascii_lowercase().replace('-', "_");
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item.split_once('=') {
                Some((coll, name)) => {
                    let key = norm(coll).replace('_', "");
                    if !COLLECTIVES.contains(&key.as_str()) {
                        return Err(Error::invalid(format!(
                            "{ENV_VAR}: unknown collective '{}'; valid: all_reduce, broadcast, \
                             all_gather, reduce_scatter, reduce, gather, scatter, all_to_all, \
                             barrier",
                            coll.trim()
                        )));
                    }
                    o.apply(Some(&key), &norm(name))?;
                }
                None => {
                    if !o.apply(None, &norm(item))? {
                        return Err(Error::invalid(format!(
                            "{ENV_VAR}: unknown algorithm '{item}'; valid choices: {}",
                            [
                                choices::<AllReduceAlgo>(),
                                choices::<BroadcastAlgo>(),
                                choices::<AllGatherAlgo>(),
                                choices::<ReduceScatterAlgo>(),
                                choices::<ReduceAlgo>(),
                                choices::<GatherAlgo>(),
                                choices::<ScatterAlgo>(),
                                choices::<AllToAllAlgo>(),
                                choices::<BarrierAlgo>(),
                            ]
                            .join(", ")
                        )));
                    }
                }
            }
        }
        Ok(o)
    }

    /// all_reduce of `bytes` per rank on `world` ranks; `single_copy`: whether the ranks on the
    /// host may read each other's memory, each with a core.
    pub fn all_reduce(
        &self,
        bytes: usize,
        world: usize,
        link: LinkKind,
        single_copy: SingleCopy,
    ) -> AllReduceAlgo {
        self.all_reduce.unwrap_or(match link {
            LinkKind::SharedMemory if bytes <= SHM_ALL_REDUCE_ONESHOT_MAX_BYTES => {
                AllReduceAlgo::ShmOneShot
            }
            LinkKind::SharedMemory
                if single_copy == SingleCopy::CoreEach
                    && self
                        .cpu
                        .single_copy_all_reduce_min_bytes()
                        .is_some_and(|min| bytes >= min) =>
            {
                AllReduceAlgo::ShmSingleCopy
            }
            LinkKind::SharedMemory => AllReduceAlgo::ShmTwoShot,
            LinkKind::Hierarchical => AllReduceAlgo::Hierarchical,
            LinkKind::Tcp
                if bytes <= self.tcp.scale(TCP_ALL_REDUCE_RD_MAX_BYTES / 4)
                    || world > 2 && bytes <= self.tcp.scale(TCP_ALL_REDUCE_RD_MAX_BYTES) =>
            {
                AllReduceAlgo::RecursiveDoubling
            }
            LinkKind::Tcp => AllReduceAlgo::Ring,
        })
    }

    /// The algorithm the leaders of a hierarchical all_reduce run among themselves.
    pub fn all_reduce_between_hosts(&self, bytes: usize, hosts: usize) -> AllReduceAlgo {
        self.policy()
            .all_reduce(bytes, hosts, LinkKind::Tcp, SingleCopy::Unavailable)
    }

    /// The policy alone: no algorithm forced, the same link model.
    fn policy(&self) -> AlgoOverrides {
        AlgoOverrides {
            tcp: self.tcp,
            cpu: self.cpu,
            ..AlgoOverrides::default()
        }
    }

    /// How the ring all_reduce cuts its buffer.
    pub fn ring_shape(&self) -> RingShape {
        if self.slow_tcp() {
            let piece = (self.tcp.bdp() as usize)
                .clamp(RING_PIECE_BYTES_SLOW_LINK, RING_CHUNK_BYTES_SLOW_LINK);
            return RingShape {
                chunk_bytes: RING_CHUNK_BYTES_SLOW_LINK,
                piece_bytes: piece,
            };
        }
        let chunk = self.ring_chunk_bytes();
        RingShape {
            chunk_bytes: chunk,
            piece_bytes: chunk,
        }
    }

    /// The smallest TCP broadcast (3 ranks or more) that goes down the chain.
    fn tcp_broadcast_chain_min_bytes(&self) -> usize {
        if self.slow_tcp() {
            TCP_BROADCAST_CHAIN_MIN_BYTES.max(self.tcp.bdp() as usize)
        } else {
            self.tcp.scale(TCP_BROADCAST_CHAIN_HOST_BOUND_MIN_BYTES)
        }
    }

    /// The ring all_reduce's chunk on host-bound TCP links (see [`RING_CHUNK_BYTES`]).
    fn ring_chunk_bytes(&self) -> usize {
        self.tcp.scale(RING_CHUNK_BYTES).max(RING_CHUNK_BYTES)
    }

    /// Whether the TCP links are slower than half the reference's bandwidth: there the
    /// network limits rather than the hosts.
    fn slow_tcp(&self) -> bool {
        self.tcp.bandwidth < LinkModel::SLOW_BANDWIDTH
    }

    /// Broadcast of `bytes` on `world` ranks; `single_copy`: whether the ranks on the host may
    /// read each other's memory, each with a core.
    pub fn broadcast(
        &self,
        bytes: usize,
        world: usize,
        link: LinkKind,
        single_copy: SingleCopy,
    ) -> BroadcastAlgo {
        self.broadcast.unwrap_or(match link {
            LinkKind::SharedMemory
                if single_copy == SingleCopy::CoreEach
                    && self.cpu.single_copy_broadcast_bytes().contains(&bytes) =>
            {
                BroadcastAlgo::SingleCopy
            }
            LinkKind::SharedMemory => BroadcastAlgo::Shm,
            LinkKind::Hierarchical => BroadcastAlgo::Hierarchical,
            LinkKind::Tcp if world >= 3 && bytes >= self.tcp_broadcast_chain_min_bytes() => {
                BroadcastAlgo::Chain
            }
            LinkKind::Tcp => BroadcastAlgo::BinomialTree,
        })
    }

    /// The algorithm the leaders of a hierarchical broadcast run among themselves.
    pub fn broadcast_between_hosts(&self, bytes: usize, hosts: usize) -> BroadcastAlgo {
        self.policy()
            .broadcast(bytes, hosts, LinkKind::Tcp, SingleCopy::Unavailable)
    }

    /// all_gather of `total_bytes` gathered on every rank; `single_copy`: whether the ranks on
    /// the host may read each other's memory, each with a core.
    pub fn all_gather(
        &self,
        total_bytes: usize,
        link: LinkKind,
        single_copy: SingleCopy,
    ) -> AllGatherAlgo {
        self.all_gather.unwrap_or(match link {
            LinkKind::SharedMemory
                if single_copy == SingleCopy::CoreEach
                    && self.cpu.single_copy_bytes().contains(&total_bytes) =>
            {
                AllGatherAlgo::SingleCopy
            }
            LinkKind::SharedMemory => AllGatherAlgo::Shm,
            LinkKind::Hierarchical => AllGatherAlgo::Hierarchical,
            LinkKind::Tcp if total_bytes <= self.tcp.scale(TCP_ALL_GATHER_DIRECT_MAX_BYTES) => {
                AllGatherAlgo::Direct
            }
            LinkKind::Tcp => AllGatherAlgo::Ring,
        })
    }

    /// The algorithm the leaders of a hierarchical all_gather run among themselves.
    pub fn all_gather_between_hosts(&self, total_bytes: usize) -> AllGatherAlgo {
        self.policy()
            .all_gather(total_bytes, LinkKind::Tcp, SingleCopy::Unavailable)
    }

    pub fn reduce_scatter(&self, link: LinkKind) -> ReduceScatterAlgo {
        self.reduce_scatter.unwrap_or(match link {
            LinkKind::SharedMemory => ReduceScatterAlgo::Shm,
            _ => ReduceScatterAlgo::Ring,
        })
    }

    pub fn reduce(&self, link: LinkKind) -> ReduceAlgo {
        self.reduce.unwrap_or(match link {
            LinkKind::SharedMemory => ReduceAlgo::Shm,
            LinkKind::Hierarchical => ReduceAlgo::Hierarchical,
            LinkKind::Tcp => ReduceAlgo::BinomialTree,
        })
    }

    pub fn gather(&self, link: LinkKind) -> GatherAlgo {
        self.gather.unwrap_or(match link {
            LinkKind::SharedMemory => GatherAlgo::Shm,
            _ => GatherAlgo::Direct,
        })
    }

    pub fn scatter(&self, link: LinkKind) -> ScatterAlgo {
        self.scatter.unwrap_or(match link {
            LinkKind::SharedMemory => ScatterAlgo::Shm,
            _ => ScatterAlgo::Direct,
        })
    }

    /// all_to_all of `even_bytes` per rank in equal blocks (None: uneven splits) on `world`
    /// ranks; `single_copy`: whether the ranks on the host may read each other's memory (a
    /// core each or not).
    pub fn all_to_all(
        &self,
        even_bytes: Option<usize>,
        world: usize,
        link: LinkKind,
        single_copy: SingleCopy,
    ) -> AllToAllAlgo {
        let min = match single_copy {
            SingleCopy::Unavailable => None,
            SingleCopy::SharedCores => self
                .cpu
                .single_copy_all_to_all_min_bytes()
                .map(|min| min.max(SHARED_CORES_SINGLE_COPY_ALL_TO_ALL_MIN_BYTES)),
            SingleCopy::CoreEach => self.cpu.single_copy_all_to_all_min_bytes(),
        };
        let one_copy = |bytes: usize| min.is_some_and(|min| bytes >= min);
        self.all_to_all.unwrap_or(match link {
            LinkKind::SharedMemory
                if world <= crate::algorithms::alltoall::single_copy::MAX_RANKS
                    && even_bytes.is_some_and(one_copy) =>
            {
                AllToAllAlgo::SingleCopy
            }
            LinkKind::SharedMemory => AllToAllAlgo::Shm,
            _ => AllToAllAlgo::Pairwise,
        })
    }

    pub fn barrier(&self, link: LinkKind) -> BarrierAlgo {
        self.barrier.unwrap_or(match link {
            LinkKind::SharedMemory => BarrierAlgo::Shm,
            LinkKind::Hierarchical => BarrierAlgo::Hierarchical,
            LinkKind::Tcp => BarrierAlgo::Dissemination,
        })
    }
}

/// One row of the selection table: the algorithm `collective` runs with `bytes` (per rank; the
/// gathered total for all_gather) on `world` ranks connected by `link`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub collective: &'static str,
    pub link: LinkKind,
    pub world: usize,
    pub bytes: usize,
    pub algorithm: &'static str,
}

/// What the defaults (with `RUSTDIST_ALGO` applied when `overrides` holds it) choose for every
/// collective, link kind, world size in `worlds` and size in `sizes`, on a host of `cores`
/// cores whose ranks may read each other's memory.
pub fn table(
    overrides: &AlgoOverrides,
    worlds: &[usize],
    sizes: &[usize],
    cores: usize,
) -> Vec<Choice> {
    let links = [
        LinkKind::SharedMemory,
        LinkKind::Tcp,
        LinkKind::Hierarchical,
    ];
    let o = overrides;
    let mut rows = Vec::new();
    for link in links {
        for &world in worlds {
            let one_copy = if world <= cores {
                SingleCopy::CoreEach
            } else {
                SingleCopy::SharedCores
            };
            for &bytes in sizes {
                let picks: [(&'static str, &'static str); 9] = [
                    (
                        "all_reduce",
                        o.all_reduce(bytes, world, link, one_copy).name(),
                    ),
                    (
                        "broadcast",
                        o.broadcast(bytes, world, link, one_copy).name(),
                    ),
                    ("all_gather", o.all_gather(bytes, link, one_copy).name()),
                    ("reduce_scatter", o.reduce_scatter(link).name()),
                    ("reduce", o.reduce(link).name()),
                    ("gather", o.gather(link).name()),
                    ("scatter", o.scatter(link).name()),
                    (
                        "all_to_all",
                        o.all_to_all(Some(bytes), world, link, one_copy).name(),
                    ),
                    ("barrier", o.barrier(link).name()),
                ];
                rows.extend(picks.into_iter().map(|(collective, algorithm)| Choice {
                    collective,
                    link,
                    world,
                    bytes,
                    algorithm,
                }));
            }
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use SingleCopy::{CoreEach, SharedCores, Unavailable};

    #[test]
    fn parse_bare_and_keyed_names() {
        let o = AlgoOverrides::parse("ring").unwrap();
        assert_eq!(o.all_reduce, Some(AllReduceAlgo::Ring));
        assert_eq!(o.all_gather, Some(AllGatherAlgo::Ring));
        assert_eq!(o.reduce_scatter, Some(ReduceScatterAlgo::Ring));
        assert_eq!(o.broadcast, None);
        let o = AlgoOverrides::parse(" allreduce=Recursive-Doubling, broadcast=binomial_tree ,")
            .unwrap();
        assert_eq!(o.all_reduce, Some(AllReduceAlgo::RecursiveDoubling));
        assert_eq!(o.broadcast, Some(BroadcastAlgo::BinomialTree));
        let o =
            AlgoOverrides::parse("ring,all_reduce=recursive_doubling,all-gather=direct").unwrap();
        assert_eq!(o.all_reduce, Some(AllReduceAlgo::RecursiveDoubling));
        assert_eq!(o.all_gather, Some(AllGatherAlgo::Direct));
        let o = AlgoOverrides::parse("shm").unwrap();
        assert_eq!(o.broadcast, Some(BroadcastAlgo::Shm));
        assert_eq!(o.gather, Some(GatherAlgo::Shm));
        assert_eq!(o.all_reduce, None);
        let o = AlgoOverrides::parse("gather=direct,reduce=binomial_tree").unwrap();
        assert_eq!(o.gather, Some(GatherAlgo::Direct));
        assert_eq!(o.reduce, Some(ReduceAlgo::BinomialTree));
        assert_eq!(AlgoOverrides::parse("").unwrap(), AlgoOverrides::default());
    }

    #[test]
    fn unknown_names_list_valid_choices() {
        let Err(Error::InvalidArgument(m)) = AlgoOverrides::parse("allreduce=tree") else {
            panic!()
        };
        assert!(
            m.contains("'tree'") && m.contains("ring|recursive_doubling"),
            "{m}"
        );
        let Err(Error::InvalidArgument(m)) = AlgoOverrides::parse("bogus") else {
            panic!()
        };
        assert!(
            m.contains("'bogus'") && m.contains("broadcast=binomial_tree|chain"),
            "{m}"
        );
        let Err(Error::InvalidArgument(m)) = AlgoOverrides::parse("sendrecv=ring") else {
            panic!()
        };
        assert!(m.contains("unknown collective 'sendrecv'"), "{m}");
    }

    #[test]
    fn host_cpu_from_vendor_id() {
        let intel = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n";
        assert_eq!(HostCpu::from_cpuinfo(intel), HostCpu::Intel);
        let amd = "processor\t: 0\nvendor_id\t: AuthenticAMD\n";
        assert_eq!(HostCpu::from_cpuinfo(amd), HostCpu::Other);
        assert_eq!(
            HostCpu::from_cpuinfo("processor : 0\nCPU implementer : 0x41\n"),
            HostCpu::Other
        );
        assert_eq!(HostCpu::from_cpuinfo(""), HostCpu::Other);
    }

    #[test]
    fn defaults_depend_on_size_and_links() {
        let o = AlgoOverrides::default();
        let (tcp, shm, mixed) = (
            LinkKind::Tcp,
            LinkKind::SharedMemory,
            LinkKind::Hierarchical,
        );
        assert_eq!(
            o.all_reduce(1024, 4, tcp, Unavailable),
            AllReduceAlgo::RecursiveDoubling
        );
        assert_eq!(
            o.all_reduce(64 << 20, 4, tcp, Unavailable),
            AllReduceAlgo::Ring
        );
        assert_eq!(
            o.all_reduce(8, 2, shm, Unavailable),
            AllReduceAlgo::ShmOneShot
        );
        assert_eq!(
            o.all_reduce(64 << 20, 2, shm, Unavailable),
            AllReduceAlgo::ShmTwoShot
        );
        // The bands of single-copy algorithms depend on the CPU.
        let intel = AlgoOverrides {
            cpu: HostCpu::Intel,
            ..o
        };
        // Peers' slices read in one copy where the ranks may: on Intel's CPUs from 2 MiB.
        for (bytes, algo, on_intel) in [
            (
                64 << 10,
                AllReduceAlgo::ShmOneShot,
                AllReduceAlgo::ShmOneShot,
            ),
            (
                (2 << 20) - 4,
                AllReduceAlgo::ShmTwoShot,
                AllReduceAlgo::ShmTwoShot,
            ),
            (
                2 << 20,
                AllReduceAlgo::ShmTwoShot,
                AllReduceAlgo::ShmSingleCopy,
            ),
            (
                64 << 20,
                AllReduceAlgo::ShmTwoShot,
                AllReduceAlgo::ShmSingleCopy,
            ),
        ] {
            assert_eq!(o.all_reduce(bytes, 2, shm, CoreEach), algo, "{bytes} bytes");
            assert_eq!(
                intel.all_reduce(bytes, 2, shm, CoreEach),
                on_intel,
                "{bytes} bytes, Intel"
            );
        }
        assert_eq!(
            intel.all_reduce(64 << 20, 2, shm, Unavailable),
            AllReduceAlgo::ShmTwoShot
        );
        assert_eq!(
            intel.all_reduce(64 << 20, 2, tcp, CoreEach),
            AllReduceAlgo::Ring
        );
        assert_eq!(
            o.all_reduce(8, 4, mixed, Unavailable),
            AllReduceAlgo::Hierarchical
        );
        assert_eq!(
            o.broadcast(64 << 20, 4, tcp, Unavailable),
            BroadcastAlgo::Chain
        );
        assert_eq!(
            o.broadcast(64 << 20, 2, tcp, Unavailable),
            BroadcastAlgo::BinomialTree
        );
        assert_eq!(o.broadcast(8, 4, shm, Unavailable), BroadcastAlgo::Shm);
        // One copy between the root's memory and the others' where the ranks may: 256 KiB to
        // 1 MiB, from 16 KiB on Intel's CPUs.
        for (bytes, algo, on_intel) in [
            ((16 << 10) - 1, BroadcastAlgo::Shm, BroadcastAlgo::Shm),
            (16 << 10, BroadcastAlgo::Shm, BroadcastAlgo::SingleCopy),
            (
                256 << 10,
                BroadcastAlgo::SingleCopy,
                BroadcastAlgo::SingleCopy,
            ),
            (
                1 << 20,
                BroadcastAlgo::SingleCopy,
                BroadcastAlgo::SingleCopy,
            ),
            ((1 << 20) + 1, BroadcastAlgo::Shm, BroadcastAlgo::SingleCopy),
            (64 << 20, BroadcastAlgo::Shm, BroadcastAlgo::SingleCopy),
        ] {
            assert_eq!(o.broadcast(bytes, 2, shm, CoreEach), algo, "{bytes} bytes");
            assert_eq!(
                intel.broadcast(bytes, 2, shm, CoreEach),
                on_intel,
                "{bytes} bytes, Intel"
            );
        }
        assert_eq!(
            intel.broadcast(64 << 10, 2, shm, Unavailable),
            BroadcastAlgo::Shm
        );
        assert_eq!(
            intel.broadcast(64 << 10, 2, tcp, CoreEach),
            BroadcastAlgo::BinomialTree
        );
        assert_eq!(o.all_gather(100, tcp, Unavailable), AllGatherAlgo::Direct);
        // One copy from the peers' memory where the ranks may read it: 256 KiB to 4 MiB,
        // 32 KiB to 16 MiB on Intel's CPUs.
        for (bytes, algo, on_intel) in [
            ((32 << 10) - 1, AllGatherAlgo::Shm, AllGatherAlgo::Shm),
            (32 << 10, AllGatherAlgo::Shm, AllGatherAlgo::SingleCopy),
            (
                (256 << 10) - 1,
                AllGatherAlgo::Shm,
                AllGatherAlgo::SingleCopy,
            ),
            (
                256 << 10,
                AllGatherAlgo::SingleCopy,
                AllGatherAlgo::SingleCopy,
            ),
            (
                4 << 20,
                AllGatherAlgo::SingleCopy,
                AllGatherAlgo::SingleCopy,
            ),
            ((4 << 20) + 1, AllGatherAlgo::Shm, AllGatherAlgo::SingleCopy),
            (16 << 20, AllGatherAlgo::Shm, AllGatherAlgo::SingleCopy),
            ((16 << 20) + 1, AllGatherAlgo::Shm, AllGatherAlgo::Shm),
        ] {
            assert_eq!(o.all_gather(bytes, shm, CoreEach), algo, "{bytes} bytes");
            assert_eq!(
                intel.all_gather(bytes, shm, CoreEach),
                on_intel,
                "{bytes} bytes, Intel"
            );
        }
        assert_eq!(
            intel.all_gather(1 << 20, shm, Unavailable),
            AllGatherAlgo::Shm
        );
        assert_eq!(o.all_gather(1 << 20, shm, Unavailable), AllGatherAlgo::Shm);
        assert_eq!(o.all_gather(1 << 20, tcp, CoreEach), AllGatherAlgo::Ring);
        // Equal blocks read in one copy where the ranks may (and their addresses fit a flag
        // entry): on Intel's CPUs from 32 KiB per rank.
        for (bytes, world, on_intel) in [
            (Some((32 << 10) - 1), 2, AllToAllAlgo::Shm),
            (Some(32 << 10), 2, AllToAllAlgo::SingleCopy),
            (Some(64 << 20), 7, AllToAllAlgo::SingleCopy),
            (Some(64 << 20), 8, AllToAllAlgo::Shm),
            (None, 2, AllToAllAlgo::Shm),
        ] {
            assert_eq!(o.all_to_all(bytes, world, shm, CoreEach), AllToAllAlgo::Shm);
            let what = format!("{bytes:?} bytes, world {world}, Intel");
            assert_eq!(
                intel.all_to_all(bytes, world, shm, CoreEach),
                on_intel,
                "{what}"
            );
        }
        assert_eq!(
            intel.all_to_all(Some(1 << 20), 2, shm, Unavailable),
            AllToAllAlgo::Shm
        );
        // With more ranks than cores only all_to_all reads straight from the peers, from
        // 256 KiB per rank.
        assert_eq!(
            intel.all_to_all(Some(256 << 10), 4, shm, SharedCores),
            AllToAllAlgo::SingleCopy
        );
        assert_eq!(
            intel.all_to_all(Some((256 << 10) - 1), 4, shm, SharedCores),
            AllToAllAlgo::Shm
        );
        assert_eq!(
            o.all_to_all(Some(1 << 20), 4, shm, SharedCores),
            AllToAllAlgo::Shm
        );
        assert_eq!(
            intel.all_reduce(64 << 20, 4, shm, SharedCores),
            AllReduceAlgo::ShmTwoShot
        );
        assert_eq!(
            intel.broadcast(64 << 10, 4, shm, SharedCores),
            BroadcastAlgo::Shm
        );
        assert_eq!(
            intel.all_gather(1 << 20, shm, SharedCores),
            AllGatherAlgo::Shm
        );
        assert_eq!(
            intel.all_to_all(Some(1 << 20), 2, tcp, CoreEach),
            AllToAllAlgo::Pairwise
        );
        assert_eq!(o.reduce(tcp), ReduceAlgo::BinomialTree);
        let forced = AlgoOverrides::parse("allreduce=ring").unwrap();
        assert_eq!(
            forced.all_reduce(8, 4, shm, Unavailable),
            AllReduceAlgo::Ring
        );
        let rows = table(&forced, &[2, 4], &[8, 1 << 20], 2);
        assert_eq!(rows.len(), 3 * 2 * 2 * 9);
        assert!(rows
            .iter()
            .all(|r| r.collective != "all_reduce" || r.algorithm == "ring"));
        // The shared-memory column: single copy where the world has a core per rank.
        let pick = |rows: &[Choice], coll: &str, world: usize| {
            rows.iter()
                .find(|r| {
                    r.collective == coll
                        && r.world == world
                        && r.link == LinkKind::SharedMemory
                        && r.bytes == 1 << 20
                })
                .map(|r| r.algorithm)
        };
        let rows = table(&intel, &[2, 4], &[1 << 20], 2);
        assert_eq!(pick(&rows, "all_gather", 2), Some("shm_single_copy"));
        assert_eq!(pick(&rows, "all_gather", 4), Some("shm"));
        assert_eq!(pick(&rows, "all_to_all", 4), Some("shm_single_copy"));
    }

    fn on(latency_us: u64, bandwidth: u64) -> AlgoOverrides {
        AlgoOverrides {
            tcp: LinkModel {
                latency: Duration::from_micros(latency_us),
                bandwidth,
            },
            ..AlgoOverrides::default()
        }
    }

    #[test]
    fn ring_chunks_travel_in_pieces_on_slow_links() {
        let whole = |bytes| RingShape {
            chunk_bytes: bytes,
            piece_bytes: bytes,
        };
        let reference = AlgoOverrides::default();
        assert_eq!(reference.ring_shape(), whole(128 << 10));
        let pieces = |bytes| RingShape {
            chunk_bytes: 16 << 20,
            piece_bytes: bytes,
        };
        let slow = on(40, 125_000_000);
        assert_eq!(slow.ring_shape(), pieces(256 << 10));
        // 3 ms away: a piece holds a bandwidth-delay product.
        assert_eq!(on(3000, 125_000_000).ring_shape(), pieces(375_000));
        assert_eq!(on(4000, 125_000_000).ring_shape(), pieces(500_000));
        // 10 Gbit/s: the hosts limit, as on loopback; 1 ms away a step grows with the
        // bandwidth-delay product (15.6 times the reference's), and at a shorter latency it
        // stays as on the reference.
        assert_eq!(on(40, 1_250_000_000).ring_shape(), whole(128 << 10));
        assert_eq!(on(1000, 1_250_000_000).ring_shape(), whole(2_048_000));
        assert_eq!(on(5, 2_000_000_000).ring_shape(), whole(128 << 10));
    }

    #[test]
    fn large_tcp_broadcasts_go_down_the_chain_where_the_hosts_limit() {
        let (reference, tcp) = (AlgoOverrides::default(), LinkKind::Tcp);
        let on_tcp = |o: &AlgoOverrides, bytes, world| o.broadcast(bytes, world, tcp, Unavailable);
        assert_eq!(
            on_tcp(&reference, (8 << 20) - 1, 4),
            BroadcastAlgo::BinomialTree
        );
        assert_eq!(on_tcp(&reference, 8 << 20, 3), BroadcastAlgo::Chain);
        assert_eq!(on_tcp(&reference, 64 << 20, 4), BroadcastAlgo::Chain);
        assert_eq!(on_tcp(&reference, 64 << 20, 2), BroadcastAlgo::BinomialTree);
        // 10 Gbit/s 1 ms away: from 16 times as many bytes.
        let far = on(1000, 1_250_000_000);
        assert_eq!(on_tcp(&far, 64 << 20, 4), BroadcastAlgo::BinomialTree);
        assert_eq!(on_tcp(&far, 128 << 20, 4), BroadcastAlgo::Chain);
    }

    #[test]
    fn tcp_crossovers_follow_the_bandwidth_delay_product() {
        let tcp = LinkKind::Tcp;
        let reference = AlgoOverrides::default();
        // 1 Gbit/s at loopback latency: a far smaller bandwidth-delay product, so the ring
        // and the chain take over from smaller sizes.
        let slow = on(40, 125_000_000);
        assert_eq!(
            reference.all_reduce(128 << 10, 4, tcp, Unavailable),
            AllReduceAlgo::RecursiveDoubling
        );
        assert_eq!(
            slow.all_reduce(128 << 10, 4, tcp, Unavailable),
            AllReduceAlgo::Ring
        );
        assert_eq!(
            reference.broadcast(256 << 10, 4, tcp, Unavailable),
            BroadcastAlgo::BinomialTree
        );
        assert_eq!(
            slow.broadcast(256 << 10, 4, tcp, Unavailable),
            BroadcastAlgo::Chain
        );
        assert_eq!(
            reference.all_gather(128 << 10, tcp, Unavailable),
            AllGatherAlgo::Direct
        );
        assert_eq!(
            slow.all_gather(128 << 10, tcp, Unavailable),
            AllGatherAlgo::Ring
        );
        // A 10 Gbit/s link 1 ms away: latency dominates up to far larger sizes.
        let far = on(1000, 1_250_000_000);
        assert_eq!(
            far.all_reduce(2 << 20, 4, tcp, Unavailable),
            AllReduceAlgo::RecursiveDoubling
        );
        assert_eq!(
            far.broadcast(4 << 20, 4, tcp, Unavailable),
            BroadcastAlgo::BinomialTree
        );
        assert_eq!(
            slow.broadcast(4 << 20, 2, tcp, Unavailable),
            BroadcastAlgo::BinomialTree
        );
        // A 1 Gbit/s link 1 ms away: the chain from a bandwidth-delay product (125 KB) on.
        let distant = on(1000, 125_000_000);
        assert_eq!(
            distant.broadcast(64 << 10, 8, tcp, Unavailable),
            BroadcastAlgo::BinomialTree
        );
        assert_eq!(
            distant.broadcast(256 << 10, 8, tcp, Unavailable),
            BroadcastAlgo::Chain
        );
        // Leaders between hosts use the same model; shared memory does not read it.
        assert_eq!(
            slow.all_reduce_between_hosts(128 << 10, 4),
            AllReduceAlgo::Ring
        );
        assert_eq!(
            slow.all_reduce(8, 4, LinkKind::SharedMemory, Unavailable),
            AllReduceAlgo::ShmOneShot
        );
        // Forcing still wins over the model.
        let forced = AlgoOverrides {
            tcp: slow.tcp,
            ..AlgoOverrides::parse("allreduce=recursive_doubling").unwrap()
        };
        assert_eq!(
            forced.all_reduce(64 << 20, 4, tcp, Unavailable),
            AllReduceAlgo::RecursiveDoubling
        );
    }

    #[test]
    fn measurements_count_once_clearly_a_long_or_slow_link_and_settings_win() {
        let measured = |us, bandwidth| {
            let latency = Some(Duration::from_micros(us));
            LinkModel::from_settings(None, None, Measured { latency, bandwidth }).unwrap()
        };
        assert_eq!(measured(90, None), LinkModel::REFERENCE, "loopback noise");
        assert_eq!(measured(2000, None).latency, Duration::from_millis(2));
        // A link timed at 900 MB/s may be a fast one timed on a busy host; 1 Gbit/s limits.
        assert_eq!(measured(90, Some(900_000_000)), LinkModel::REFERENCE);
        assert_eq!(measured(90, Some(118_000_000)).bandwidth, 118_000_000);
        assert!(
            AlgoOverrides {
                tcp: measured(90, Some(118_000_000)),
                ..AlgoOverrides::default()
            }
            .slow_tcp(),
            "a measured 1 Gbit/s link is slow"
        );
        let set = |l: &str, b: &str| {
            let long_and_slow = Measured {
                latency: Some(Duration::from_secs(1)),
                bandwidth: Some(1000),
            };
            LinkModel::from_settings(Some(l.into()), Some(b.into()), long_and_slow)
        };
        assert_eq!(
            set("250", "10gbit").unwrap(),
            LinkModel {
                latency: Duration::from_micros(250),
                bandwidth: 1_250_000_000
            }
        );
        let Err(Error::InvalidArgument(m)) = set("-3", "1gbit") else {
            panic!()
        };
        assert!(m.contains(LATENCY_ENV) && m.contains("\"-3\""), "{m}");
        let Err(Error::InvalidArgument(m)) = set("250", "fast") else {
            panic!()
        };
        assert!(m.contains(BANDWIDTH_ENV) && m.contains("\"fast\""), "{m}");
    }

    #[test]
    fn streams_fill_the_round_trip_where_one_stream_cannot() {
        let window = 2 << 20;
        let far = |latency_ms: u64, rate: u64| {
            LinkModel {
                latency: Duration::from_millis(latency_ms),
                bandwidth: rate,
            }
            .streams(window)
        };
        assert_eq!(LinkModel::REFERENCE.streams(window), 1, "loopback");
        assert_eq!(far(1, 125_000_000), 1, "1 Gbit/s, 1 ms away");
        assert_eq!(far(10, 125_000_000), 2, "2.5 MB in flight");
        assert_eq!(far(20, 125_000_000), 3, "5 MB in flight");
        assert_eq!(far(100, 12_500_000_000), 8, "at most 8");
        assert_eq!(LinkModel::REFERENCE.streams(0), 8, "no window: the most");
    }

    #[test]
    fn streams_setting_parses_counts_and_auto() {
        assert_eq!(parse_streams(None).unwrap(), None);
        assert_eq!(parse_streams(Some("auto")).unwrap(), None);
        assert_eq!(parse_streams(Some(" ")).unwrap(), None);
        assert_eq!(parse_streams(Some("1")).unwrap(), Some(1));
        assert_eq!(parse_streams(Some(" 16 ")).unwrap(), Some(16));
        for bad in ["0", "17", "-1", "two", "2.5"] {
            let e = parse_streams(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains(STREAMS_ENV) && e.contains(&format!("{bad:?}")),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn rates_parse_as_tc_writes_them() {
        assert_eq!(parse_rate("1gbit"), Some(125_000_000));
        assert_eq!(parse_rate(" 10GBit "), Some(1_250_000_000));
        assert_eq!(parse_rate("800mbit"), Some(100_000_000));
        assert_eq!(parse_rate("1.5GB"), Some(1_500_000_000));
        assert_eq!(parse_rate("64KB"), Some(64_000));
        assert_eq!(parse_rate("5000"), Some(5000));
        for bad in ["", "fast", "-1gbit", "0", "1 parsec", "nan"] {
            assert_eq!(parse_rate(bad), None, "{bad:?}");
        }
    }
}
