//! The mesh over TCP alone (no shared memory), two ranks as threads of this process.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::state::OutFrame;
use super::MeshTransport;
use crate::cancel::Cancel;
use crate::store::{HashStore, Store};
use crate::tensor::RawBuf;
use crate::transport::frame::FrameKind;
use crate::transport::window::WindowMemory;
use crate::transport::Transport;

const TIMEOUT: Duration = Duration::from_secs(20);

fn connect_pair(prefix: &str) -> [MeshTransport; 2] {
    let [a, b]: [MeshTransport; 2] = connect(prefix, 2).try_into().ok().expect("two ranks");
    [a, b]
}

fn connect(prefix: &str, size: usize) -> Vec<MeshTransport> {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let dial = |rank: usize| {
        let (store, prefix) = (store.clone(), prefix.to_string());
        std::thread::spawn(move || {
            let cancel = Arc::new(Cancel::default());
            MeshTransport::connect(
                store,
                &prefix,
                rank,
                size,
                7,
                TIMEOUT,
                false,
                cancel,
                &|_, _, _| Ok(1),
            )
        })
    };
    let dialing: Vec<_> = (0..size).map(dial).collect();
    dialing
        .into_iter()
        .map(|h| {
            h.join()
                .expect("rank thread panicked")
                .expect("mesh connects")
        })
        .collect()
}

/// Pumps `t` until `pending` operations reported success to `rx`.
fn drive(t: &mut MeshTransport, rx: &mpsc::Receiver<crate::Result<usize>>, pending: usize) {
    let deadline = Instant::now() + TIMEOUT;
    let mut done = 0;
    while done < pending {
        t.pump(&|| false).expect("pump");
        while let Ok(outcome) = rx.try_recv() {
            outcome.expect("operation succeeds");
            done += 1;
        }
        assert!(Instant::now() < deadline, "operations did not complete");
    }
}

#[test]
fn stashed_frames_reuse_buffers_and_arrive_intact() {
    let [mut sender, mut receiver] = connect_pair("stash");
    // Round 2 sends a small frame after large ones, into buffers recycled from round 1.
    let rounds: [&[usize]; 2] = [&[100_000, 3, 50_000, 1000], &[70_000, 5, 120_000, 1]];
    let deadline = Instant::now() + TIMEOUT;
    for (round, sizes) in rounds.iter().enumerate() {
        let tag0 = round * sizes.len();
        let mut outboxes: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|b| (b * 7 + tag0 + i) as u8).collect())
            .collect();
        let received = std::thread::scope(|s| {
            let sending = s.spawn(|| {
                let (tx, rx) = mpsc::channel();
                for (i, out) in outboxes.iter_mut().enumerate() {
                    let tx = tx.clone();
                    // SAFETY: the outboxes outlive the scope, which waits for every send.
                    let data = unsafe { RawBuf::new(out.as_mut_ptr(), out.len()) };
                    let tag = (tag0 + i) as i64;
                    sender.post_send(1, tag, data, deadline, Box::new(move |r| drop(tx.send(r))));
                }
                drive(&mut sender, &rx, sizes.len());
            });
            // Receive in reverse tag order: every frame but the last waits in the stash.
            let (tx, rx) = mpsc::channel();
            let mut inboxes: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0xAA; n]).collect();
            for (i, inbox) in inboxes.iter_mut().enumerate().rev() {
                let tx = tx.clone();
                // SAFETY: the inboxes outlive `drive`, which waits for every receive.
                let buf = unsafe { RawBuf::new(inbox.as_mut_ptr(), inbox.len()) };
                let tag = (tag0 + i) as i64;
                receiver.post_recv(
                    Some(0),
                    tag,
                    buf,
                    deadline,
                    Box::new(move |r| drop(tx.send(r))),
                );
                drive(&mut receiver, &rx, 1);
            }
            sending.join().expect("sender thread panicked");
            inboxes
        });
        for (i, (got, want)) in received.iter().zip(&outboxes).enumerate() {
            assert!(got == want, "round {round}, frame {i}: payload differs");
        }
    }
}

