//! The one place that picks an algorithm per collective, from the byte size and world size,
//! unless the user forced one with `RUSTDIST_ALGO`.
//!
//! `RUSTDIST_ALGO` is a comma-separated list of `collective=algorithm` entries and bare
//! algorithm names; a bare name applies to every collective that has an algorithm of that name
//! (`RUSTDIST_ALGO=ring`, `RUSTDIST_ALGO=allreduce=ring,broadcast=binomial_tree`).
//! Every rank of a group must use the same setting.

use crate::error::{Error, Result};

/// The environment variable holding the overrides.
pub const ENV_VAR: &str = "RUSTDIST_ALGO";

/// all_reduce up to this many bytes uses recursive doubling (fewer steps), above it the ring
/// (less data per rank); a quarter of it on 2 ranks, where the ring has only 2 steps.
/// Measured over TCP loopback (benches/allreduce.rs): RD wins at 4 KiB everywhere and at
/// 256 KiB on 4 ranks; the ring wins at 256 KiB on 2 ranks and from 4 MiB on.
const ALL_REDUCE_RD_MAX_BYTES: usize = 256 << 10;
/// broadcast from this many bytes on, with at least 3 ranks, uses the pipelined chain.
const BROADCAST_CHAIN_MIN_BYTES: usize = 1 << 20;
/// all_gather up to this many bytes in total uses the direct exchange.
const ALL_GATHER_DIRECT_MAX_BYTES: usize = 256 << 10;

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
    AllReduceAlgo, "all_reduce", { Ring = "ring", RecursiveDoubling = "recursive_doubling" }
);
algo_enum!(
    /// broadcast algorithms.
    BroadcastAlgo, "broadcast", { BinomialTree = "binomial_tree", Chain = "chain" }
);
algo_enum!(
    /// all_gather algorithms.
    AllGatherAlgo, "all_gather", { Ring = "ring", Direct = "direct" }
);
algo_enum!(
    /// reduce_scatter algorithms.
    ReduceScatterAlgo, "reduce_scatter", { Ring = "ring" }
);
algo_enum!(
    /// barrier algorithms.
    BarrierAlgo, "barrier", { Dissemination = "dissemination" }
);

/// Algorithms forced by the user, per collective; `None` lets the size-based choice decide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AlgoOverrides {
    pub all_reduce: Option<AllReduceAlgo>,
    pub broadcast: Option<BroadcastAlgo>,
    pub all_gather: Option<AllGatherAlgo>,
    pub reduce_scatter: Option<ReduceScatterAlgo>,
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
    /// Reads `RUSTDIST_ALGO`; unset or empty means no overrides.
    pub fn from_env() -> Result<Self> {
        match std::env::var(ENV_VAR) {
            Ok(spec) => Self::parse(&spec),
            Err(std::env::VarError::NotPresent) => Ok(Self::default()),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(Error::invalid(format!("{ENV_VAR} is not valid UTF-8")))
            }
        }
    }

    /// Parses a `RUSTDIST_ALGO` value. Names are case-insensitive; `-` and `_` are equivalent
    /// and `allreduce` is `all_reduce`.
    pub fn parse(spec: &str) -> Result<Self> {
        let mut o = Self::default();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let norm = |s: &str| s.trim().to_ascii_lowercase().replace('-', "_");
            match item.split_once('=') {
                Some((coll, name)) => {
                    let name = norm(name);
                    match norm(coll).replace('_', "").as_str() {
                        "allreduce" => assign(&mut o.all_reduce, &name, true)?,
                        "broadcast" => assign(&mut o.broadcast, &name, true)?,
                        "allgather" => assign(&mut o.all_gather, &name, true)?,
                        "reducescatter" => assign(&mut o.reduce_scatter, &name, true)?,
                        "barrier" => assign(&mut o.barrier, &name, true)?,
                        _ => {
                            return Err(Error::invalid(format!(
                                "{ENV_VAR}: unknown collective '{}'; valid: all_reduce, \
                                 broadcast, all_gather, reduce_scatter, barrier",
                                coll.trim()
                            )))
                        }
                    };
                }
                None => {
                    let name = norm(item);
                    let hits = [
                        assign(&mut o.all_reduce, &name, false)?,
                        assign(&mut o.broadcast, &name, false)?,
                        assign(&mut o.all_gather, &name, false)?,
                        assign(&mut o.reduce_scatter, &name, false)?,
                        assign(&mut o.barrier, &name, false)?,
                    ];
                    if !hits.contains(&true) {
                        return Err(Error::invalid(format!(
                            "{ENV_VAR}: unknown algorithm '{item}'; valid choices: {}, {}, {}, \
                             {}, {}",
                            choices::<AllReduceAlgo>(),
                            choices::<BroadcastAlgo>(),
                            choices::<AllGatherAlgo>(),
                            choices::<ReduceScatterAlgo>(),
                            choices::<BarrierAlgo>()
                        )));
                    }
                }
            }
        }
        Ok(o)
    }

    /// The all_reduce algorithm for a buffer of `bytes` on `world` ranks.
    pub fn all_reduce(&self, bytes: usize, world: usize) -> AllReduceAlgo {
        self.all_reduce.unwrap_or(
            if bytes <= ALL_REDUCE_RD_MAX_BYTES / 4 || world > 2 && bytes <= ALL_REDUCE_RD_MAX_BYTES
            {
                AllReduceAlgo::RecursiveDoubling
            } else {
                AllReduceAlgo::Ring
            },
        )
    }

    /// The broadcast algorithm for a buffer of `bytes` on `world` ranks.
    pub fn broadcast(&self, bytes: usize, world: usize) -> BroadcastAlgo {
        self.broadcast
            .unwrap_or(if world >= 3 && bytes >= BROADCAST_CHAIN_MIN_BYTES {
                BroadcastAlgo::Chain
            } else {
                BroadcastAlgo::BinomialTree
            })
    }

    /// The all_gather algorithm for `total_bytes` gathered on every rank.
    pub fn all_gather(&self, total_bytes: usize) -> AllGatherAlgo {
        self.all_gather
            .unwrap_or(if total_bytes <= ALL_GATHER_DIRECT_MAX_BYTES {
                AllGatherAlgo::Direct
            } else {
                AllGatherAlgo::Ring
            })
    }

    pub fn reduce_scatter(&self) -> ReduceScatterAlgo {
        self.reduce_scatter.unwrap_or(ReduceScatterAlgo::Ring)
    }

    pub fn barrier(&self) -> BarrierAlgo {
        self.barrier.unwrap_or(BarrierAlgo::Dissemination)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let Err(Error::InvalidArgument(m)) = AlgoOverrides::parse("gather=ring") else {
            panic!()
        };
        assert!(m.contains("unknown collective 'gather'"), "{m}");
    }

    #[test]
    fn defaults_depend_on_size() {
        let o = AlgoOverrides::default();
        assert_eq!(o.all_reduce(1024, 4), AllReduceAlgo::RecursiveDoubling);
        assert_eq!(o.all_reduce(64 << 20, 4), AllReduceAlgo::Ring);
        assert_eq!(o.broadcast(64 << 20, 4), BroadcastAlgo::Chain);
        assert_eq!(o.broadcast(64 << 20, 2), BroadcastAlgo::BinomialTree);
        assert_eq!(o.all_gather(100), AllGatherAlgo::Direct);
        let forced = AlgoOverrides::parse("allreduce=ring").unwrap();
        assert_eq!(forced.all_reduce(8, 4), AllReduceAlgo::Ring);
    }
}
