//! One-sided windows over the links (SEPARATE access): a put travels as a frame that the
//! owner's engine streams into its window as it arrives (`rx::on_window_frame`), a signal as an
//! empty frame behind the puts it follows, so the owner that sees the signal has the puts. The
//! owner's worker reads the links while a window is attached (`serve_windows`), sleeping in
//! poll(2), so puts land whatever its program is doing, and no core is burnt meanwhile.

use std::sync::Arc;
use std::time::Instant;

use super::progress::PUMP_NAP;
use super::state::{AttachedWindow, MeshTransport, OutFrame};
use crate::error::{Error, Result};
use crate::interrupt;
use crate::spin::Spin;
use crate::transport::frame::{FrameKind, Header};
use crate::transport::window::WindowMemory;
use crate::transport::{remaining, P2pDone, WindowFrame};

impl MeshTransport {
    pub(super) fn window_header(
        &self,
        kind: FrameKind,
        window: u32,
        offset: u64,
        len: usize,
    ) -> Header {
        Header {
            kind,
            coll: 0,
            dtype: 0,
            op: 0,
            group: self.group,
            step: window,
            seq: offset,
            count: len as u64,
            len: len as u64,
        }
    }

    pub(super) fn attach(&mut self, memory: Arc<WindowMemory>) -> u32 {
        let id = self.windows_made;
        self.windows_made += 1;
        self.windows.push(AttachedWindow {
            id,
            memory,
            closed: vec![false; self.size],
        });
        id
    }

    pub(super) fn queue_window_frame(
        &mut self,
        peer: usize,
        window: u32,
        frame: WindowFrame,
        deadline: Instant,
        done: P2pDone,
    ) {
        let valid = self.check_failed().and_then(|()| match peer == self.rank {
            // The group's layer puts into and signals its own window itself.
            true => Err(Error::Runtime(
                "a window frame addressed to this rank itself".into(),
            )),
            false => self.link(peer, deadline),
        });
        if let Err(e) = valid {
            return done(Err(e));
        }
        let mut out = match frame {
            WindowFrame::Put {
                offset,
                data,
                eager,
            } => {
                let hdr = self.window_header(FrameKind::WindowPut, window, offset, data.len());
                let mut out = OutFrame::owned(hdr, Vec::new());
                out.data = data;
                out.owned = None;
                // A put reads its tensor as it is now, even where a receive posted earlier
                // will write.
                if eager || self.posted.iter().any(|r| r.buf.overlaps(&data)) {
                    out.detach();
                }
                if eager && self.peers[peer].as_ref().is_some_and(|x| x.txq.is_empty()) {
                    // Done now: the frame owns its bytes and waits for the next frame to
                    // `peer` (or the worker's next round); no pending transfer, so the
                    // program's next call still runs on its own thread.
                    done(Ok(peer));
                    return self.queue_or_fail(peer, out);
                }
                // Puts back to back: an eager one goes out now with the one left waiting.
                out
            }
            WindowFrame::Signal => OutFrame::owned(
                self.window_header(FrameKind::WindowSignal, window, 0, 0),
                Vec::new(),
            ),
        };
        out.done = Some((done, deadline));
        self.queue_or_fail(peer, out);
    }

    fn queue_or_fail(&mut self, peer: usize, out: OutFrame) {
        if let Err(e) = self.queue(peer, out) {
            self.fail(e);
        }
    }

    /// Moves bytes until `arrived`, reading the `awaited` peers every round (nothing else
    /// marks them needed), and fails when one that `still_needed` is gone, the group fails or
    /// at `deadline` (an error naming `what`). Spins briefly, then sleeps in poll(2).
    pub(super) fn progress_until(
        &mut self,
        awaited: &[usize],
        still_needed: &dyn Fn(&MeshTransport, usize) -> bool,
        arrived: &dyn Fn(&MeshTransport) -> bool,
        deadline: Instant,
        what: &dyn Fn(&MeshTransport) -> String,
    ) -> Result<()> {
        // Awaited may be this rank's own frame leaving (a signal): written, it is done without
        // a read of any link.
        for &p in awaited {
            if self.peers[p].as_ref().is_some_and(|x| !x.txq.is_empty()) {
                self.flush_peer(p)?;
            }
        }
        if arrived(self) {
            return Ok(());
        }
        let mut ready = Vec::new();
        let mut needed = Vec::with_capacity(awaited.len());
        let mut spin = Spin::new();
        loop {
            let mut moved = self.serve_peers(None, &mut [], &mut ready)?;
            for &p in awaited {
                moved |= self.read_peer(p, None, &mut [])?;
            }
            if arrived(self) {
                return Ok(());
            }
            self.check_failed()?;
            if let Err(e) = self.cancel.check() {
                return Err(self.fail(e));
            }
            interrupt::check()?;
            // A peer that did its part may leave meanwhile (destroy its group) unnoticed.
            needed.clear();
            needed.extend(awaited.iter().copied().filter(|&p| still_needed(self, p)));
            self.check_needed_peers(&[], &needed)?;
            if moved {
                spin = Spin::new();
                continue;
            }
            if spin.again() {
                continue;
            }
            let Some(left) = remaining(deadline) else {
                return Err(Error::backend(format!("{} timed out", what(self))));
            };
            self.block(left.min(interrupt::POLL), &mut ready)?;
            spin = Spin::new();
        }
    }

