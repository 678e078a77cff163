//! Single-copy transfers between the processes of one host: Linux cross-memory attach
//! (`process_vm_readv`) copies straight from a peer's buffer into this process's, where the
//! workspace's slots cost two copies (into the slot, out of it) and the second reads lines the
//! writer's core has just written. Allowed where this process may ptrace the peer (same user
//! without Yama's restriction, or CAP_SYS_PTRACE); [`probe`] finds out at connect time.

/// The word every process exposes at [`probe_address`] for peers to read back.
const MAGIC: u64 = 0x7275_7374_6469_7374; // "rustdist"

static PROBE: u64 = MAGIC;

/// This process's id, as peers name it to read from it.
pub fn pid() -> i32 {
    // SAFETY: getpid has no preconditions and cannot fail.
    unsafe { libc::getpid() }
}

/// Where in this process the probe word lies.
pub fn probe_address() -> usize {
    &PROBE as *const u64 as usize
}

/// Whether this process can read the memory of process `pid`, whose probe word is at `addr`.
pub fn probe(pid: i32, addr: usize) -> bool {
    let mut word = [0u8; 8];
    read(pid, addr, &mut word).is_ok() && u64::from_ne_bytes(word) == MAGIC
}

/// Whether process `pid` exists and has memory (not a zombie, not exiting): whether it can
/// still read or write another's.
pub fn has_memory(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may hold any byte.
    let state = stat
        .rfind(')')
        .and_then(|at| stat[at + 1..].trim_start().chars().next());
    !matches!(state, None | Some('Z' | 'X' | 'x'))
}

/// Copies `dst.len()` bytes at address `addr` of process `pid` into `dst`.
pub fn read(pid: i32, addr: usize, dst: &mut [u8]) -> std::io::Result<()> {
    let base = dst.as_mut_ptr();
    // SAFETY: `done..len` of `dst` is writable memory this call owns; the kernel checks the
    // remote range against the other process's mappings (EFAULT if invalid).
    transfer(dst.len(), |done, left| unsafe {
        let local = iovec(base.add(done), left);
        let remote = iovec((addr + done) as *mut u8, left);
        libc::process_vm_readv(pid, &local, 1, &remote, 1, 0)
    })
}

/// Copies `src` to address `addr` of process `pid`.
pub fn write(pid: i32, addr: usize, src: &[u8]) -> std::io::Result<()> {
    let base = src.as_ptr() as *mut u8;
    // SAFETY: `done..len` of `src` is readable memory (the kernel only reads the local side
    // of a write); the kernel checks the remote range against the other process's mappings.
    transfer(src.len(), |done, left| unsafe {
        let local = iovec(base.add(done), left);
        let remote = iovec((addr + done) as *mut u8, left);
        libc::process_vm_writev(pid, &local, 1, &remote, 1, 0)
    })
}

fn iovec(base: *mut u8, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: base.cast(),
        iov_len: len,
    }
}

/// Runs `step(done, left)` (one process_vm_readv/writev of the `left` bytes after the first
/// `done`) until `len` bytes have moved, retrying on EINTR.
fn transfer(len: usize, mut step: impl FnMut(usize, usize) -> isize) -> std::io::Result<()> {
    let mut done = 0;
    while done < len {
        match step(done, len - done) {
            n if n > 0 => done += n as usize,
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_reads_its_own_probe_and_buffers() {
        assert!(probe(pid(), probe_address()));
        let src: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        read(pid(), src.as_ptr() as usize, &mut dst).unwrap();
        assert_eq!(dst, src);
    }

    #[test]
    fn a_process_writes_its_own_buffers() {
        let src: Vec<u8> = (0..100_000u32).map(|i| (i % 247) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        write(pid(), dst.as_mut_ptr() as usize, &src).unwrap();
        assert_eq!(dst, src);
        assert!(write(pid(), 8, &src[..8]).is_err(), "an unmapped address");
    }

    #[test]
    fn a_bad_address_or_process_fails() {
        assert!(!probe(pid(), 8), "an unmapped address");
        assert!(!probe(i32::MAX, probe_address()), "no such process");
        let mut dst = [0u8; 8];
        assert!(read(pid(), 8, &mut dst).is_err());
    }
}
