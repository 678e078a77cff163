//! In-memory transport between threads of one process, for tests of the algorithms and benches.
//!
//! Every rank owns one inbound channel that all peers send into; frames are sorted into
//! per-source queues on arrival, so receiving from one peer never blocks on another. Sends never
//! block (unbounded channels), which gives the "sends never wait for this rank's receives"
//! guarantee of [`Transport::exchange`]. It carries collectives only (no point-to-point).
//!
//! [`mesh_on_hosts`] places the ranks on test "hosts": the ranks of a host share a workspace
//! in heap memory (the same protocol as the shared-memory one), so the shared-memory and
//! hierarchical algorithms run here too.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::VecDeque;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::reduce;
use crate::transport::cma;
use crate::transport::workspace::{Workspace, REGION_BYTES};
use crate::transport::{Op, OpCtx, Peers, SharedMemory, Signature, Transport, WorkspaceHost};

enum Payload {
    Collective {
        seq: u64,
        sig: Signature,
        data: Vec<u8>,
    },
    Abort(String),
    Shutdown,
}

struct Envelope {
    src: usize,
    payload: Payload,
}

struct Frame {
    seq: u64,
    sig: Signature,
    data: Vec<u8>,
}

/// One rank's end of an in-memory mesh made by [`mesh`].
pub struct LocalTransport {
    rank: usize,
    peers: Vec<Sender<Envelope>>,
    inbox: Receiver<Envelope>,
    /// Collective frames received but not yet matched, per source rank.
    frames: Vec<VecDeque<Frame>>,
    /// Peers that called `shutdown`.
    closed: Vec<bool>,
    /// Set once a peer aborted; every later call fails with it.
    aborted: Option<Error>,
    /// Host index of every rank.
    host_of: Vec<usize>,
    /// The workspace of this rank's host, when it holds several ranks.
    ws: Option<Workspace>,
    /// The memory `ws` points into (after it, so it is freed last).
    _memory: Option<Arc<HostMemory>>,
}

/// Zeroed, page-aligned workspace regions shared by the ranks of one test host.
struct HostMemory {
    regions: Vec<*mut u8>,
}

// SAFETY: plain heap memory; the ranks touch it only through the workspace protocol.
unsafe impl Send for HostMemory {}
// SAFETY: as above.
unsafe impl Sync for HostMemory {}

fn region_layout() -> Layout {
    Layout::from_size_align(REGION_BYTES, 4096).unwrap_or_else(|_| Layout::new::<u8>())
}

impl HostMemory {
    fn new(ranks: usize) -> HostMemory {
        let regions = (0..ranks)
            // SAFETY: a non-zero-sized layout; freed in Drop with the same layout.
            .map(|_| unsafe { alloc_zeroed(region_layout()) })
            .collect::<Vec<_>>();
        assert!(regions.iter().all(|r| !r.is_null()), "out of memory");
        HostMemory { regions }
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        for &r in &self.regions {
            // SAFETY: allocated in `new` with this layout, freed once.
            unsafe { dealloc(r, region_layout()) };
        }
    }
}

/// Creates `n` connected transports; element `r` is rank `r`'s.
pub fn mesh(n: usize) -> Vec<LocalTransport> {
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| channel()).unzip();
    rxs.into_iter()
        .enumerate()
        .map(|(rank, inbox)| LocalTransport {
            rank,
            peers: txs.clone(),
            inbox,
            frames: (0..n).map(|_| VecDeque::new()).collect(),
            closed: vec![false; n],
            aborted: None,
            host_of: (0..n).collect(),
            ws: None,
            _memory: None,
        })
        .collect()
}

/// Creates a mesh of `host_of.len()` ranks where rank r sits on host `host_of[r]` (hosts
/// numbered by their lowest rank): the ranks of a host share a workspace.
pub fn mesh_on_hosts(host_of: &[usize]) -> Vec<LocalTransport> {
    let n = host_of.len();
    let hosts = host_of.iter().max().map_or(0, |&h| h + 1);
    let members: Vec<Vec<usize>> = (0..hosts)
        .map(|h| (0..n).filter(|&r| host_of[r] == h).collect())
        .collect();
    let memory: Vec<Arc<HostMemory>> = members
        .iter()
        .map(|m| Arc::new(HostMemory::new(m.len())))
        .collect();
    let mut ranks = mesh(n);
    for (r, t) in ranks.iter_mut().enumerate() {
        let h = host_of[r];
        t.host_of = host_of.to_vec();
        if members[h].len() > 1 {
            let me = members[h].iter().position(|&x| x == r).unwrap_or(0);
            let mem = memory[h].clone();
            // SAFETY: every region is REGION_BYTES, zeroed, 4096-aligned, and kept alive by
            // `_memory` as long as the workspace.
            let ws = unsafe { Workspace::new(me, members[h].clone(), mem.regions.clone()) };
            // One process: every rank may read the others' memory (single copy).
            let pids = vec![cma::pid(); members[h].len()];
            t.ws = Some(ws.with_pids(Some(pids)));
            t._memory = Some(mem);
        }
    }
    ranks
}