#[test]
fn frames_sent_ahead_wait_in_the_link_and_stream_into_their_receive() {
    use crate::transport::{Op, OpCtx, Signature};
    use crate::types::{CollectiveKind, DType, ReduceOp};
    let [mut first, mut second] = connect_pair("held");
    let sig = Signature {
        kind: CollectiveKind::AllToAll,
        dtype: DType::U8,
        op: ReduceOp::Sum,
        count: 1,
    };
    let ctx = OpCtx::new(1, sig, ReduceOp::Sum, TIMEOUT);
    let fill = |n: usize, salt: usize| (0..n).map(|b| (b * 31 + salt) as u8).collect::<Vec<u8>>();
    let (early, ahead) = (fill(300_000, 1), fill(200_000, 2));
    // More than loopback's socket buffers hold (at most 32 MiB received and 4 MiB sent by
    // default): `second` waits for `first` to read it, so `first`'s next frame arrives while
    // `second`'s step expects nothing from it.
    let large = fill(64 << 20, 3);
    let (got_large, (got_early, got_ahead)) = std::thread::scope(|s| {
        let one = s.spawn(|| -> crate::Result<Vec<u8>> {
            first.exchange(
                &ctx,
                &mut [Op::Send {
                    peer: 1,
                    data: &early,
                }],
            )?;
            let mut buf = vec![0u8; large.len()];
            first.exchange(
                &ctx,
                &mut [
                    Op::Send {
                        peer: 1,
                        data: &ahead,
                    },
                    Op::Recv {
                        peer: 1,
                        buf: &mut buf,
                    },
                ],
            )?;
            Ok(buf)
        });
        let two = s.spawn(|| -> crate::Result<(Vec<u8>, Vec<u8>)> {
            let mut got_early = vec![0u8; early.len()];
            second.exchange(
                &ctx,
                &mut [
                    Op::Recv {
                        peer: 0,
                        buf: &mut got_early,
                    },
                    Op::Send {
                        peer: 0,
                        data: &large,
                    },
                ],
            )?;
            let mut got_ahead = vec![0u8; ahead.len()];
            second.exchange(
                &ctx,
                &mut [Op::Recv {
                    peer: 0,
                    buf: &mut got_ahead,
                }],
            )?;
            Ok((got_early, got_ahead))
        });
        let one = one.join().expect("rank 0 panicked").expect("rank 0");
        (one, two.join().expect("rank 1 panicked").expect("rank 1"))
    });
    assert!(got_large == large && got_early == early && got_ahead == ahead);
    // Nothing went through a stash (a consumed stash leaves its buffer for reuse).
    for t in [&first, &second] {
        let peer = t.peers[1 - t.rank].as_ref().expect("peer");
        assert!(peer.collective.is_empty() && peer.spare.is_empty());
    }
}

#[test]
fn a_queued_send_keeps_its_bytes_when_a_receive_is_posted_over_them() {
    let [mut sender, mut receiver] = connect_pair("detach");
    let deadline = Instant::now() + TIMEOUT;
    // Two sends of one buffer: the first queued before a receive is posted over the buffer,
    // the second after. Nothing is flushed until the first pump, and the buffer is then
    // overwritten, as an arriving frame would: both must still carry the bytes posted.
    let mut shared: Vec<u8> = (0..4096).map(|b| (b % 251) as u8).collect();
    let original = shared.clone();
    let (tx, rx) = mpsc::channel();
    // SAFETY: `shared` outlives every operation below, each driven to completion here.
    let buf = unsafe { RawBuf::new(shared.as_mut_ptr(), shared.len()) };
    let done = |tx: &mpsc::Sender<crate::Result<usize>>| {
        let tx = tx.clone();
        Box::new(move |r| drop(tx.send(r)))
    };
    sender.post_send(1, 1, buf, deadline, done(&tx));
    sender.post_recv(Some(1), 9, buf, deadline, done(&tx));
    sender.post_send(1, 2, buf, deadline, done(&tx));
    shared.iter_mut().for_each(|b| *b = 0);
    let mut got = [vec![0u8; 4096], vec![0u8; 4096]];
    let (rtx, rrx) = mpsc::channel();
    for (i, g) in got.iter_mut().enumerate() {
        // SAFETY: `got` outlives the receives, driven to completion below.
        let into = unsafe { RawBuf::new(g.as_mut_ptr(), g.len()) };
        receiver.post_recv(Some(0), i as i64 + 1, into, deadline, done(&rtx));
    }
    let mut reply = vec![0xab_u8; 4096];
    // SAFETY: `reply` outlives the send, driven to completion below.
    let reply_buf = unsafe { RawBuf::new(reply.as_mut_ptr(), reply.len()) };
    receiver.post_send(0, 9, reply_buf, deadline, done(&rtx));
    std::thread::scope(|s| {
        let sender = &mut sender;
        s.spawn(move || drive(sender, &rx, 3));
        drive(&mut receiver, &rrx, 3);
    });
    assert!(
        got[0] == original,
        "the send queued before the receive carried overwritten bytes"
    );
    assert!(
        got[1] == original,
        "the send posted over a pending receive carried later bytes"
    );
    assert!(shared == reply, "the receive lands in the buffer");
}

