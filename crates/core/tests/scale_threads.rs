//! Worlds far past the small ones of the other tests, as threads of one process over loopback
//! TCP: 128 and 1,024 ranks rendezvous through one TCP store server, all entering at the same instant,
//! and run collectives checked element by element. Before the acceptor stopped dropping
//! handshakes past 64 in flight, no rank of a world of 96 or more finished init.
//!
//! Links are made on first use, so the world is not bounded by this process's fds (a full mesh
//! of 128 ranks held about 16,500 of the 20,000 the machine allows): 1,024 ranks run too.

use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use rustdist_core::group::{Reduction, Run};
use rustdist_core::store::tcp::server::raise_fd_limit;
use rustdist_core::store::tcp::{TcpStore, TcpStoreOptions};
use rustdist_core::store::Store;
use rustdist_core::tensor::{RawBuf, Tensor};
use rustdist_core::{DType, ProcessGroup, ReduceOp, Work};

static ONE_WORLD: Mutex<()> = Mutex::new(());
/// Every rank must be through init and the collectives within this. 1,024 ranks on the 2-core
/// VM take 42-78 s, and took 149 s in an hour when the VM ran slow (its handshakes then ran
/// out of a 120 s bound).
const BOUND: Duration = Duration::from_secs(300);

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
    let (rank, n) = (pg.rank(), pg.size());
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

/// Starts `world` ranks as threads over loopback TCP (one TCP store served by rank 0's
/// thread), all entering init at one instant, with heartbeats failing the group after
/// `heartbeat_misses` missed beats; runs `body` on each and, while every group still stands,
/// returns how many fds this process holds.
fn run_world(world: usize, heartbeat_misses: &str, body: fn(&ProcessGroup)) -> usize {
    // One world at a time: the tests share this process and its fds.
    let _alone = ONE_WORLD.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: no other thread reads the environment meanwhile (worlds run one at a time, and
    // the value is the same for all).
    unsafe {
        std::env::set_var("RUSTDIST_SHM", "0");
        std::env::set_var("RUSTDIST_HEARTBEAT_MISSES", heartbeat_misses);
    }
    let master = store(0, true);
    let port = master.port();
    let master: Arc<dyn Store> = master;
    let start = Arc::new(Barrier::new(world));
    let done = Arc::new(Barrier::new(world + 1));
    let released = Arc::new(Barrier::new(world + 1));
    let began = Instant::now();
    let ranks: Vec<_> = (0..world)
        .map(|rank| {
            let (start, done, released) = (start.clone(), done.clone(), released.clone());
            let own = (rank == 0).then(|| master.clone());
            std::thread::Builder::new()
                .stack_size(1 << 20)
                .spawn(move || {
                    let store = own.unwrap_or_else(|| store(port, false) as Arc<dyn Store>);
                    start.wait();
                    // A failed rank still reaches the barriers, so that the others end too.
                    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let pg = ProcessGroup::new(store, rank, world, "scale", BOUND);
                        let pg = pg.unwrap_or_else(|e| panic!("rank {rank}: init failed: {e}"));
                        body(&pg);
                        pg
                    }));
                    done.wait();
                    released.wait();
                    if let Err(panic) = ran {
                        std::panic::resume_unwind(panic);
                    }
                })
                .expect("a rank's thread")
        })
        .collect();
    done.wait();
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    released.wait();
    for (rank, t) in ranks.into_iter().enumerate() {
        assert!(t.join().is_ok(), "rank {rank} failed (its panic is above)");
    }
    assert!(began.elapsed() < BOUND, "took {:?}", began.elapsed());
    fds
}

#[test]
fn a_world_of_128_ranks_starts_and_runs_over_tcp() {
    raise_fd_limit();
    run_world(128, "5", rank_main);
}

/// At 1,024 ranks only the links the collectives use are made: a full mesh would hold both
/// ends of 523,776 connections here, past what any process may open.
#[test]
fn a_world_of_1024_ranks_links_only_the_peers_it_uses() {
    const WORLD: usize = 1024;
    let (soft, _) = raise_fd_limit();
    // Per rank: a listener, a UDP socket, an eventfd, a store connection (both ends here),
    // its two ring links and the log2(world) partners of recursive doubling.
    let bound = WORLD * (6 + 2 + WORLD.ilog2() as usize);
    assert!(
        soft as usize >= bound + 64,
        "{WORLD} ranks need up to {bound} fds; the limit is {soft}"
    );
    // 1,024 ranks spinning on 2 cores: a rank's beats can wait seconds for a core here.
    let fds = run_world(WORLD, "120", |pg| {
        let (rank, n) = (pg.rank(), pg.size());
        let sum = || Reduction::new(ReduceOp::Sum, None).unwrap();
        // 8 B (recursive doubling: log2(world) partners) and 1 MiB (the ring).
        for numel in [2usize, 1 << 18] {
            let mut v: Vec<f32> = (0..numel).map(|i| (i % 7 + rank % 3) as f32).collect();
            wait(pg.all_reduce(f32_tensor(&mut v), sum(), Run::detached())).unwrap();
            let base: usize = (0..n).map(|r| r % 3).sum();
            let ok = (v.iter().enumerate()).all(|(i, &x)| x == ((i % 7) * n + base) as f32);
            assert!(ok, "rank {rank}: all_reduce of {numel} floats is wrong");
        }
    });
    println!("{WORLD} ranks: {fds} fds open after the collectives (bound {bound})");
    assert!(
        fds <= bound,
        "{fds} fds open for {WORLD} ranks (bound {bound})"
    );
}
