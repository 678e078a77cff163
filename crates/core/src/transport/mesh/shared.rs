//! Waiting in the shared-memory workspace (the protocol is in `workspace.rs`): a short busy
//! poll, then yielding while the links are serviced (aborts, dead peers, point-to-point
//! traffic), then sleeping on the doorbell, until the step arrives or the deadline passes.

use std::time::{Duration, Instant};

use super::state::MeshTransport;
use crate::error::{Error, Result};
use crate::interrupt;
use crate::spin::Spin;
use crate::transport::frame::{signature_diff, Codes};
use crate::transport::workspace::{unpacked, Workspace};
use crate::transport::{remaining, OpCtx, Peers, WorkspaceHost};

/// Rounds of busy polling (with a pause) before a workspace wait starts servicing links and
/// yielding: a peer on another core answers within a few hundred nanoseconds.
const WS_SPIN: u32 = 2000;
/// Longest sleep on the doorbell before links and peers are checked again.
const WS_NAP: Duration = Duration::from_millis(5);

impl MeshTransport {
    /// Announces collective `ctx` in the workspace on its first use.
    pub(super) fn ws_begin(&mut self, ctx: &OpCtx) -> Result<&mut Workspace> {
        let Some(ws) = self.ws.as_mut() else {
            return Err(Error::Runtime(
                "this group has no shared-memory workspace".into(),
            ));
        };
        if self.ws_seq != ctx.seq {
            ws.begin(ctx.seq, &ctx.sig);
            self.ws_seq = ctx.seq;
        }
        Ok(ws)
    }

    /// Waits until `ready` holds for the workspace: a short busy poll, then (servicing the
    /// links for aborts, dead peers and point-to-point traffic) yielding, then sleeping on
    /// the doorbell in short naps, until `ctx`'s deadline.
    pub(super) fn ws_await(
        &mut self,
        ctx: &OpCtx,
        waited: Peers<'_>,
        ready: &mut dyn FnMut(&mut Workspace) -> bool,
    ) -> Result<()> {
        let ws = self.ws_begin(ctx)?;
        // More local ranks than CPUs: a waiting rank yields at once instead of spinning.
        let oversubscribed = ws.oversubscribed();
        if ready(ws) {
            return Ok(());
        }
        if !oversubscribed {
            for _ in 0..WS_SPIN {
                std::hint::spin_loop();
                if ready(ws) {
                    return Ok(());
                }
            }
        }
        let mut spin = Spin::shared_memory(oversubscribed);
        loop {
            // The sockets are not polled here: the sweeps read them.
            self.serve_peers(Some(ctx), &mut [], &mut Vec::new())?;
            // A peer still awaited here that has left (destroyed its group, exited cleanly)
            // will never arrive.
            let awaited = self.ws_missing(ctx, waited);
            self.check_needed_peers(&[], &awaited)?;
            if let Err(e) = self.cancel.check() {
                return Err(self.fail(e));
            }
            interrupt::check()?;
            self.ws_check_peers(ctx, waited)?;
            let Some(ws) = self.ws.as_mut() else {
                return Ok(());
            };
            if ready(ws) {
                return Ok(());
            }
            if spin.again() {
                continue;
            }
            let Some(left) = remaining(ctx.deadline()) else {
                return Err(self.fail(self.timed_out(ctx, waited)));
            };
            if let (Some(host), Some(ws)) = (&self.host, self.ws.as_mut()) {
                let started = Instant::now();
                host.sleep(left.min(WS_NAP), || ready(ws));
                self.waited += started.elapsed();
            }
            self.note_closed_peers();
            if let Some(ws) = self.ws.as_mut() {
                if ready(ws) {
                    return Ok(());
                }
            }
        }
    }

    /// Fails when a waited-for local peer announced a different collective at this
    /// sequence number (it publishes on another kind's flags, so it never arrives here).
    pub(super) fn ws_check_peers(&mut self, ctx: &OpCtx, waited: Peers<'_>) -> Result<()> {
        let Some(ws) = self.ws.as_ref() else {
            return Ok(());
        };
        let differing = waited_ranks(ws, waited).find(|&p| {
            ws.announced(p, ctx.seq)
                .is_some_and(|a| a.seq == ctx.seq && Workspace::differs(&ctx.sig, &a))
        });
        match differing {
            Some(p) => Err(self.ws_mismatch(ctx, p)),
            None => Ok(()),
        }
    }

    /// Fails the transport with a mismatch between this rank and local rank `p`, described
    /// from `p`'s announce line.
    pub(super) fn ws_mismatch(&mut self, ctx: &OpCtx, p: usize) -> Error {
        let Some(ws) = self.ws.as_ref() else {
            return Error::backend("workspace mismatch without a workspace");
        };
        let diff = ws
            .announced(p, ctx.seq)
            .filter(|a| a.seq == ctx.seq)
            .and_then(|a| {
                let (kind, dtype, op) = unpacked(a.sig);
                let theirs = Codes {
                    kind,
                    dtype,
                    op,
                    count: a.count,
                };
                signature_diff(&ctx.sig, theirs)
            })
            .unwrap_or_else(|| "the ranks' steps differ (RUSTDIST_ALGO set differently?)".into());
        let e = Error::backend(format!(
            "{} mismatch between ranks: {diff} (rank {} vs rank {}, collective #{})",
            ctx.sig.kind.name(),
            self.rank,
            ws.group_ranks()[p],
            ctx.seq
        ));
        self.fail(e)
    }

    /// The group ranks of the waited local peers that have not arrived at `ctx`'s step.
    fn ws_missing(&self, ctx: &OpCtx, waited: Peers<'_>) -> Vec<usize> {
        self.ws.as_ref().map_or_else(Vec::new, |ws| {
            waited_ranks(ws, waited)
                .filter(|&p| {
                    let behind = ws.announced(p, ctx.seq).is_some_and(|a| a.seq < ctx.seq);
                    behind || !ws.peek_arrived(p)
                })
                .map(|p| ws.group_ranks()[p])
                .collect()
        })
    }

    /// The timeout of a workspace wait, naming the ranks that did not arrive.
    pub(super) fn timed_out(&self, ctx: &OpCtx, waited: Peers<'_>) -> Error {
        self.timeout_error(ctx, &self.ws_missing(ctx, waited))
    }
}

/// The local ranks `waited` names, this rank excluded.
fn waited_ranks<'a>(ws: &'a Workspace, waited: Peers<'a>) -> impl Iterator<Item = usize> + 'a {
    let me = ws.local_rank();
    let all = 0..ws.local_size();
    let only: &[usize] = match waited {
        Peers::All => &[],
        Peers::Only(list) => list,
    };
    all.filter(move |&p| p != me && (matches!(waited, Peers::All) || only.contains(&p)))
}

impl WorkspaceHost for MeshTransport {
    fn workspace(&self) -> Option<&Workspace> {
        self.ws.as_ref()
    }

    fn workspace_mut(&mut self) -> Option<&mut Workspace> {
        self.ws.as_mut()
    }

    fn await_workspace(
        &mut self,
        ctx: &OpCtx,
        peers: Peers<'_>,
        ready: &mut dyn FnMut(&mut Workspace) -> bool,
    ) -> Result<()> {
        self.ws_await(ctx, peers, ready)
    }

    fn mismatch(&mut self, ctx: &OpCtx, local: usize) -> Error {
        self.ws_mismatch(ctx, local)
    }

    fn wake_local(&self) {
        if let (Some(host), Some(ws)) = (&self.host, &self.ws) {
            host.wake(ws.group_ranks(), self.rank);
        }
    }
}
