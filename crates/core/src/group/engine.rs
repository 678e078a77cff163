//! The engine: the state a group's operations run on (its transport, its collective sequence,
//! the timeout of the operation running) and how a failure breaks the group.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::algorithms::AlgoOverrides;
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::recorder;
use crate::transport::{OpCtx, Signature, Transport};
use crate::types::ReduceOp;

/// The state operations run on: the transport and the group's collective sequence.
pub(super) struct Engine {
    pub(super) transport: Box<dyn Transport>,
    pub(super) seq: u64,
    /// The timeout of the operation running: the group's when it was issued (set by
    /// [`ProcessGroup::start`] and [`ProcessGroup::enqueue`] before each one runs).
    pub(super) timeout: Duration,
    pub(super) algos: AlgoOverrides,
    pub(super) failed: Option<Error>,
    pub(super) size: usize,
    /// monitored_barrier calls so far (they use tags of their own).
    pub(super) monitored: u64,
    pub(super) cancel: Arc<Cancel>,
}

impl Engine {
    /// Runs one collective under a fresh sequence number; a network or backend failure (or
    /// the user interrupting it) makes the group fail every later operation and tells the
    /// peers.
    pub(super) fn collective(
        &mut self,
        sig: Signature,
        reduce: ReduceOp,
        body: impl FnOnce(&mut dyn Transport, &OpCtx, &AlgoOverrides) -> Result<()>,
    ) -> Result<()> {
        self.check()?;
        self.seq += 1;
        let ctx = OpCtx::new(self.seq, sig, reduce, self.timeout);
        let outcome = body(self.transport.as_mut(), &ctx, &self.algos);
        self.record(outcome)
    }

    pub(super) fn check(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    pub(super) fn record<T>(&mut self, outcome: Result<T>) -> Result<T> {
        let failure = match &outcome {
            Err(e @ (Error::Network(_) | Error::Backend(_))) => e.clone(),
            Err(Error::Interrupted) => Error::backend(
                "the process group was aborted: an operation was interrupted (KeyboardInterrupt) \
                 midway; destroy the group and create a new one",
            ),
            _ => return outcome,
        };
        if self.failed.is_none() {
            self.cancel.raise(failure.clone());
            self.transport.abort(&failure.to_string());
            recorder::dump_after_failure(&failure.to_string());
            self.failed = Some(failure);
        }
        outcome
    }

    pub(super) fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }
}