#[test]
fn a_shrink_skips_what_the_old_group_left_half_sent_and_half_read() {
    const BIG: usize = 48 << 20;
    let [mut a, mut b] = connect_pair("shrink");
    let deadline = Instant::now() + TIMEOUT;
    let mut payload: Vec<u8> = (0..BIG).map(|i| (i % 251) as u8).collect();
    let mut inbox = vec![0u8; BIG];
    let (tx, _rx) = mpsc::channel::<crate::Result<usize>>();
    let (tx2, _rx2) = (tx.clone(), tx.clone());
    // SAFETY: both buffers outlive the transports' use of them (failed below, then shrunk).
    let (out, into) = unsafe {
        (
            RawBuf::new(payload.as_mut_ptr(), BIG),
            RawBuf::new(inbox.as_mut_ptr(), BIG),
        )
    };
    a.post_send(1, 5, out, deadline, Box::new(move |r| drop(tx.send(r))));
    b.post_recv(
        Some(0),
        5,
        into,
        deadline,
        Box::new(move |r| drop(tx2.send(r))),
    );
    // A few rounds: part of the frame has left a, part of that has reached b's receive.
    for _ in 0..3 {
        a.pump(&|| true).expect("pump a");
        b.pump(&|| true).expect("pump b");
    }
    let left = |t: &MeshTransport| t.peers[1 - t.rank].as_ref().map_or(0, |p| p.txq.len());
    assert_eq!(left(&a), 1, "the frame is still being written");
    assert!(matches!(
        b.peers[0].as_ref().unwrap().rx,
        super::state::Rx::Tagged { .. }
    ));
    // The old group fails on both sides (its owners return), with an abort notice queued
    // behind the half-written frame.
    a.abort("test: the old group fails mid-frame");
    b.abort("test: the old group fails mid-frame");
    let shrink = |mut t: MeshTransport| {
        std::thread::spawn(move || {
            let cancel = Arc::new(Cancel::default());
            let new = t.shrink_to(&[], 99, cancel, Instant::now() + TIMEOUT);
            (t, new)
        })
    };
    let (ha, hb) = (shrink(a), shrink(b));
    let (_old_a, new_a) = ha.join().expect("rank 0 panicked");
    let (_old_b, new_b) = hb.join().expect("rank 1 panicked");
    let (mut new_a, mut new_b) = (
        new_a.expect("rank 0 shrinks"),
        new_b.expect("rank 1 shrinks"),
    );
    drop((payload, inbox));
    // The new group's first message arrives whole, right after the markers.
    let mut msg: Vec<u8> = b"the new group's first message".to_vec();
    let mut got = vec![0u8; msg.len()];
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    // SAFETY: both buffers outlive the operations, which `drive` waits for.
    let (out, into) = unsafe {
        (
            RawBuf::new(msg.as_mut_ptr(), msg.len()),
            RawBuf::new(got.as_mut_ptr(), got.len()),
        )
    };
    new_a.post_send(1, 9, out, deadline, Box::new(move |r| drop(tx.send(r))));
    new_b.post_recv(
        Some(0),
        9,
        into,
        deadline,
        Box::new(move |r| drop(tx2.send(r))),
    );
    std::thread::scope(|s| {
        s.spawn(|| {
            let end = Instant::now() + TIMEOUT;
            while new_a.has_pending() && Instant::now() < end {
                new_a.pump(&|| false).expect("pump the new rank 0");
            }
        });
        drive(&mut new_b, &rx, 2);
    });
    assert_eq!(got, msg);
}

