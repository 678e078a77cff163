//! Changing a group's timeout (torch's `_set_default_timeout`): operations issued after the
//! change run under the new timeout, operations issued before keep theirs; and the other way a
//! blocking call ends early, an interruption (Ctrl-C). Two ranks, one thread each, over the
//! real transport; a rank arrives late by sleeping past a timeout.

use std::cell::Cell;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use rustdist_core::group::{Reduction, Run};
use rustdist_core::store::{HashStore, Store};
use rustdist_core::tensor::Tensor;
use rustdist_core::{interrupt, DType, Error, ProcessGroup, ReduceOp};

fn sum() -> Reduction {
    Reduction::new(ReduceOp::Sum, None).unwrap()
}

fn f32_tensor(v: &mut [f32]) -> Tensor {
    // SAFETY: every test waits for its operations before the vector goes away.
    unsafe { Tensor::new(v.as_mut_ptr() as *mut u8, DType::F32, v.len()) }
}

/// A synchronous all_reduce of `v`.
fn all_reduce(pg: &ProcessGroup, v: &mut [f32]) -> rustdist_core::Result<()> {
    pg.all_reduce(f32_tensor(v), sum(), Run::Sync).map(|_| ())
}

/// Runs `f(group, barrier)` on two ranks of a group made with `timeout`.
fn world2<F>(name: &str, timeout: Duration, f: F)
where
    F: Fn(ProcessGroup, &Barrier) + Send + Sync + 'static,
{
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let f = Arc::new(f);
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let (store, f, barrier, name) =
                (store.clone(), f.clone(), barrier.clone(), name.to_string());
            std::thread::spawn(move || {
                let pg = ProcessGroup::new(store, rank, 2, &name, timeout).unwrap();
                f(pg, &barrier)
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn shortened_timeout_fails_a_later_collective_on_time() {
    world2("shorten", Duration::from_secs(30), |pg, barrier| {
        assert_eq!(pg.timeout(), Duration::from_secs(30));
        pg.set_timeout(Duration::from_millis(400));
        assert_eq!(pg.timeout(), Duration::from_millis(400));
        if pg.rank() == 0 {
            let t0 = Instant::now();
            let err = all_reduce(&pg, &mut [1.0; 4]).unwrap_err();
            let took = t0.elapsed();
            assert!(matches!(err, Error::Backend(_)), "{err:?}");
            assert!(err.to_string().contains("Timed out"), "{err}");
            assert!(
                took >= Duration::from_millis(350) && took < Duration::from_secs(5),
                "failed after {took:?} under a 400 ms timeout (30 s before the change)"
            );
        }
        // Rank 1 never joins; it stays in the group until rank 0 has timed out.
        barrier.wait();
    });
}

#[test]
fn lengthened_timeout_lets_a_late_rank_join() {
    world2("lengthen", Duration::from_secs(1), |pg, barrier| {
        pg.set_timeout(Duration::from_secs(30));
        barrier.wait();
        if pg.rank() == 1 {
            std::thread::sleep(Duration::from_millis(2000)); // past the 1 s it was made with
        }
        let mut v = [pg.rank() as f32 + 1.0; 4];
        all_reduce(&pg, &mut v).unwrap();
        assert_eq!(v, [3.0; 4]);
    });
}

#[test]
fn an_operation_keeps_the_timeout_it_was_issued_with() {
    world2("issued", Duration::from_secs(30), |pg, barrier| {
        if pg.rank() == 0 {
            let mut early = [1.0f32; 4];
            let work = pg
                .all_reduce(f32_tensor(&mut early), sum(), Run::detached())
                .unwrap()
                .unwrap();
            // Issued under 30 s: the shorter timeout set now is not its.
            pg.set_timeout(Duration::from_millis(300));
            barrier.wait();
            work.wait(None).unwrap();
            assert_eq!(early, [2.0; 4]);
            // Issued after the change: 300 ms, and rank 1 does not join it.
            let t0 = Instant::now();
            let err = all_reduce(&pg, &mut [1.0; 4]).unwrap_err();
            assert!(matches!(err, Error::Backend(_)), "{err:?}");
            assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
            barrier.wait();
        } else {
            barrier.wait();
            std::thread::sleep(Duration::from_millis(1000)); // past rank 0's new 300 ms
            let mut v = [1.0f32; 4];
            all_reduce(&pg, &mut v).unwrap();
            assert_eq!(v, [2.0; 4]);
            barrier.wait();
        }
    });
}

thread_local! {
    /// Whether this thread's interruptible waits are told to stop (Python's pending SIGINT).
    static STOP: Cell<bool> = const { Cell::new(false) };
}

fn stop_requested() -> bool {
    STOP.with(Cell::get)
}

#[test]
fn interrupted_sync_call_behind_other_work_returns_once_the_worker_is_done() {
    interrupt::install(stop_requested);
    world2("interrupt", Duration::from_secs(30), |pg, barrier| {
        if pg.rank() == 0 {
            // Rank 1 never joins: the worker runs this until the group fails.
            let mut ahead = [1.0f32; 4];
            let first = pg
                .all_reduce(f32_tensor(&mut ahead), sum(), Run::Async(None))
                .unwrap()
                .unwrap();
            let _on = interrupt::enable();
            STOP.with(|s| s.set(true));
            let err = all_reduce(&pg, &mut [1.0; 4]).unwrap_err();
            assert_eq!(err, Error::Interrupted);
            // The caller frees its buffers on return: the worker must be past them.
            assert!(
                first.is_completed(),
                "returned while the worker still ran the operation queued ahead"
            );
        }
        barrier.wait();
    });
}