    /// Deregisters window `window` on this rank: a close frame to every peer behind what this
    /// rank sent it, and every peer's close awaited (what they sent before it is applied then).
    pub(super) fn close(&mut self, window: u32, deadline: Instant) -> Result<()> {
        let Some(slot) = self.windows.iter().position(|w| w.id == window) else {
            return Err(Error::Runtime(format!("window {window} is not attached")));
        };
        let rank = self.rank;
        let mut sent = Vec::new();
        for p in (0..self.size).filter(|&p| p != rank) {
            self.link(p, deadline)?;
            let hdr = self.window_header(FrameKind::WindowClose, window, 0, 0);
            sent.push((p, self.queue(p, OutFrame::owned(hdr, Vec::new()))?));
        }
        let arrived = |t: &MeshTransport| {
            let w = &t.windows[slot];
            (0..t.size).all(|p| p == rank || w.closed[p])
                && sent.iter().all(|&(p, ticket)| t.flushed(p, ticket))
        };
        let open: Vec<usize> = (0..self.size)
            .filter(|&p| p != rank && !self.windows[slot].closed[p])
            .collect();
        let close_awaited = |t: &MeshTransport, p: usize| !t.windows[slot].closed[p];
        let what = |t: &MeshTransport| {
            let left: Vec<usize> = open
                .iter()
                .copied()
                .filter(|&p| close_awaited(t, p))
                .collect();
            format!("deregistering the window (waiting for ranks {left:?})")
        };
        self.progress_until(&open, &close_awaited, &arrived, deadline, &what)?;
        self.windows.remove(slot);
        Ok(())
    }

    /// What the group's worker may poll(2) without the engine while only windows are
    /// attached: every open link's descriptors and the on-demand arrivals' (None where a poll
    /// would miss news: shared-memory links, TLS bytes already decrypted, frames queued).
    pub(super) fn sleep_fds(&self) -> Option<Vec<libc::pollfd>> {
        let peers = self.peers.iter().flatten().filter(|peer| !peer.closed);
        let mut fds = Vec::new();
        for peer in peers {
            let news = peer.link.buffered() && !peer.unread();
            if peer.link.in_memory() || news || !peer.txq.is_empty() {
                return None;
            }
            if !peer.unread() {
                fds.extend(peer.link.pollfds(true, false));
            }
        }
        fds.extend(self.on_demand.as_ref().map(|d| d.wake_fd()));
        Some(fds)
    }

    /// Reads every peer once (and takes links made to this rank); whether bytes moved.
    pub(super) fn sweep(&mut self) -> Result<bool> {
        self.check_failed()?;
        if let Err(e) = self.cancel.check() {
            return Err(self.fail(e));
        }
        self.swept = None;
        self.serve_peers(None, &mut [], &mut Vec::new())
    }

    /// The worker's round while windows are attached and nothing else is pending, where it
    /// cannot sleep without the engine (`sleep_fds`): reads what arrived, else sleeps until a
    /// link has news, work is queued (`wake`) or a nap passes.
    pub(super) fn serve_windows(&mut self, interrupt: &dyn Fn() -> bool) -> Result<()> {
        let mut ready = Vec::new();
        if self.serve_peers(None, &mut [], &mut ready)? || interrupt() {
            return Ok(());
        }
        if let Err(e) = self.cancel.check() {
            return Err(self.fail(e));
        }
        // Shared-memory links wake no poll(2): those groups nap briefly.
        let nap = if self.host.is_some() {
            PUMP_NAP
        } else {
            interrupt::POLL
        };
        self.block(nap, &mut ready)?;
        self.serve_peers(None, &mut [], &mut ready)?;
        Ok(())
    }
}
