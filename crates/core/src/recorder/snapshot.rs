//! What the process is doing now, group by group, for the status query
//! (`transport/heartbeat/query.rs`): each live group's operation in progress (the oldest one
//! issued since its last completed one) and its last completed one, from the flight recorder.

use std::sync::atomic::Ordering;

use serde::Serialize;

use super::{coarse_now_ns, global_rank, recorders, Entry, GroupStats, State};

/// One operation, as the status query reports it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct OpState {
    /// torch's name of the operation (`all_reduce`, `send`, ...).
    pub op: &'static str,
    /// Its collective sequence number in the group (its point-to-point one for `send`/`recv`).
    pub seq: u64,
    pub p2p: bool,
    /// `scheduled`, `started` or `completed`.
    pub state: &'static str,
    /// How long ago it was issued (in progress) or completed (the last completed one).
    pub age_ms: u64,
}

/// One group of the process.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GroupState {
    pub name: String,
    pub desc: String,
    /// Its members' global ranks, by group rank.
    pub ranks: Vec<usize>,
    /// The operation it is in (None: idle).
    pub current: Option<OpState>,
    pub last_completed: Option<OpState>,
    pub stats: GroupStats,
}

/// The process: its global rank (-1 before its world says), pid and groups.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProcessState {
    pub rank: i64,
    pub pid: u32,
    pub groups: Vec<GroupState>,
}

fn op_state(e: &Entry, since_ns: u64, now: u64) -> OpState {
    let p2p = e.op.p2p.is_some();
    OpState {
        op: e.op.name,
        seq: if p2p { e.p2p_seq } else { e.collective_seq },
        p2p,
        state: e.state.name(),
        age_ms: now.saturating_sub(since_ns) / 1_000_000,
    }
}

/// Every live group's state now (hidden ones and those that ended left out). A failed
/// operation is no group's current one.
pub fn snapshot() -> ProcessState {
    let now = coarse_now_ns();
    let groups = recorders()
        .into_iter()
        .filter(|r| !r.ended.load(Ordering::Relaxed))
        .map(|r| {
            let info = r.info();
            let entries = r.entries();
            let done = entries.iter().rposition(|e| e.state == State::Completed);
            let pending = done.map_or(0, |i| i + 1);
            let current = entries[pending..].iter().find(|e| !e.failed);
            GroupState {
                name: info.name,
                desc: info.desc,
                ranks: info.ranks,
                current: current.map(|e| op_state(e, e.created_ns, now)),
                last_completed: done.map(|i| {
                    let e = &entries[i];
                    op_state(e, e.completed_ns.unwrap_or(e.created_ns), now)
                }),
                stats: r.stats(),
            }
        })
        .collect();
    ProcessState {
        rank: global_rank(),
        pid: std::process::id(),
        groups,
    }
}
