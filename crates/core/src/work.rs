//! Work: the handle of one collective or point-to-point operation run by a group's worker.

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::interrupt;
use crate::spin::Spin;

/// Called once with the outcome when the Work completes.
pub type Callback = Box<dyn FnOnce(&Result<()>) + Send>;

/// The last step of a joined Work (see [`Work::join`]), run once its parts have succeeded.
pub type Finish = Box<dyn FnOnce() -> Result<()> + Send>;

/// What a joined Work still waits for.
struct Joining {
    left: usize,
    failure: Option<Error>,
    finish: Option<Finish>,
}

/// Whatever keeps the Work's buffers alive (e.g. references to Python tensors); dropped when the
/// Work completes.
pub type Keepalive = Box<dyn Any + Send>;

#[derive(Default)]
struct State {
    outcome: Option<Result<()>>,
    source_rank: Option<usize>,
    callbacks: Vec<Callback>,
    keepalive: Option<Keepalive>,
}

struct Inner {
    done: AtomicBool,
    state: Mutex<State>,
    cond: Condvar,
    /// The group whose operation this is, and the operation's name: a wait interrupted by the
    /// user fails that group (the operation cannot be finished without this rank).
    owner: Option<(Weak<Cancel>, &'static str)>,
}

/// A shared handle: the group's worker completes it, callers wait on it.
#[derive(Clone)]
pub struct Work {
    inner: Arc<Inner>,
}

impl Work {
    /// A Work that no group owns (an interrupted wait fails nothing else).
    pub(crate) fn new(keepalive: Option<Keepalive>) -> Work {
        Self::build(keepalive, None)
    }

    /// A Work of operation `what` of the group that `owner` cancels.
    pub(crate) fn owned(
        keepalive: Option<Keepalive>,
        owner: &Arc<Cancel>,
        what: &'static str,
    ) -> Work {
        Self::build(keepalive, Some((Arc::downgrade(owner), what)))
    }

