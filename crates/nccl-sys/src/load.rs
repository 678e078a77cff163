//! Finding and opening a shared library, and reading typed symbols from it.

use std::path::{Path, PathBuf};

use libloading::Library;

use crate::Error;

/// What was loaded: the file and the library's version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    /// The path opened (a bare soname when the system's loader found it).
    pub path: PathBuf,
    /// (major, minor, patch).
    pub version: (u32, u32, u32),
}

/// Opens the first of `sonames` found in `search_dirs`, then the file `env_var` names, then
/// `sonames` through the system's loader search. Failures are collected for the error.
pub(crate) fn open(
    library: &'static str,
    sonames: &[&str],
    search_dirs: &[PathBuf],
    env_var: &str,
) -> Result<(Library, PathBuf), Error> {
    let mut tried = Vec::new();
    let in_dirs = search_dirs
        .iter()
        .flat_map(|d| sonames.iter().map(move |s| d.join(s)))
        .filter(|p| p.exists());
    let from_env = std::env::var_os(env_var).map(PathBuf::from);
    let system = sonames.iter().map(PathBuf::from);
    for candidate in in_dirs.chain(from_env).chain(system) {
        match open_one(&candidate) {
            Ok(lib) => return Ok((lib, candidate)),
            // dlerror's message names the file already.
            Err(e) => tried.push(e.to_string()),
        }
    }
    if std::env::var_os(env_var).is_none() {
        tried.push(format!("{env_var} is not set"));
    }
    Err(Error::Load { library, tried })
}

/// Opens `path` with `RTLD_NODELETE`: NCCL starts threads (the bootstrap root of
/// `ncclGetUniqueId`, proxies) that outlive any handle, so its code must never be unmapped.
fn open_one(path: &Path) -> Result<Library, libloading::Error> {
    use libloading::os::unix::Library as UnixLibrary;
    // SAFETY: loading runs the library's initialisers; NCCL's and the CUDA runtime's only set
    // up their own state.
    unsafe {
        UnixLibrary::open(
            Some(path),
            libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_NODELETE,
        )
    }
    .map(Library::from)
}

/// The symbol `name` of `lib` as a value of type `T`.
///
/// # Safety
/// `T` must be the function pointer type of the C declaration of `name`.
pub(crate) unsafe fn symbol<T: Copy>(
    lib: &Library,
    path: &Path,
    name: &'static str,
) -> Result<T, Error> {
    // SAFETY: the caller guarantees that `T` matches the symbol's C type.
    match unsafe { lib.get::<T>(name.as_bytes()) } {
        Ok(sym) => Ok(*sym),
        Err(e) => Err(Error::Symbol {
            path: path.display().to_string(),
            symbol: name,
            reason: e.to_string(),
        }),
    }
}

/// Like [`symbol`], `None` when the library lacks it (functions newer than the oldest
/// supported version).
///
/// # Safety
/// As for [`symbol`].
pub(crate) unsafe fn optional<T: Copy>(lib: &Library, name: &'static str) -> Option<T> {
    // SAFETY: forwarded to the caller.
    unsafe { lib.get::<T>(name.as_bytes()) }.ok().map(|s| *s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_names_every_candidate() {
        let dir = std::env::temp_dir();
        let err = open(
            "libnothing",
            &["libnothing-rustdist.so.7"],
            &[dir],
            "RUSTDIST_TEST_NOTHING_LIBRARY",
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("cannot load libnothing: libnothing-rustdist.so.7: "),
            "{msg}"
        );
        assert!(
            msg.contains("RUSTDIST_TEST_NOTHING_LIBRARY is not set"),
            "{msg}"
        );
    }
}
