//! `RUSTDIST_ALGO`: the algorithms a user forces per collective ([`AlgoOverrides`], which
//! also carries the link model and CPU kind the policy reads), the enums of each collective's
//! algorithms with the names the variable uses, and their parsing.

use super::cpu::HostCpu;
use super::link_model::{LinkModel, Measured};
use super::streams::streams_setting;
use crate::error::{Error, Result};

/// The environment variable holding the overrides.
pub const ENV_VAR: &str = "RUSTDIST_ALGO";

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

            /// This choice, noted as the one the collective runs (for its group's counters).
            pub fn noted(self) -> Self {
                crate::recorder::note_algorithm($coll, self.name());
                self
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
        Bruck = "bruck",
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

/// Algorithms forced by the user, per collective (`None` lets the policy decide), and
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
        let o = AlgoOverrides::parse("bruck").unwrap();
        assert_eq!(o.all_gather, Some(AllGatherAlgo::Bruck));
        assert_eq!(o.all_reduce, None);
        let o = AlgoOverrides::parse("all_gather=Bruck").unwrap();
        assert_eq!(o.all_gather, Some(AllGatherAlgo::Bruck));
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
}