    fn build(keepalive: Option<Keepalive>, owner: Option<(Weak<Cancel>, &'static str)>) -> Work {
        Work {
            inner: Arc::new(Inner {
                done: AtomicBool::new(false),
                state: Mutex::new(State {
                    keepalive,
                    ..State::default()
                }),
                cond: Condvar::new(),
                owner,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records the outcome, releases the buffers and runs the callbacks (outside the lock).
    pub(crate) fn complete(&self, outcome: Result<()>, source_rank: Option<usize>) {
        let (callbacks, keepalive) = {
            let mut st = self.state();
            if st.outcome.is_some() {
                return;
            }
            st.outcome = Some(outcome.clone());
            st.source_rank = source_rank;
            // Set with the outcome, under the lock: a waiter that sees the outcome must also
            // see is_completed().
            self.inner.done.store(true, Ordering::Release);
            (std::mem::take(&mut st.callbacks), st.keepalive.take())
        };
        drop(keepalive);
        self.inner.cond.notify_all();
        for cb in callbacks {
            cb(&outcome);
        }
    }

    pub fn is_completed(&self) -> bool {
        self.inner.done.load(Ordering::Acquire)
    }

    /// The outcome once completed.
    pub fn outcome(&self) -> Option<Result<()>> {
        if !self.is_completed() {
            return None;
        }
        self.state().outcome.clone()
    }

    /// The sender's rank of a completed receive.
    pub fn source_rank(&self) -> Option<usize> {
        self.state().source_rank
    }

    /// Waits until completed, then returns its outcome. With a `timeout` that passes first it
    /// fails with [`Error::Backend`] and the Work keeps running (it can be waited on again).
    /// An interruption (see [`interrupt`]) fails the owning group and returns
    /// [`Error::Interrupted`].
    pub fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        let start = Instant::now();
        let mut spin = Spin::new();
        loop {
            if self.is_completed() {
                return self.outcome().unwrap_or(Ok(()));
            }
            if !spin.again() {
                break;
            }
        }
        let deadline = timeout.map(|t| start + t);
        let mut st = self.state();
        while st.outcome.is_none() {
            let left = match deadline {
                None => Duration::MAX,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) => left,
                    None => {
                        // torch's text (gloo's: "Timed out waiting 1ms for recv ...").
                        return Err(Error::backend(format!(
                            "Timed out waiting {}ms for the operation to complete \
                             (Work.wait; the operation is still in progress)",
                            timeout.unwrap_or_default().as_millis()
                        )));
                    }
                },
            };
            st = match interrupt::wait_timeout(&self.inner.cond, st, left) {
                Ok(st) => st,
                Err(e) => {
                    self.fail_owner();
                    return Err(e);
                }
            };
        }
        st.outcome.clone().unwrap_or(Ok(()))
    }

    /// Waits until completed, uninterrupted (after [`Work::wait`] was interrupted: the
    /// group has failed, so the operation ends at its next poll).
    pub(crate) fn wait_completed(&self) {
        let mut st = self.state();
        while st.outcome.is_none() {
            st = self
                .inner
                .cond
                .wait(st)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// The user gave up on this pending operation: its group cannot finish it, so it fails.
    fn fail_owner(&self) {
        let Some((owner, what)) = &self.inner.owner else {
            return;
        };
        if let Some(cancel) = owner.upgrade() {
            cancel.raise(Error::backend(format!(
                "the process group was aborted: a wait for {what} was interrupted \
                 (KeyboardInterrupt); destroy the group and create a new one"
            )));
        }
    }

    /// A Work that completes once every one of `works` has: with the first failure among them,
    /// else with the outcome of `finish`, run once on the thread that completed the last of
    /// them (a copy-back that must happen before anyone sees the result). `keep` is held until
    /// then. A wait interrupted by the user fails the group of the first Work.
    pub fn join(works: &[Work], finish: Finish, keep: Option<Keepalive>) -> Work {
        let owner = works.first().and_then(|w| w.inner.owner.clone());
        let joined = Self::build(keep, owner);
        if works.is_empty() {
            joined.complete(finish(), None);
            return joined;
        }
        // A single Work passes on its sender (a receive's source rank).
        let source = (works.len() == 1).then(|| works[0].clone());
        let pending = Arc::new(Mutex::new(Joining {
            left: works.len(),
            failure: None,
            finish: Some(finish),
        }));
        for w in works {
            let (pending, joined, source) = (pending.clone(), joined.clone(), source.clone());
            w.on_complete(Box::new(move |outcome| {
                let last = {
                    let mut st = pending.lock().unwrap_or_else(|p| p.into_inner());
                    if let (Err(e), None) = (outcome, &st.failure) {
                        st.failure = Some(e.clone());
                    }
                    st.left -= 1;
                    (st.left == 0).then(|| (st.failure.take(), st.finish.take()))
                };
                let Some((failure, finish)) = last else {
                    return;
                };
                let outcome = match (failure, finish) {
                    (Some(e), _) => Err(e),
                    (None, Some(finish)) => finish(),
                    (None, None) => Ok(()),
                };
                joined.complete(outcome, source.and_then(|s| s.source_rank()));
            }));
        }
        joined
    }

    /// Runs `cb` with the outcome when the Work completes, at once if it already has.
    pub fn on_complete(&self, cb: Callback) {
        let outcome = {
            let mut st = self.state();
            match &st.outcome {
                Some(o) => o.clone(),
                None => {
                    st.callbacks.push(cb);
                    return;
                }
            }
        };
        cb(&outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_timeout_leaves_work_pending() {
        let w = Work::new(None);
        let err = w.wait(Some(Duration::from_millis(10))).unwrap_err();
        assert!(matches!(err, Error::Backend(_)));
        assert!(!w.is_completed());
        assert!(w.outcome().is_none());
        let w2 = w.clone();
        let t = std::thread::spawn(move || w2.complete(Ok(()), Some(3)));
        w.wait(None).unwrap();
        t.join().unwrap();
        assert_eq!(w.source_rank(), Some(3));
    }

    #[test]
    fn join_finishes_after_every_part_and_reports_the_first_failure() {
        let parts = [Work::new(None), Work::new(None)];
        let order = Arc::new(Mutex::new(Vec::new()));
        let o = order.clone();
        let joined = Work::join(
            &parts,
            Box::new(move || {
                o.lock().unwrap().push("finish");
                Ok(())
            }),
            None,
        );
        let o = order.clone();
        joined.on_complete(Box::new(move |_| o.lock().unwrap().push("joined")));
        parts[1].complete(Ok(()), None);
        assert!(!joined.is_completed());
        parts[0].complete(Ok(()), None);
        joined.wait(None).unwrap();
        assert_eq!(*order.lock().unwrap(), vec!["finish", "joined"]);

        let parts = [Work::new(None), Work::new(None)];
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let joined = Work::join(
            &parts,
            Box::new(move || {
                r.store(true, Ordering::SeqCst);
                Ok(())
            }),
            None,
        );
        parts[0].complete(Err(Error::backend("first")), None);
        parts[1].complete(Err(Error::backend("second")), None);
        let err = joined.wait(None).unwrap_err();
        assert!(err.to_string().contains("first"), "{err}");
        assert!(!ran.load(Ordering::SeqCst), "no copy-back after a failure");

        let recv = Work::new(None);
        let joined = Work::join(std::slice::from_ref(&recv), Box::new(|| Ok(())), None);
        recv.complete(Ok(()), Some(2));
        joined.wait(None).unwrap();
        assert_eq!(joined.source_rank(), Some(2));
        assert!(Work::join(&[], Box::new(|| Ok(())), None).is_completed());
    }

    #[test]
    fn callbacks_run_once_with_outcome() {
        let w = Work::new(Some(Box::new(vec![1u8])));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        w.on_complete(Box::new(move |r| s.lock().unwrap().push(r.is_ok())));
        w.complete(Err(Error::backend("boom")), None);
        w.complete(Ok(()), None);
        let s = seen.clone();
        w.on_complete(Box::new(move |r| s.lock().unwrap().push(r.is_ok())));
        assert_eq!(*seen.lock().unwrap(), vec![false, false]);
        assert!(w.wait(None).is_err());
    }
}