/// Rank 0 deregisters a window and leaves once ranks 1 and 2 have closed it there; rank 1's
/// close never reaches rank 2. Rank 2's deregister no longer needs rank 0, so it must time out
/// waiting for rank 1 alone rather than fail because rank 0 left.
#[test]
fn a_deregister_does_not_need_a_peer_that_closed_and_left() {
    let ranks = connect("leave", 3);
    let memories: Vec<_> = (0..3)
        .map(|r| {
            let name = format!("/rustdist-test-{}-leave-{r}", std::process::id());
            let mut memory = WindowMemory::create(&name, 3, 16).expect("window memory");
            memory.unlink();
            Arc::new(memory)
        })
        .collect();
    let (others_done, rank1_may_go) = mpsc::channel::<()>();
    let mut rank1_may_go = Some(rank1_may_go);
    let outcomes: Vec<crate::Result<()>> = std::thread::scope(|s| {
        let mut running: Vec<_> = ranks
            .into_iter()
            .zip(memories)
            .enumerate()
            .map(|(rank, (mut t, memory))| {
                let rank1_may_go = rank1_may_go.take_if(|_| rank == 1);
                s.spawn(move || {
                    let id = t.attach(memory);
                    match rank1_may_go {
                        Some(may_go) => {
                            // Its close to rank 0 only; then it stays, silent.
                            let deadline = Instant::now() + TIMEOUT;
                            t.link(0, deadline)?;
                            let hdr = t.window_header(FrameKind::WindowClose, id, 0, 0);
                            let ticket = t.queue(0, OutFrame::owned(hdr, Vec::new()))?;
                            while !t.flushed(0, ticket) {
                                t.flush_peer(0)?;
                                assert!(Instant::now() < deadline, "rank 1's close not sent");
                            }
                            let _ = may_go.recv();
                            Ok(())
                        }
                        None if rank == 0 => {
                            t.close(id, Instant::now() + TIMEOUT)?;
                            t.shutdown();
                            Ok(())
                        }
                        None => t.close(id, Instant::now() + Duration::from_secs(2)),
                    }
                })
            })
            .collect();
        let rank1 = running.remove(1);
        let mut outcomes: Vec<_> = running
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect();
        drop(others_done);
        outcomes.insert(1, rank1.join().expect("rank 1's thread panicked"));
        outcomes
    });
    assert!(outcomes[0].is_ok(), "rank 0: {:?}", outcomes[0]);
    let rank2 = outcomes[2]
        .as_ref()
        .expect_err("rank 2's close cannot complete")
        .to_string();
    assert!(
        rank2.contains("timed out") && rank2.contains("waiting for ranks [1]"),
        "{rank2}"
    );
}

/// Rank 0 queues a put of 4 MiB (more than a socket takes at once) to rank 1 and shuts down
/// before anything was written: its goodbye goes behind the put, so the whole put lands and
/// rank 1 sees a clean leave, not a death.
#[test]
fn a_put_queued_before_shutdown_still_lands() {
    const PUT: usize = 4 << 20;
    let [mut leaving, mut staying] = connect_pair("goodbye");
    let name = |r: usize| format!("/rustdist-test-{}-goodbye-{r}", std::process::id());
    let mut memory = WindowMemory::create(&name(1), 2, PUT + 4).expect("window memory");
    memory.unlink();
    let memory = Arc::new(memory);
    let mut unused = WindowMemory::create(&name(0), 2, 16).expect("window memory");
    unused.unlink();
    let deadline = Instant::now() + TIMEOUT;
    let payload: Vec<u8> = (0..PUT).map(|i| (i % 251) as u8).collect();
    std::thread::scope(|s| {
        s.spawn(|| {
            let id = leaving.attach(Arc::new(unused));
            leaving.link(1, deadline).expect("link to rank 1");
            let hdr = leaving.window_header(FrameKind::WindowPut, id, 4, payload.len());
            leaving
                .queue(1, OutFrame::owned(hdr, payload.clone()))
                .expect("queued");
            leaving.shutdown();
        });
        staying.attach(memory.clone());
        // SAFETY: PUT + 4 registered bytes, read while only this thread's sweeps write them.
        let landed = || unsafe { std::slice::from_raw_parts(memory.data().add(4), PUT) } == payload;
        while !landed() {
            staying.sweep().expect("rank 0 leaves cleanly");
            assert!(Instant::now() < deadline, "rank 0's put never landed");
        }
    });
}

/// The tests above again with every link over TLS (pinned keys; these ranks share a host,
/// hence `RUSTDIST_TLS_LOCAL`), in a child process that has those settings.
#[test]
fn the_mesh_tests_again_over_tls() {
    const CHILD: &str = "RUSTDIST_TLS_MESH_CHILD";
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["transport::mesh::tests::", "--test-threads=2"])
        .env(CHILD, "1")
        .env("RUSTDIST_TLS", "1")
        .env("RUSTDIST_TLS_LOCAL", "1")
        .env("RUSTDIST_AUTH_KEY", "mesh test")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(" passed; 0 failed"), "{text}");
}
