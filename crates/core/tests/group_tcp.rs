//! Process groups over the real TCP transport, one thread per rank, rendezvous via HashStore.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustdist_core::store::{HashStore, Store};
use rustdist_core::tensor::{RawBuf, Tensor};
use rustdist_core::{DType, Error, ProcessGroup, ReduceOp};

fn f32_tensor(v: &mut [f32]) -> Tensor {
    // SAFETY: the vector outlives the Work in every test (each waits before returning).
    unsafe { Tensor::new(v.as_mut_ptr() as *mut u8, DType::F32, v.len()) }
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
                pg.all_reduce(f32_tensor(&mut v), ReduceOp::Sum, None)
                    .unwrap()
                    .wait(None)
                    .unwrap();
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
                pg.broadcast(f32_tensor(&mut v), root, None)
                    .unwrap()
                    .wait(None)
                    .unwrap();
                assert!(v.iter().all(|&x| x == root as f32));
            }
            let mut input = vec![rank as f32 + 1.0; 5];
            let mut out = vec![0f32; 5 * n];
            let blocks: Vec<RawBuf> = out
                .chunks_mut(5)
                .map(|c| RawBuf::from_mut_slice(bytemuck_f32(c)))
                .collect();
            pg.all_gather(f32_tensor(&mut input), blocks, None)
                .unwrap()
                .wait(None)
                .unwrap();
            for r in 0..n {
                assert!(out[r * 5..r * 5 + 5].iter().all(|&x| x == r as f32 + 1.0));
            }
            let mut rs_in: Vec<f32> = (0..3 * n).map(|i| i as f32).collect();
            let mut rs_out = vec![0f32; 3];
            pg.reduce_scatter(
                f32_tensor(&mut rs_in),
                f32_tensor(&mut rs_out),
                ReduceOp::Sum,
                None,
            )
            .unwrap()
            .wait(None)
            .unwrap();
            let expect: Vec<f32> = (0..3).map(|i| ((rank * 3 + i) * n) as f32).collect();
            assert_eq!(rs_out, expect);
            pg.barrier().unwrap().wait(None).unwrap();
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

fn bytemuck_f32(c: &mut [f32]) -> &mut [u8] {
    // SAFETY: f32 has no invalid bit patterns; the byte view covers exactly the same memory.
    unsafe { std::slice::from_raw_parts_mut(c.as_mut_ptr() as *mut u8, c.len() * 4) }
}

#[test]
fn size_mismatch_fails_every_rank() {
    run_world(3, "mismatch", |pg| {
        let numel = if pg.rank() == 2 { 20 } else { 10 };
        let mut v = vec![1f32; numel];
        let err = pg
            .all_reduce(f32_tensor(&mut v), ReduceOp::Sum, None)
            .unwrap()
            .wait(None)
            .unwrap_err();
        assert!(matches!(err, Error::Backend(_)), "{err:?}");
        assert!(err.to_string().contains("size"), "{err}");
        // Sticky: the group stays failed.
        assert!(pg.barrier().unwrap().wait(None).is_err());
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
                pg.barrier().unwrap().wait(None).unwrap();
                if rank == 1 {
                    // Dropping the group without shutdown is a crash as far as peers can tell.
                    pg.abort();
                    return None;
                }
                let start = Instant::now();
                let mut v = vec![1f32; 4];
                let res = pg
                    .all_reduce(f32_tensor(&mut v), ReduceOp::Sum, None)
                    .unwrap()
                    .wait(None);
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
                .all_reduce(f32_tensor(&mut total), ReduceOp::Sum, None)
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
        pg.barrier().unwrap().wait(None).unwrap();
    });
}
