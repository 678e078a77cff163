//! Shrinking a group over the real TCP transport (one thread per rank; every test of this
//! binary sets RUSTDIST_SHM=0): the survivors go on over their links after a rank left in the
//! middle of a large collective, nothing of the old group reaches the new one, survivors that
//! disagree fail, and pending work is refused or aborted.

use std::sync::{Arc, Barrier, Once};
use std::time::Duration;

use rustdist_core::group::{Reduction, Run};
use rustdist_core::store::{HashStore, Store};
use rustdist_core::tensor::Tensor;
use rustdist_core::{DType, Error, ProcessGroup, ReduceOp};

fn tcp_only() {
    static ONCE: Once = Once::new();
    // Every test of this binary sets the same value before any group exists.
    ONCE.call_once(|| std::env::set_var("RUSTDIST_SHM", "0"));
}

fn f32_tensor(v: &mut [f32]) -> Tensor {
    // SAFETY: the vector outlives the operation in every test (each waits before returning).
    unsafe { Tensor::new(v.as_mut_ptr() as *mut u8, DType::F32, v.len()) }
}

fn sum() -> Reduction {
    Reduction::new(ReduceOp::Sum, None).unwrap()
}

fn all_reduce(pg: &ProcessGroup, v: &mut [f32]) -> rustdist_core::Result<()> {
    pg.all_reduce(f32_tensor(v), sum(), Run::Sync).map(|_| ())
}

/// Runs `f(group)` on `n` ranks, each on a thread of its own; returns their results in rank
/// order.
fn run_world<T, F>(n: usize, name: &str, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(ProcessGroup) -> T + Send + Sync + 'static,
{
    tcp_only();
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let f = Arc::new(f);
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let (store, f, name) = (store.clone(), f.clone(), name.to_string());
            std::thread::spawn(move || {
                let pg = ProcessGroup::new(store, rank, n, &name, Duration::from_secs(10)).unwrap();
                f(pg)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Every collective of the shrunk group gives the sum over its ranks, element by element.
fn check_sums(pg: &ProcessGroup) {
    let n = pg.size();
    for numel in [1usize, 1000, 3 << 20] {
        let mut v: Vec<f32> = (0..numel)
            .map(|i| (i % 7) as f32 + pg.rank() as f32)
            .collect();
        all_reduce(pg, &mut v).unwrap();
        for (i, x) in v.iter().enumerate() {
            let want = (i % 7) as f32 * n as f32 + (0..n).sum::<usize>() as f32;
            assert_eq!(
                *x,
                want,
                "rank {} of {n}: element {i} of {numel}",
                pg.rank()
            );
        }
    }
}

#[test]
fn survivors_go_on_after_a_rank_leaves_mid_collective() {
    for (n, gone) in [(2, 1), (3, 0), (4, 2), (4, 3)] {
        let barrier = Arc::new(Barrier::new(n));
        let out = run_world(n, &format!("mid{n}-{gone}"), move |pg| {
            let mut warm = vec![1f32; 16];
            all_reduce(&pg, &mut warm).unwrap();
            barrier.wait();
            if pg.rank() == gone {
                // Leaves while the others have 12 MiB all_reduce frames in flight.
                std::thread::sleep(Duration::from_millis(20));
                drop(pg);
                return None;
            }
            let mut big = vec![1f32; 3 << 20];
            let failed = all_reduce(&pg, &mut big).unwrap_err();
            let shrunk = pg.shrink(&[gone], false).unwrap();
            assert_eq!(shrunk.size(), n - 1);
            check_sums(&shrunk);
            // The old group refuses work: it was shrunk.
            let mut x = vec![1f32; 4];
            assert!(all_reduce(&pg, &mut x).is_err());
            shrunk.shutdown();
            Some((pg.rank(), shrunk.rank(), failed))
        });
        for (old, new, failed) in out.into_iter().flatten() {
            assert_eq!(new, old - usize::from(old > gone), "world {n}");
            assert!(
                failed.to_string().contains(&format!("rank {gone}")),
                "{failed}"
            );
        }
    }
}

#[test]
fn survivors_that_disagree_about_the_excluded_ranks_fail() {
    let warmed = Arc::new(Barrier::new(4));
    let out = run_world(4, "disagree", move |pg| {
        let mut warm = vec![1f32; 16];
        all_reduce(&pg, &mut warm).unwrap();
        // Each rank has finished it before a survivor drops its link to an excluded one.
        warmed.wait();
        let excluded: &[usize] = match pg.rank() {
            3 => return None, // leaves; the others disagree about rank 1
            2 => &[1, 3],
            _ => &[3],
        };
        Some(pg.shrink(excluded, true).err().map(|e| e.to_string()))
    });
    let errors: Vec<String> = out.into_iter().flatten().flatten().collect();
    assert_eq!(errors.len(), 3, "every survivor fails: {errors:?}");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("every survivor must exclude the same ranks")),
        "{errors:?}"
    );
}

#[test]
fn pending_work_is_refused_or_aborted() {
    let warmed = Arc::new(Barrier::new(3));
    let out = run_world(3, "pending", move |pg| {
        let mut warm = vec![1f32; 16];
        all_reduce(&pg, &mut warm).unwrap();
        warmed.wait();
        if pg.rank() == 2 {
            std::thread::sleep(Duration::from_millis(300));
            return None; // leaves without sending what rank 0 waits for
        }
        let mut buf = vec![0f32; 8];
        let pending = if pg.rank() == 0 {
            Some(
                pg.recv(f32_tensor(&mut buf), Some(2), 5, Some(Box::new(())))
                    .unwrap(),
            )
        } else {
            None
        };
        let refused = match pg.rank() {
            0 => pg.shrink(&[2], false).err(),
            _ => None,
        };
        let shrunk = pg.shrink(&[2], true).unwrap();
        check_sums(&shrunk);
        let aborted = pending.map(|w| w.wait(None).unwrap_err());
        shrunk.shutdown();
        Some((refused, aborted))
    });
    let (refused, aborted) = out[0].as_ref().unwrap();
    let refused = refused
        .as_ref()
        .expect("rank 0's shrink without abort refused");
    assert!(matches!(refused, Error::Runtime(_)), "{refused:?}");
    assert!(refused.to_string().contains("SHRINK_ABORT"), "{refused}");
    assert!(aborted.is_some(), "the pending receive failed");
}
