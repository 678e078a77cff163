//! Loads the real libnccl and libcudart when they are at hand: the files named by
//! `RUSTDIST_NCCL_LIBRARY` / `RUSTDIST_CUDART_LIBRARY`, or torch's wheels in the workspace's
//! `.venv`. Skips (passing) when neither is there. Needs no GPU.

use std::path::PathBuf;

use rustdist_nccl_sys::{Cudart, Nccl};

/// `nvidia/<sub>` folders of the workspace venv's site-packages that exist.
fn wheel_dirs(subs: &[&str]) -> Vec<PathBuf> {
    let venv_lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/lib");
    let Ok(entries) = std::fs::read_dir(venv_lib) else {
        return Vec::new();
    };
    entries
        .flatten()
        .flat_map(|e| {
            let nvidia = e.path().join("site-packages/nvidia");
            subs.iter().map(move |s| nvidia.join(s)).collect::<Vec<_>>()
        })
        .filter(|d| d.is_dir())
        .collect()
}

#[test]
fn loads_nccl_and_reads_version_and_unique_ids() {
    let dirs = wheel_dirs(&["nccl/lib"]);
    if dirs.is_empty() && std::env::var_os("RUSTDIST_NCCL_LIBRARY").is_none() {
        eprintln!("skipped: no libnccl (set RUSTDIST_NCCL_LIBRARY or create .venv)");
        return;
    }
    let nccl = Nccl::load(&dirs).expect("libnccl loads");
    let (major, minor, _) = nccl.version().expect("ncclGetVersion");
    assert_eq!(nccl.loaded().version, nccl.version().unwrap());
    assert!(major == 2 && minor >= 11, "NCCL {major}.{minor}");
    // ncclGetUniqueId only opens a bootstrap socket: it works without a GPU.
    let a = nccl.unique_id().expect("ncclGetUniqueId");
    let b = nccl.unique_id().expect("ncclGetUniqueId");
    assert_ne!(a.to_bytes(), b.to_bytes());
    // Error strings name the call and NCCL's message.
    let err = nccl
        .check(rustdist_nccl_sys::NcclResult::INVALID_ARGUMENT, "ncclTest")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("ncclTest failed: invalid argument"),
        "{err}"
    );
}

#[test]
fn loads_cudart_and_reports_devices_or_why_not() {
    let dirs = wheel_dirs(&["cu13/lib", "cuda_runtime/lib", "cu12/lib"]);
    if dirs.is_empty() && std::env::var_os("RUSTDIST_CUDART_LIBRARY").is_none() {
        eprintln!("skipped: no libcudart (set RUSTDIST_CUDART_LIBRARY or create .venv)");
        return;
    }
    let rt = Cudart::load(&dirs).expect("libcudart loads");
    assert!(rt.loaded().version.0 >= 11);
    match rt.device_count() {
        Ok(n) => eprintln!("{n} CUDA devices"),
        Err(e) => assert!(
            e.to_string().starts_with("cudaGetDeviceCount failed: "),
            "{e}"
        ),
    }
}
