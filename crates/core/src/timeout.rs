//! A group's timeout, which the user may change while operations run (torch's
//! `_set_default_timeout` / `_set_pg_timeout`), and the time left until a deadline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Time left until `deadline`, or `None` once it has passed.
pub fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// A timeout readable and settable from any thread without a lock: nanoseconds in an atomic
/// (saturating at about 584 years, far past any deadline that matters). Readers take the value
/// once when an operation is issued, so a change applies to operations issued after it.
#[derive(Debug)]
pub struct Timeout(AtomicU64);

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Timeout {
    pub fn new(d: Duration) -> Timeout {
        Timeout(AtomicU64::new(nanos(d)))
    }

    /// The current value (a relaxed load: nothing else is published through it).
    #[inline]
    pub fn get(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }

    pub fn set(&self, d: Duration) {
        self.0.store(nanos(d), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_replaces_the_value_and_saturates() {
        let t = Timeout::new(Duration::from_secs(30));
        assert_eq!(t.get(), Duration::from_secs(30));
        t.set(Duration::from_millis(1500));
        assert_eq!(t.get(), Duration::from_millis(1500));
        t.set(Duration::MAX);
        assert_eq!(t.get(), Duration::from_nanos(u64::MAX));
    }
}
