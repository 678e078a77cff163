//! Process groups over the real TCP transport, one thread per rank, rendezvous via HashStore.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustdist_core::group::{Blocks, Reduction, Run};
use rustdist_core::store::{HashStore, Store};
use rustdist_core::tensor::{RawBuf, Tensor};
use rustdist_core::{CollectiveKind, DType, Error, ProcessGroup, ReduceOp, Work};

fn f32_tensor(v: &mut [f32]) -> Tensor {
    // SAFETY: the vector outlives the Work in every test (each waits before returning).
    unsafe { Tensor::new(v.as_mut_ptr() as *mut u8, DType::F32, v.len()) }
}

/// Waits for an operation started asynchronously.
fn wait(started: rustdist_core::Result<Option<Work>>) -> rustdist_core::Result<()> {
    match started? {
        Some(work) => work.wait(None),
        None => Ok(()),
    }
}

fn run_world<F>(n: usize, name: &str, f: F)
where
    F: Fn(ProcessGroup) + Send + Sync + 'static,
{
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let f = Arc::new(f);
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let store = store.clone();
            let f = f.clone();
            let name = name.to_string();
            std::thread::spawn(move || {
                let pg = ProcessGroup::new(store, rank, n, &name, Duration::from_secs(10)).unwrap();
                f(pg)
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn all_reduce_sizes_and_worlds() {
    for n in 1..=4 {
        run_world(n, &format!("ar{n}"), move |pg| {
            let rank = pg.rank();
            for numel in [0usize, 1, 3, 7, 1000, 100_003] {
                let mut v: Vec<f32> = (0..numel).map(|i| (i % 13) as f32 + rank as f32).collect();
                wait(pg.all_reduce(f32_tensor(&mut v), sum(), Run::detached())).unwrap();
                let expect: Vec<f32> = (0..numel)
                    .map(|i| (0..n).map(|r| (i % 13) as f32 + r as f32).sum())
                    .collect();
                assert_eq!(v, expect, "world {n} numel {numel}");
            }
        });
    }
}

#[test]
fn broadcast_gather_scatter_barrier_p2p() {
    for n in 1..=4 {
        run_world(n, &format!("mix{n}"), move |pg| {
            let rank = pg.rank();
            for root in 0..n {
                let mut v: Vec<f32> = vec![rank as f32; 1001];
                wait(pg.broadcast(f32_tensor(&mut v), root, Run::detached())).unwrap();
                assert!(v.iter().all(|&x| x == root as f32));
            }
            let mut input = vec![rank as f32 + 1.0; 5];
            let mut out = vec![0f32; 5 * n];
            let blocks: Vec<RawBuf> = out
                .chunks_mut(5)
                .map(|c| RawBuf::from_mut_slice(bytemuck_f32(c)))
                .collect();
            wait(pg.all_gather(f32_tensor(&mut input), blocks, Run::detached())).unwrap();
            for r in 0..n {
                assert!(out[r * 5..r * 5 + 5].iter().all(|&x| x == r as f32 + 1.0));
            }
            let mut rs_in: Vec<f32> = (0..3 * n).map(|i| i as f32).collect();
            let mut rs_out = vec![0f32; 3];
            wait(pg.reduce_scatter(
                f32_tensor(&mut rs_in),
                f32_tensor(&mut rs_out),
                sum(),
                Run::detached(),
            ))
            .unwrap();
            let expect: Vec<f32> = (0..3).map(|i| ((rank * 3 + i) * n) as f32).collect();
            assert_eq!(rs_out, expect);
            wait(pg.barrier(Run::detached())).unwrap();
            if n > 1 {
                let right = (rank + 1) % n;
                let left = (rank + n - 1) % n;
                let mut s = vec![rank as f32; 10];
                let mut r = vec![0f32; 10];
                let sw = pg.send(f32_tensor(&mut s), right, 7, None).unwrap();
                let rw = pg.recv(f32_tensor(&mut r), None, 7, None).unwrap();
                sw.wait(None).unwrap();
                rw.wait(None).unwrap();
                assert_eq!(rw.source_rank(), Some(left));
                assert!(r.iter().all(|&x| x == left as f32));
            }
        });
    }
}

fn sum() -> Reduction {
    Reduction::new(ReduceOp::Sum, None).unwrap()
}

fn bytemuck_f32(c: &mut [f32]) -> &mut [u8] {
    // SAFETY: f32 has no invalid bit patterns; the byte view covers exactly the same memory.
    unsafe { std::slice::from_raw_parts_mut(c.as_mut_ptr() as *mut u8, c.len() * 4) }
}

#[test]
fn size_mismatch_fails_every_rank() {
    run_world(3, "mismatch", |pg| {
        let numel = if pg.rank() == 2 { 20 } else { 10 };
        let mut v = vec![1f32; numel];
        let err = wait(pg.all_reduce(f32_tensor(&mut v), sum(), Run::detached())).unwrap_err();
        assert!(matches!(err, Error::Backend(_)), "{err:?}");
        assert!(err.to_string().contains("size"), "{err}");
        // Sticky: the group stays failed.
        assert!(wait(pg.barrier(Run::detached())).is_err());
    });
}

#[test]
fn dead_peer_is_reported_by_every_survivor() {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let n = 4;
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let store = store.clone();
            std::thread::spawn(move || {
                let pg =
                    ProcessGroup::new(store, rank, n, "dead", Duration::from_secs(30)).unwrap();
                // Rank 1 may leave the barrier and abort before a slower peer has finished
                // it, so survivors may already fail here; either way they must name rank 1.
                let entered = wait(pg.barrier(Run::detached()));
                if rank == 1 {
                    // Dropping the group without shutdown is a crash as far as peers can tell.
                    pg.abort();
                    return None;
                }
                if let Err(e) = entered {
                    assert!(e.to_string().contains("rank 1"), "{e}");
                }
                let start = Instant::now();
                let mut v = vec![1f32; 4];
                let res = wait(pg.all_reduce(f32_tensor(&mut v), sum(), Run::detached()));
                Some((res, start.elapsed()))
            })
        })
        .collect();
    for h in handles {
        if let Some((res, took)) = h.join().unwrap() {
            let err = res.unwrap_err();
            assert!(err.to_string().contains("rank 1"), "{err}");
            assert!(took < Duration::from_secs(2), "{took:?}");
        }
    }
}

#[test]
fn posted_receives_never_block_later_operations() {
    for n in [2usize, 3] {
        run_world(n, &format!("p2p{n}"), move |pg| {
            let rank = pg.rank();
            let peer = (rank + 1) % n;
            let from = (rank + n - 1) % n;
            // Receive first, then send and run a collective: a blocking receive would deadlock.
            let mut inbox = vec![0f32; 100_000];
            let recv = pg
                .recv(f32_tensor(&mut inbox), Some(from), 3, None)
                .unwrap();
            let mut total = vec![1f32; 8];
            let ar = pg
                .all_reduce(f32_tensor(&mut total), sum(), Run::detached())
                .unwrap()
                .unwrap();
            let mut outbox = vec![rank as f32; 100_000];
            let send = pg.send(f32_tensor(&mut outbox), peer, 3, None).unwrap();
            ar.wait(None).unwrap();
            send.wait(None).unwrap();
            recv.wait(None).unwrap();
            assert_eq!(recv.source_rank(), Some(from));
            assert!(inbox.iter().all(|&x| x == from as f32));
            assert!(total.iter().all(|&x| x == n as f32));
        });
    }
}

#[test]
fn tags_are_matched_not_arrival_order() {
    run_world(2, "tags", |pg| {
        if pg.rank() == 0 {
            let mut a = vec![1f32; 4];
            let mut b = vec![2f32; 4];
            let wa = pg.send(f32_tensor(&mut a), 1, 1, None).unwrap();
            let wb = pg.send(f32_tensor(&mut b), 1, 2, None).unwrap();
            wa.wait(None).unwrap();
            wb.wait(None).unwrap();
        } else {
            let mut b = vec![0f32; 4];
            let mut a = vec![0f32; 4];
            pg.recv(f32_tensor(&mut b), Some(0), 2, None)
                .unwrap()
                .wait(None)
                .unwrap();
            pg.recv(f32_tensor(&mut a), None, 1, None)
                .unwrap()
                .wait(None)
                .unwrap();
            assert_eq!((a[0], b[0]), (1.0, 2.0));
        }
        wait(pg.barrier(Run::detached())).unwrap();
    });
}

#[test]
fn reduce_avg_premul_and_self_messages() {
    for n in 1..=4 {
        run_world(n, &format!("red{n}"), move |pg| {
            let rank = pg.rank();
            for root in 0..n {
                let mut v = vec![rank as f32 + 1.0; 9];
                wait(pg.reduce(f32_tensor(&mut v), root, sum(), Run::detached())).unwrap();
                let want = if rank == root {
                    (n * (n + 1) / 2) as f32
                } else {
                    rank as f32 + 1.0
                };
                assert!(v.iter().all(|&x| x == want), "root {root}: {v:?}");
            }
            let mut v = vec![rank as f32 * 2.0; 5];
            let avg = Reduction::new(ReduceOp::Avg, None).unwrap();
            wait(pg.all_reduce(f32_tensor(&mut v), avg, Run::detached())).unwrap();
            assert!(v.iter().all(|&x| x == (n - 1) as f32), "{v:?}");
            let mut v = vec![1f32; 5];
            let premul = Reduction::new(ReduceOp::PremulSum, Some(0.5)).unwrap();
            wait(pg.all_reduce(f32_tensor(&mut v), premul, Run::detached())).unwrap();
            assert!(v.iter().all(|&x| x == n as f32 * 0.5), "{v:?}");
            let mut out = vec![0f32; 3];
            let mut inp = vec![7f32; 3];
            let s = pg.send(f32_tensor(&mut inp), rank, 9, None).unwrap();
            let r = pg.recv(f32_tensor(&mut out), Some(rank), 9, None).unwrap();
            s.wait(None).unwrap();
            r.wait(None).unwrap();
            assert_eq!(out, vec![7f32; 3]);
        });
    }
}

#[test]
fn exchange_serves_gather_and_uneven_all_to_all() {
    for n in 1..=4 {
        run_world(n, &format!("x{n}"), move |pg| {
            let rank = pg.rank();
            // all_to_all with rank r sending (r + p + 1) elements of value 10r+p to rank p.
            let mut outgoing: Vec<Vec<f32>> = (0..n)
                .map(|p| vec![(10 * rank + p) as f32; rank + p + 1])
                .collect();
            let mut incoming: Vec<Vec<f32>> = (0..n).map(|p| vec![0f32; p + rank + 1]).collect();
            let sends = outgoing
                .iter_mut()
                .enumerate()
                .map(|(p, b)| (p, f32_tensor(b).buf))
                .collect();
            let recvs = incoming
                .iter_mut()
                .enumerate()
                .map(|(p, b)| (p, f32_tensor(b).buf))
                .collect();
            wait(pg.exchange(
                CollectiveKind::AllToAll,
                DType::F32,
                0,
                Blocks { sends, recvs },
                Run::detached(),
            ))
            .unwrap();
            for (p, b) in incoming.iter().enumerate() {
                assert!(
                    b.iter().all(|&x| x == (10 * p + rank) as f32),
                    "from {p}: {b:?}"
                );
            }
        });
    }
}

#[test]
fn exchange_length_mismatch_fails_every_rank() {
    for n in 2..=4 {
        run_world(n, &format!("xm{n}"), move |pg| {
            let rank = pg.rank();
            // Rank 1 sends 5 elements to every other rank, which all expect 4: a mismatched
            // length is caught, not silently truncated.
            let len = |p: usize| if rank == 1 && p != 1 { 5 } else { 4 };
            let mut outgoing: Vec<Vec<f32>> = (0..n).map(|p| vec![0f32; len(p)]).collect();
            let mut incoming: Vec<Vec<f32>> = (0..n).map(|_| vec![0f32; 4]).collect();
            let sends = outgoing
                .iter_mut()
                .enumerate()
                .map(|(p, b)| (p, f32_tensor(b).buf))
                .collect();
            let recvs = incoming
                .iter_mut()
                .enumerate()
                .map(|(p, b)| (p, f32_tensor(b).buf))
                .collect();
            let blocks = Blocks { sends, recvs };
            let err = wait(pg.exchange(
                CollectiveKind::AllToAll,
                DType::F32,
                0,
                blocks,
                Run::detached(),
            ))
            .unwrap_err();
            assert!(err.to_string().contains("bytes"), "{err}");
        });
    }
}

#[test]
fn monitored_barrier_names_the_missing_rank() {
    run_world(3, "mon", |pg| {
        pg.monitored_barrier(Duration::from_secs(5), false)
            .unwrap()
            .wait(None)
            .unwrap();
        if pg.rank() == 2 {
            // Rank 2 skips the second barrier; the others hear about it.
            wait(pg.barrier(Run::detached())).unwrap();
            return;
        }
        let err = pg
            .monitored_barrier(Duration::from_millis(300), true)
            .unwrap()
            .wait(None)
            .unwrap_err();
        if pg.rank() == 0 {
            let msg = err.to_string();
            assert!(
                msg.contains("Ranks 2 failed to pass monitoredBarrier"),
                "{msg}"
            );
            assert!(
                msg.contains("Rank 0 timed out in monitoredBarrier after 300 ms. Successfully processed ranks: 1)"),
                "{msg}"
            );
        } else {
            let msg = err.to_string();
            let reached = format!(
                "Rank {} successfully reached monitoredBarrier, but received errors while \
                 waiting for send/recv from rank 0",
                pg.rank()
            );
            assert!(msg.contains(&reached), "{msg}");
            assert!(msg.contains("failed on rank 0"), "{msg}");
        }
        // The group still works afterwards.
        wait(pg.barrier(Run::detached())).unwrap();
    });
}
