//! Brief, polite spinning before blocking. Waking a sleeping thread costs tens of microseconds,
//! so waiters re-check for a short while first; on 2 cores a rank that busy-waits starves its
//! peers, so every round yields the CPU to whoever else is runnable.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a waiter keeps re-checking before it blocks, unless `RUSTDIST_SPIN_US` says.
const DEFAULT_BUDGET: Duration = Duration::from_micros(100);

fn budget() -> Duration {
    static BUDGET: OnceLock<Duration> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        std::env::var("RUSTDIST_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(Duration::from_micros)
            .unwrap_or(DEFAULT_BUDGET)
    })
}

pub struct Spin {
    until: Instant,
}

impl Spin {
    pub fn new() -> Spin {
        Spin {
            until: Instant::now() + budget(),
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
