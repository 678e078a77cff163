//! A group's abort signal, shared by its handle, its worker, its transport and its Works: once
//! raised, the operation in progress stops at its next poll and every later call fails with
//! the reason.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::error::{Error, Result};

#[derive(Debug, Default)]
pub struct Cancel {
    raised: AtomicBool,
    reason: Mutex<Option<Error>>,
    /// Woken when the signal is raised (for whoever waits for a failure: abort hooks).
    raised_cv: Condvar,
}

impl Cancel {
    /// Raises the signal with `reason`; the first reason stays. True if this call raised it.
    pub fn raise(&self, reason: Error) -> bool {
        let mut slot = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return false;
        }
        *slot = Some(reason);
        self.raised.store(true, Ordering::Release);
        self.raised_cv.notify_all();
        true
    }

    /// Waits up to `timeout` for the signal; the reason once raised, else None.
    pub fn wait_raised(&self, timeout: Duration) -> Option<Error> {
        let slot = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        let (slot, _) = self
            .raised_cv
            .wait_timeout_while(slot, timeout, |reason| reason.is_none())
            .unwrap_or_else(|p| p.into_inner());
        slot.clone()
    }

    pub fn is_raised(&self) -> bool {
        self.raised.load(Ordering::Acquire)
    }

    /// The reason once raised.
    pub fn check(&self) -> Result<()> {
        if !self.is_raised() {
            return Ok(());
        }
        let slot = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_reason_wins() {
        let c = Cancel::default();
        assert!(c.check().is_ok());
        assert!(c.raise(Error::backend("first")));
        assert!(!c.raise(Error::backend("second")));
        assert_eq!(c.check(), Err(Error::backend("first")));
    }

    #[test]
    fn a_waiter_wakes_with_the_reason_once_raised() {
        let c = std::sync::Arc::new(Cancel::default());
        assert_eq!(c.wait_raised(Duration::from_millis(1)), None);
        let waiter = {
            let c = c.clone();
            std::thread::spawn(move || c.wait_raised(Duration::from_secs(30)))
        };
        c.raise(Error::backend("gone"));
        assert_eq!(waiter.join().ok().flatten(), Some(Error::backend("gone")));
    }
}
