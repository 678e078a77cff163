//! A world far past the small ones of the other tests, as threads of one process over loopback
//! TCP: 128 ranks rendezvous through one TCP store server, all entering at the same instant,
//! and run collectives checked element by element. Before the acceptor stopped dropping
//! handshakes past 64 in flight, no rank of a world of 96 or more finished init.
//!
//! The world is bounded by this process's fds: a full mesh holds both ends of every link here
//! (128 ranks: about 16,500 of the 20,000 the machine allows).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use rustdist_core::group::{Reduction, Run};
use rustdist_core::store::tcp::server::raise_fd_limit;
use rustdist_core::store::tcp::{TcpStore, TcpStoreOptions};
use rustdist_core::store::Store;
use rustdist_core::tensor::{RawBuf, Tensor};
use rustdist_core::{DType, ProcessGroup, ReduceOp, Work};

const WORLD: usize = 128;
/// Every rank must be through init and the collectives within this.
const BOUND: Duration = Duration::from_secs(120);

fn wait(started: rustdist_core::Result<Option<Work>>) -> rustdist_core::Result<()> {
    match started? {
        Some(work) => work.wait(None),
        None => Ok(()),
    }
}

fn f32_tensor(v: &mut [f32]) -> Tensor {
    // SAFETY: the vector outlives the Work (each call is waited for before returning).
    unsafe { Tensor::new(v.as_mut_ptr() as *mut u8, DType::F32, v.len()) }
}

fn bytes(c: &mut [f32]) -> &mut [u8] {
    // SAFETY: f32 has no invalid bit patterns; the byte view covers exactly the same memory.
    unsafe { std::slice::from_raw_parts_mut(c.as_mut_ptr() as *mut u8, c.len() * 4) }
}

fn store(port: u16, master: bool) -> Arc<TcpStore> {
    let opts = TcpStoreOptions {
        port,
        is_master: master,
        timeout: BOUND,
        ..TcpStoreOptions::default()
    };
    Arc::new(TcpStore::new(opts).expect("store"))
}

/// What one rank does: init, then every collective checked against what every rank computes.
fn rank_main(pg: &ProcessGroup) {
    let (rank, n) = (pg.rank(), WORLD);
    let sum = || Reduction::new(ReduceOp::Sum, None).unwrap();
    // 8 B and 1 MiB all_reduce (latency- and bandwidth-bound algorithms).
    for numel in [2usize, 1 << 18] {
        let mut v: Vec<f32> = (0..numel).map(|i| (i % 7 + rank) as f32).collect();
        wait(pg.all_reduce(f32_tensor(&mut v), sum(), Run::detached())).unwrap();
        let base: usize = (0..n).sum();
        let ok = (v.iter().enumerate()).all(|(i, &x)| x == ((i % 7) * n + base) as f32);
        assert!(ok, "rank {rank}: all_reduce of {numel} floats is wrong");
    }
    wait(pg.barrier(Run::detached())).unwrap();
    let mut v = vec![rank as f32; 3];
    wait(pg.broadcast(f32_tensor(&mut v), n - 1, Run::detached())).unwrap();
    assert_eq!(v, vec![(n - 1) as f32; 3], "rank {rank}: broadcast");
    let mut input = vec![rank as f32; 2];
    let mut out = vec![-1f32; 2 * n];
    let blocks: Vec<RawBuf> = (out.chunks_mut(2))
        .map(|c| RawBuf::from_mut_slice(bytes(c)))
        .collect();
    wait(pg.all_gather(f32_tensor(&mut input), blocks, Run::detached())).unwrap();
    let ok = (out.chunks(2).enumerate()).all(|(r, c)| c == [r as f32; 2]);
    assert!(ok, "rank {rank}: all_gather");
}

#[test]
fn a_world_of_128_ranks_starts_and_runs_over_tcp() {
    let (soft, _) = raise_fd_limit();
    assert!(
        soft >= 18_000,
        "a full mesh of {WORLD} ranks in one process needs about 16,500 fds; the limit is {soft}"
    );
    // SAFETY: set before any thread of this test binary (which holds only this test) starts.
    unsafe { std::env::set_var("RUSTDIST_SHM", "0") };
    let master = store(0, true);
    let port = master.port();
    let master: Arc<dyn Store> = master;
    let start = Arc::new(Barrier::new(WORLD));
    let began = Instant::now();
    let ranks: Vec<_> = (0..WORLD)
        .map(|rank| {
            let start = start.clone();
            let own = (rank == 0).then(|| master.clone());
            std::thread::Builder::new()
                .stack_size(1 << 20)
                .spawn(move || {
                    let store = own.unwrap_or_else(|| store(port, false) as Arc<dyn Store>);
                    start.wait();
                    let pg = ProcessGroup::new(store, rank, WORLD, "scale", BOUND)
                        .unwrap_or_else(|e| panic!("rank {rank}: init failed: {e}"));
                    rank_main(&pg);
                })
                .expect("a rank's thread")
        })
        .collect();
    for (rank, t) in ranks.into_iter().enumerate() {
        assert!(t.join().is_ok(), "rank {rank} failed (its panic is above)");
    }
    assert!(began.elapsed() < BOUND, "took {:?}", began.elapsed());
}