fn describe_mismatch(ours: &Signature, theirs: &Signature) -> String {
    if ours.kind != theirs.kind {
        format!("collective {} vs {}", ours.kind.name(), theirs.kind.name())
    } else if ours.dtype != theirs.dtype {
        format!("dtype {} vs {}", ours.dtype.name(), theirs.dtype.name())
    } else if ours.op != theirs.op {
        format!(
            "op ReduceOp.{} vs ReduceOp.{}",
            ours.op.name(),
            theirs.op.name()
        )
    } else {
        format!("element count {} vs {}", ours.count, theirs.count)
    }
}

impl LocalTransport {
    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.peers.len() {
            return Err(Error::invalid(format!(
                "peer rank {peer} out of range for world size {}",
                self.peers.len()
            )));
        }
        Ok(())
    }

    fn post(&self, peer: usize, payload: Payload) -> Result<()> {
        self.check_peer(peer)?;
        let env = Envelope {
            src: self.rank,
            payload,
        };
        self.peers[peer]
            .send(env)
            .map_err(|_| Error::network(format!("rank {}: rank {peer} is gone", self.rank)))
    }

    /// Waits for one envelope and files it; fails on deadline or abort.
    fn pump(&mut self, deadline: Instant, what: &str) -> Result<()> {
        if let Some(e) = &self.aborted {
            return Err(e.clone());
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        let env = match self.inbox.recv_timeout(wait) {
            Ok(env) => env,
            Err(RecvTimeoutError::Timeout) => {
                return Err(Error::backend(format!(
                    "rank {}: timed out waiting for {what}",
                    self.rank
                )))
            }
            // Unreachable while we hold a sender to ourselves; kept as a typed error anyway.
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Error::network(format!(
                    "rank {}: mesh torn down",
                    self.rank
                )))
            }
        };
        match env.payload {
            Payload::Collective { seq, sig, data } => {
                self.frames[env.src].push_back(Frame { seq, sig, data })
            }
            Payload::Shutdown => self.closed[env.src] = true,
            Payload::Abort(reason) => {
                let e = Error::backend(format!(
                    "rank {}: rank {} aborted the group: {reason}",
                    self.rank, env.src
                ));
                self.aborted = Some(e.clone());
                return Err(e);
            }
        }
        Ok(())
    }

    /// The next collective frame from `peer`, checked against `ctx` and `len`.
    fn next_frame(&mut self, ctx: &OpCtx, peer: usize, len: usize) -> Result<Vec<u8>> {
        self.check_peer(peer)?;
        let frame = loop {
            if let Some(f) = self.frames[peer].pop_front() {
                break f;
            }
            if self.closed[peer] {
                return Err(Error::network(format!(
                    "rank {}: rank {peer} left the group",
                    self.rank
                )));
            }
            let what = format!("{} data from rank {peer}", ctx.sig.kind.name());
            self.pump(ctx.deadline(), &what)?;
        };
        let me = self.rank;
        if frame.sig != ctx.sig {
            return Err(Error::backend(format!(
                "{}: rank {me} and rank {peer} disagree: {} (rank {me} vs rank {peer})",
                ctx.sig.kind.name(),
                describe_mismatch(&ctx.sig, &frame.sig)
            )));
        }
        if frame.seq != ctx.seq {
            return Err(Error::backend(format!(
                "{}: rank {me} is at collective #{} but rank {peer} sent #{}",
                ctx.sig.kind.name(),
                ctx.seq,
                frame.seq
            )));
        }
        if frame.data.len() != len {
            return Err(Error::backend(format!(
                "{}: rank {me} expected {len} bytes from rank {peer}, got {}",
                ctx.sig.kind.name(),
                frame.data.len()
            )));
        }
        Ok(frame.data)
    }
}

