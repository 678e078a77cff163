//! Criterion benches of all_reduce between threads of one process: ring and recursive doubling
//! over TCP on loopback, one- and two-shot in the shared-memory workspace (rendezvous through
//! an in-process HashStore).
//!
//! Rank 0 runs on the bench thread and times `iters` back-to-back all_reduces; the other
//! ranks run the same number on their own threads.
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rustdist_core::algorithms::select::AllReduceAlgo;
use rustdist_core::algorithms::{all_reduce, AlgoOverrides};
use rustdist_core::cancel::Cancel;
use rustdist_core::store::{HashStore, Store};
use rustdist_core::transport::mesh::MeshTransport;
use rustdist_core::transport::{OpCtx, Signature, Transport};
use rustdist_core::{CollectiveKind, DType, ReduceOp};

const TIMEOUT: Duration = Duration::from_secs(60);

/// One rank's side of a timed run: `iters` all_reduces of `bytes` f32 bytes.
fn run_iters(
    t: &mut MeshTransport,
    seq: &mut u64,
    bytes: usize,
    iters: u64,
    algos: &AlgoOverrides,
) {
    let mut buf = vec![0x3cu8; bytes];
    for _ in 0..iters {
        *seq += 1;
        let ctx = OpCtx::new(
            *seq,
            Signature {
                kind: CollectiveKind::AllReduce,
                dtype: DType::F32,
                op: ReduceOp::Sum,
                count: (bytes / 4) as u64,
            },
            ReduceOp::Sum,
            TIMEOUT,
        );
        all_reduce(t, &ctx, &mut buf, algos).unwrap();
    }
}

/// A worker rank: its command channel (`Some((bytes, iters))` runs, `None` stops) and thread.
type Worker = (Sender<Option<(usize, u64)>>, JoinHandle<()>);

/// A world of `n` connected ranks; rank 0 stays on the caller's thread.
struct World {
    rank0: MeshTransport,
    seq: u64,
    workers: Vec<Worker>,
    algos: AlgoOverrides,
}

impl World {
    fn new(n: usize, algos: AlgoOverrides, shared_memory: bool) -> World {
        let store: Arc<dyn Store> = Arc::new(HashStore::new());
        let connect = move |store: Arc<dyn Store>, rank| {
            let cancel = Arc::new(Cancel::default());
            MeshTransport::connect(
                store,
                "bench",
                rank,
                n,
                0,
                TIMEOUT,
                shared_memory,
                cancel,
                &|_, _, _| Ok(1),
            )
            .unwrap()
        };
        let workers = (1..n)
            .map(|rank| {
                let (tx, rx) = channel::<Option<(usize, u64)>>();
                let store = store.clone();
                let h = std::thread::spawn(move || {
                    let mut t = connect(store, rank);
                    let mut seq = 0;
                    while let Ok(Some((bytes, iters))) = rx.recv() {
                        run_iters(&mut t, &mut seq, bytes, iters, &algos);
                    }
                    t.shutdown();
                });
                (tx, h)
            })
            .collect();
        World {
            rank0: connect(store, 0),
            seq: 0,
            workers,
            algos,
        }
    }

    fn time(&mut self, bytes: usize, iters: u64) -> Duration {
        for (tx, _) in &self.workers {
            tx.send(Some((bytes, iters))).unwrap();
        }
        let start = Instant::now();
        run_iters(&mut self.rank0, &mut self.seq, bytes, iters, &self.algos);
        start.elapsed()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for (tx, h) in self.workers.drain(..) {
            let _ = tx.send(None);
            h.join().unwrap();
        }
        self.rank0.shutdown();
    }
}

fn allreduce(c: &mut Criterion) {
    let network = [AllReduceAlgo::Ring, AllReduceAlgo::RecursiveDoubling];
    let in_memory = [AllReduceAlgo::ShmOneShot, AllReduceAlgo::ShmTwoShot];
    for (link, shared_memory, algos) in [("tcp", false, network), ("shm", true, in_memory)] {
        for world in [2usize, 4] {
            for algo in algos {
                let algos = AlgoOverrides {
                    all_reduce: Some(algo),
                    ..AlgoOverrides::default()
                };
                let mut w = World::new(world, algos, shared_memory);
                let mut g =
                    c.benchmark_group(format!("all_reduce_{link}/world{world}/{}", algo.name()));
                for bytes in [8usize, 4 << 10, 256 << 10, 4 << 20, 32 << 20] {
                    g.throughput(Throughput::Bytes(bytes as u64));
                    g.bench_function(BenchmarkId::from_parameter(bytes), |b| {
                        b.iter_custom(|iters| w.time(bytes, iters))
                    });
                }
                g.finish();
            }
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = allreduce
}
criterion_main!(benches);
