//! Counters per group, for `rustdist.stats(group)`, the status query and its OpenMetrics
//! output: operations and their bytes by kind (counted as they are issued), the algorithm
//! each collective ran (noted by the dispatcher, on the thread that runs it), and the time the
//! group's transport slept waiting for peers (its poll or doorbell waits). They live under the
//! recorder's lock, which each operation takes anyway: counting costs no lock of its own.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

/// Operations of one kind.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct OpCounts {
    pub count: u64,
    /// Bytes of their inputs (what this rank contributed; a receive's: its buffer).
    pub bytes: u64,
}

/// A group's counters, as reported.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct GroupStats {
    /// By operation name (torch's: `all_reduce`, `_allgather_base`, `send`, ...).
    pub ops: BTreeMap<String, OpCounts>,
    /// By "collective/algorithm" (`all_reduce/ring`), as `RUSTDIST_ALGO` names them.
    pub algorithms: BTreeMap<String, u64>,
    /// Seconds the transport slept waiting for peers.
    pub waited_s: f64,
}

/// The counters as kept: a handful of kinds each, so short lists scanned in place.
#[derive(Default)]
pub(super) struct Counts {
    ops: Vec<(&'static str, OpCounts)>,
    algorithms: Vec<((&'static str, &'static str), u64)>,
    waited_ns: u64,
}

impl Counts {
    /// Counts an operation `name` issued with inputs of `bytes`.
    pub(super) fn issued(&mut self, name: &'static str, bytes: u64) {
        let at = match self.ops.iter().position(|(n, _)| *n == name) {
            Some(at) => at,
            None => {
                self.ops.push((name, OpCounts::default()));
                self.ops.len() - 1
            }
        };
        let c = &mut self.ops[at].1;
        c.count += 1;
        c.bytes += bytes;
    }

    pub(super) fn ran(&mut self, waited: Duration) {
        if let Some(key) = CHOSEN.with(Cell::take) {
            match self.algorithms.iter_mut().find(|(k, _)| *k == key) {
                Some((_, n)) => *n += 1,
                None => self.algorithms.push((key, 1)),
            }
        }
        self.waited_ns += waited.as_nanos().min(u64::MAX as u128) as u64;
    }

    pub(super) fn report(&self) -> GroupStats {
        GroupStats {
            ops: (self.ops.iter())
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            algorithms: (self.algorithms.iter())
                .map(|((c, a), n)| (format!("{c}/{a}"), *n))
                .collect(),
            waited_s: self.waited_ns as f64 / 1e9,
        }
    }
}

thread_local! {
    /// The algorithm the dispatcher chose last on this thread, until the group counts it.
    static CHOSEN: Cell<Option<(&'static str, &'static str)>> = const { Cell::new(None) };
}

/// Notes that this thread's collective runs `algorithm` (for its group's counters).
pub fn note_algorithm(collective: &'static str, algorithm: &'static str) {
    CHOSEN.with(|c| c.set(Some((collective, algorithm))));
}
