//! Interrupting blocking calls on the caller's thread (Ctrl-C in Python).
//!
//! A thread that enables interruption (the binding does, around every call it makes with the
//! GIL released) has its blocking waits ask the installed hook every [`POLL`] whether to stop;
//! when the hook says so (Python has a pending signal) the wait fails with
//! [`Error::Interrupted`]. Engine threads never enable it, so their waits are not sliced.

use std::cell::Cell;
use std::sync::{Condvar, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How often an interruptible wait asks the hook: well inside the 100 ms a user waits for
/// Ctrl-C to act, and rare enough to cost nothing.
pub const POLL: Duration = Duration::from_millis(20);

static HOOK: OnceLock<fn() -> bool> = OnceLock::new();

thread_local! {
    static ENABLED: Cell<bool> = const { Cell::new(false) };
    /// When the hook may be asked next: polling loops call [`check`] often, the hook (which
    /// takes the GIL) runs at most every [`POLL`].
    static NEXT_ASK: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Installs the hook that says whether the current wait must stop (first call wins).
pub fn install(hook: fn() -> bool) {
    let _ = HOOK.set(hook);
}

/// Interruption is enabled on this thread while the guard lives.
pub struct Enabled {
    before: bool,
}

/// Enables interruption of this thread's blocking waits until the guard drops.
pub fn enable() -> Enabled {
    NEXT_ASK.with(|n| n.set(None));
    Enabled {
        before: ENABLED.with(|e| e.replace(true)),
    }
}

impl Drop for Enabled {
    fn drop(&mut self) {
        ENABLED.with(|e| e.set(self.before));
    }
}

fn enabled() -> bool {
    ENABLED.with(Cell::get)
}

/// `Err(Error::Interrupted)` when this thread is interruptible and the hook asks to stop
/// (asked at most every [`POLL`]).
pub fn check() -> Result<()> {
    if !enabled() {
        return Ok(());
    }
    let now = Instant::now();
    if NEXT_ASK.with(Cell::get).is_some_and(|next| now < next) {
        return Ok(());
    }
    NEXT_ASK.with(|n| n.set(Some(now + POLL)));
    if HOOK.get().is_some_and(|hook| hook()) {
        return Err(Error::Interrupted);
    }
    Ok(())
}

/// How long a wait may block before it checks again: `left`, capped at [`POLL`] on an
/// interruptible thread.
pub fn slice(left: Duration) -> Duration {
    if enabled() {
        left.min(POLL)
    } else {
        left
    }
}

/// Sleeps for `d`, checking for an interruption every [`POLL`].
pub fn sleep(d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    loop {
        check()?;
        let now = Instant::now();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep(slice(end - now));
    }
}

/// `cond.wait_timeout(guard, left)`, sliced so that an interruption is noticed.
pub fn wait_timeout<'a, T>(
    cond: &Condvar,
    guard: MutexGuard<'a, T>,
    left: Duration,
) -> Result<MutexGuard<'a, T>> {
    let guard = match cond.wait_timeout(guard, slice(left)) {
        Ok((g, _)) => g,
        Err(poisoned) => poisoned.into_inner().0,
    };
    check()?;
    Ok(guard)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    static STOP: AtomicBool = AtomicBool::new(false);

    fn stop_requested() -> bool {
        STOP.load(Ordering::SeqCst)
    }

    #[test]
    fn only_enabled_threads_are_interrupted() {
        install(stop_requested);
        STOP.store(true, Ordering::SeqCst);
        assert_eq!(check(), Ok(()));
        assert_eq!(slice(Duration::from_secs(5)), Duration::from_secs(5));
        {
            let _on = enable();
            assert_eq!(check(), Err(Error::Interrupted));
            assert_eq!(slice(Duration::from_secs(5)), POLL);
            let started = Instant::now();
            assert_eq!(sleep(Duration::from_secs(5)), Err(Error::Interrupted));
            assert!(started.elapsed() < Duration::from_secs(1));
        }
        assert_eq!(check(), Ok(()));
        STOP.store(false, Ordering::SeqCst);
    }
}
