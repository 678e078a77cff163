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

/// Copies `dst.len()` bytes at address `addr` of process `pid` into `dst`.
pub fn read(pid: i32, addr: usize, dst: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < dst.len() {
        let local = libc::iovec {
            iov_base: dst[done..].as_mut_ptr().cast(),
            iov_len: dst.len() - done,
        };
        let remote = libc::iovec {
            iov_base: (addr + done) as *mut libc::c_void,
            iov_len: dst.len() - done,
        };
        // SAFETY: `local` describes writable memory this call owns (the rest of `dst`); the
        // kernel checks `remote` against the other process's mappings (EFAULT if invalid).
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        match n {
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
    fn a_bad_address_or_process_fails() {
        assert!(!probe(pid(), 8), "an unmapped address");
        assert!(!probe(i32::MAX, probe_address()), "no such process");
        let mut dst = [0u8; 8];
        assert!(read(pid(), 8, &mut dst).is_err());
    }
}
