//! Brief, polite spinning before blocking. Waking a sleeping thread costs tens of microseconds,
//! so waiters re-check for a short while first; on 2 cores a rank that busy-waits starves its
//! peers, so every round yields the CPU to whoever else is runnable.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a waiter keeps re-checking before it blocks, unless `RUSTDIST_SPIN_US` says.
const DEFAULT_BUDGET: Duration = Duration::from_micros(100);
/// The same for a shared-memory waiter whose host has more ranks than cores: a sleeper is
/// woken by the rank it waits for (a system call on every step it publishes) and then takes
/// that rank's core, while a yielding waiter lets its core-mates run; 4 ranks on 2 cores
/// wait up to a few hundred microseconds for a burst of small broadcasts (100 us: 1.7-2.1 us
/// per 8-byte broadcast when 3 ranks share a core; 300 us: 1.3-1.4 us).
const SHARED_CORES_BUDGET: Duration = Duration::from_micros(300);

fn budget(shared_cores: bool) -> Duration {
    static CHOSEN: OnceLock<Option<Duration>> = OnceLock::new();
    let chosen = CHOSEN.get_or_init(|| {
        std::env::var("RUSTDIST_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(Duration::from_micros)
    });
    budget_of(*chosen, shared_cores)
}

/// The budget: the user's when chosen, else the default for the waiter.
fn budget_of(chosen: Option<Duration>, shared_cores: bool) -> Duration {
    match (chosen, shared_cores) {
        (Some(chosen), _) => chosen,
        (None, false) => DEFAULT_BUDGET,
        (None, true) => SHARED_CORES_BUDGET,
    }
}

pub struct Spin {
    until: Instant,
}

impl Spin {
    pub fn new() -> Spin {
        Spin::within(budget(false))
    }

    /// A shared-memory waiter's spin, on a host with more ranks than cores when
    /// `shared_cores`.
    pub fn shared_memory(shared_cores: bool) -> Spin {
        Spin::within(budget(shared_cores))
    }

    fn within(budget: Duration) -> Spin {
        Spin {
            until: Instant::now() + budget,
        }
    }

    /// True while the budget lasts (after yielding the CPU once); false when it is time to block.
    pub fn again(&mut self) -> bool {
        if Instant::now() >= self.until {
            return false;
        }
        std::thread::yield_now();
        true
    }
}

impl Default for Spin {
    fn default() -> Self {
        Spin::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiters_on_shared_cores_spin_longer_unless_the_user_chose() {
        assert_eq!(budget_of(None, false), Duration::from_micros(100));
        assert_eq!(budget_of(None, true), Duration::from_micros(300));
        let chosen = Some(Duration::from_micros(7));
        assert_eq!(budget_of(chosen, false), Duration::from_micros(7));
        assert_eq!(budget_of(chosen, true), Duration::from_micros(7));
    }
}