impl LocalTransport {
    /// Polls `ready` (yielding) until it holds or `ctx`'s deadline passes.
    fn ws_poll(
        &mut self,
        ctx: &OpCtx,
        ready: &mut dyn FnMut(&mut Workspace) -> bool,
    ) -> Result<()> {
        let rank = self.rank;
        let Some(ws) = self.ws.as_mut() else {
            return Err(Error::Runtime("no workspace on this host".into()));
        };
        ws.begin(ctx.seq, &ctx.sig);
        loop {
            if ready(ws) {
                return Ok(());
            }
            if Instant::now() >= ctx.deadline() {
                return Err(Error::backend(format!(
                    "rank {rank}: {} (collective #{}) Timed out in the workspace",
                    ctx.sig.kind.name(),
                    ctx.seq
                )));
            }
            std::thread::yield_now();
        }
    }
}

impl WorkspaceHost for LocalTransport {
    fn workspace(&self) -> Option<&Workspace> {
        self.ws.as_ref()
    }

    fn workspace_mut(&mut self) -> Option<&mut Workspace> {
        self.ws.as_mut()
    }

    fn await_workspace(
        &mut self,
        ctx: &OpCtx,
        _peers: Peers<'_>,
        ready: &mut dyn FnMut(&mut Workspace) -> bool,
    ) -> Result<()> {
        self.ws_poll(ctx, ready)
    }

    fn mismatch(&mut self, ctx: &OpCtx, local: usize) -> Error {
        Error::backend(format!(
            "{} mismatch between ranks: rank {} and local rank {local} disagree (collective #{})",
            ctx.sig.kind.name(),
            self.rank,
            ctx.seq
        ))
    }
}

impl Transport for LocalTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.peers.len()
    }

    fn host_of(&self) -> &[usize] {
        &self.host_of
    }

    fn shared(&mut self) -> Option<&mut dyn SharedMemory> {
        if self.ws.is_some() {
            Some(self)
        } else {
            None
        }
    }

    fn exchange(&mut self, ctx: &OpCtx, ops: &mut [Op<'_>]) -> Result<()> {
        if let Some(e) = &self.aborted {
            return Err(e.clone());
        }
        // All sends first: they never block, so receives cannot deadlock against them.
        for op in ops.iter() {
            if let Op::Send { peer, data } = op {
                let payload = Payload::Collective {
                    seq: ctx.seq,
                    sig: ctx.sig,
                    data: data.to_vec(),
                };
                self.post(*peer, payload)?;
            }
        }
        for op in ops.iter_mut() {
            match op {
                Op::Send { .. } => {}
                Op::Recv { peer, buf } => {
                    let data = self.next_frame(ctx, *peer, buf.len())?;
                    buf.copy_from_slice(&data);
                }
                Op::RecvReduce { peer, buf } => {
                    let data = self.next_frame(ctx, *peer, buf.len())?;
                    reduce::reduce_into(ctx.sig.dtype, ctx.reduce, buf, &data)?;
                }
            }
        }
        Ok(())
    }

    fn abort(&mut self, reason: &str) {
        for peer in 0..self.peers.len() {
            if peer != self.rank {
                // A peer that is already gone needs no notice.
                let _ = self.post(peer, Payload::Abort(reason.to_string()));
            }
        }
    }

    fn shutdown(&mut self) {
        for peer in 0..self.peers.len() {
            if peer != self.rank {
                // A peer that is already gone needs no notice.
                let _ = self.post(peer, Payload::Shutdown);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::transport::WITHDRAW_GRACE;
    use crate::types::{CollectiveKind, DType, ReduceOp};

    fn ctx(kind: CollectiveKind, dtype: DType, ms: u64) -> OpCtx {
        OpCtx::new(
            0,
            Signature {
                kind,
                dtype,
                op: ReduceOp::Sum,
                count: 2,
            },
            ReduceOp::Sum,
            Duration::from_millis(ms),
        )
    }

    #[test]
    fn flag_only_steps_stay_within_depth_and_wait_for_the_room_asked() {
        use crate::transport::workspace::DEPTH;
        let mut ranks = mesh_on_hosts(&[0, 0]);
        let (first, second) = ranks.split_at_mut(1);
        let a = first[0].ws.as_mut().expect("a workspace");
        let b = second[0].ws.as_mut().expect("a workspace");
        for _ in 0..DEPTH - 1 {
            assert!(a.may_write(false));
            a.publish(&[]);
        }
        // The next step's flag entry is the one rank 1 has yet to read.
        assert!(!a.may_write(false));
        b.publish(&[]);
        assert!(a.may_write(false));
        for _ in 1..DEPTH / 2 {
            assert!(!a.may_write_flag(DEPTH / 2));
            b.publish(&[]);
        }
        assert!(!a.may_write_flag(DEPTH / 2));
        b.publish(&[]);
        assert!(a.may_write_flag(DEPTH / 2));
    }

    #[test]
    fn single_copy_says_whether_the_ranks_share_cores() {
        use crate::algorithms::common::single_copy_available;
        use crate::transport::workspace::SingleCopy;
        let mut ranks = mesh_on_hosts(&[0, 0]);
        let t = &mut ranks[0];
        assert_eq!(single_copy_available(t), SingleCopy::CoreEach);
        t.ws = t.ws.take().map(|ws| ws.with_cores(1));
        assert!(t.shared().is_some_and(|ws| ws.oversubscribed()));
        assert_eq!(single_copy_available(t), SingleCopy::SharedCores);
        t.ws = t.ws.take().map(|ws| ws.with_pids(None));
        assert_eq!(single_copy_available(t), SingleCopy::Unavailable);
        assert_eq!(
            single_copy_available(&mut mesh(2)[0]),
            SingleCopy::Unavailable
        );
    }

    #[test]
    fn single_copy_needs_ranks_that_may_read_each_other() {
        let mut ranks = mesh_on_hosts(&[0, 0]);
        for t in &mut ranks {
            t.ws = t.ws.take().map(|ws| ws.with_pids(None));
        }
        let c = ctx(CollectiveKind::AllGather, DType::U8, 5000);
        for t in &mut ranks {
            let ws = t.shared().expect("a workspace");
            assert!(!ws.single_copy());
            let e = crate::algorithms::allgather::single_copy::all_gather_from(
                t,
                &c,
                None,
                &mut [&mut [0u8; 2][..], &mut [0u8; 2][..]],
            )
            .unwrap_err();
            assert!(e.to_string().contains("process_vm_readv"), "{e}");
        }
    }

    #[test]
    fn a_reader_that_withdrew_its_buffer_is_not_written_any_more() {
        let mut ranks = mesh_on_hosts(&[0, 0]);
        let (first, second) = ranks.split_at_mut(1);
        let root = first[0].shared().expect("a workspace");
        let reader = second[0].shared().expect("a workspace");
        let c = ctx(CollectiveKind::Broadcast, DType::U8, 5000);
        let (mut before, mut after) = ([0u8; 4], [0u8; 4]);
        root.begin_writes(&c);
        root.write_to(&c, 1, before.as_mut_ptr() as usize, &[7; 4])
            .unwrap();
        root.end_writes(&c);
        // The root is done: the reader returns at once, and nothing is written after.
        reader.withdraw(&c, 0);
        root.write_to(&c, 1, after.as_mut_ptr() as usize, &[7; 4])
            .unwrap();
        assert_eq!((before, after), ([7; 4], [0; 4]));
    }

    #[test]
    fn withdrawing_waits_for_a_writer_that_has_begun() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let mut ranks = mesh_on_hosts(&[0, 0]);
        let mut reader = ranks.pop().expect("rank 1");
        let mut root_rank = ranks.pop().expect("rank 0");
        let root = root_rank.shared().expect("a workspace");
        let c = ctx(CollectiveKind::Broadcast, DType::U8, 5000);
        root.begin_writes(&c);
        let returned = Arc::new(AtomicBool::new(false));
        let (c1, flag) = (c.clone(), returned.clone());
        let h = std::thread::spawn(move || {
            reader.shared().expect("a workspace").withdraw(&c1, 0);
            flag.store(true, Ordering::SeqCst);
        });
        // Once the reader has withdrawn, the root's writes to it are skipped.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut probe = [0u8; 4];
            root.write_to(&c, 1, probe.as_mut_ptr() as usize, &[7; 4])
                .unwrap();
            if probe == [0; 4] {
                break;
            }
            assert!(Instant::now() < deadline, "the reader never withdrew");
            std::thread::yield_now();
        }
        // It returns only once the root is done: give a wrong early return its chance.
        for _ in 0..10_000 {
            std::thread::yield_now();
        }
        assert!(
            !returned.load(Ordering::SeqCst),
            "returned while the root wrote"
        );
        root.end_writes(&c);
        h.join().expect("the reader");
        assert!(returned.load(Ordering::SeqCst));
    }

    #[test]
    fn withdrawing_does_not_wait_for_a_writer_that_has_exited() {
        let mut ranks = mesh_on_hosts(&[0, 0]);
        // Rank 0's process is gone (no process has this id) in the middle of its writes.
        ranks[1].ws = ranks[1]
            .ws
            .take()
            .map(|ws| ws.with_pids(Some(vec![i32::MAX, cma::pid()])));
        let c = ctx(CollectiveKind::Broadcast, DType::U8, 5000);
        let (first, second) = ranks.split_at_mut(1);
        first[0].shared().expect("a workspace").begin_writes(&c);
        let started = Instant::now();
        second[0].shared().expect("a workspace").withdraw(&c, 0);
        assert!(
            started.elapsed() < WITHDRAW_GRACE / 2,
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn reading_a_peer_that_has_exited_is_a_network_error() {
        let mut ranks = mesh_on_hosts(&[0, 0]);
        let t = &mut ranks[0];
        // Rank 1's process is gone: no process has this id.
        t.ws =
            t.ws.take()
                .map(|ws| ws.with_pids(Some(vec![cma::pid(), i32::MAX])));
        let c = ctx(CollectiveKind::AllGather, DType::U8, 5000);
        let ws = t.shared().expect("a workspace");
        let e = ws
            .read_from(&c, 1, cma::probe_address(), &mut [0u8; 8])
            .unwrap_err();
        assert!(
            matches!(&e, Error::Network(m) if m.contains("rank 1 has exited")),
            "{e:?}"
        );
    }

    #[test]
    fn exchange_recv_reduce_and_fifo_per_pair() {
        let mut m = mesh(2);
        let mut t1 = m.pop().unwrap();
        let mut t0 = m.pop().unwrap();
        let c = ctx(CollectiveKind::AllReduce, DType::I32, 5000);
        let c1 = c.clone();
        let h = std::thread::spawn(move || {
            let (a, b) = (3i32.to_le_bytes(), 4i32.to_le_bytes());
            let mut ops = [
                Op::Send { peer: 0, data: &a },
                Op::Send { peer: 0, data: &[] },
                Op::Send { peer: 0, data: &b },
            ];
            t1.exchange(&c1, &mut ops).unwrap();
        });
        let mut x = 10i32.to_le_bytes();
        let mut empty = [0u8; 0];
        let mut y = [0u8; 4];
        let mut ops = [
            Op::RecvReduce {
                peer: 1,
                buf: &mut x,
            },
            Op::Recv {
                peer: 1,
                buf: &mut empty,
            },
            Op::Recv {
                peer: 1,
                buf: &mut y,
            },
        ];
        t0.exchange(&c, &mut ops).unwrap();
        h.join().unwrap();
        assert_eq!(i32::from_le_bytes(x), 13);
        assert_eq!(i32::from_le_bytes(y), 4);
    }

    #[test]
    fn signature_mismatch_names_both_ranks() {
        let mut m = mesh(2);
        let c0 = ctx(CollectiveKind::AllReduce, DType::F32, 5000);
        let c1 = ctx(CollectiveKind::AllReduce, DType::I64, 5000);
        m[1].exchange(
            &c1,
            &mut [Op::Send {
                peer: 0,
                data: &[0; 4],
            }],
        )
        .unwrap();
        let mut buf = [0u8; 4];
        let e = m[0]
            .exchange(
                &c0,
                &mut [Op::Recv {
                    peer: 1,
                    buf: &mut buf,
                }],
            )
            .unwrap_err();
        let Error::Backend(msg) = e else {
            panic!("{e:?}")
        };
        assert!(msg.contains("rank 0") && msg.contains("rank 1"), "{msg}");
        assert!(msg.contains("float32") && msg.contains("int64"), "{msg}");
    }

    #[test]
    fn length_mismatch_and_timeout_are_backend_errors() {
        let mut m = mesh(2);
        let c = ctx(CollectiveKind::Broadcast, DType::U8, 50);
        m[1].exchange(
            &c,
            &mut [Op::Send {
                peer: 0,
                data: &[1, 2],
            }],
        )
        .unwrap();
        let mut buf = [0u8; 3];
        let e = m[0]
            .exchange(
                &c,
                &mut [Op::Recv {
                    peer: 1,
                    buf: &mut buf,
                }],
            )
            .unwrap_err();
        assert!(
            matches!(e, Error::Backend(ref s) if s.contains("expected 3 bytes")),
            "{e:?}"
        );
        let e = m[0]
            .exchange(
                &c,
                &mut [Op::Recv {
                    peer: 1,
                    buf: &mut buf,
                }],
            )
            .unwrap_err();
        assert!(
            matches!(e, Error::Backend(ref s) if s.contains("timed out")),
            "{e:?}"
        );
    }
}
