//! Helpers shared by the unit tests of hostile-network handling (store server, peer handshake).

use std::io::Read;
use std::net::TcpStream;

/// This process's resident set size.
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// Warms up with `hit(500)` (thread stacks and allocator arenas reach steady state), then
/// asserts that `hit(n)` grows the resident set by less than 4 MiB; `what` names the
/// connections `hit` makes, for the report.
pub fn assert_memory_flat(n: usize, what: &str, hit: impl Fn(usize)) {
    hit(500);
    let before = rss_bytes();
    hit(n);
    let grown = rss_bytes().saturating_sub(before);
    println!("RSS growth over {n} {what}: {grown} bytes");
    assert!(grown < 4 << 20, "RSS grew by {grown} bytes over {n} {what}");
}

/// True when the other end closed `s` (EOF or reset) without sending anything more.
pub fn closed_by_peer(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 16];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

/// Runs the test `name` alone in a child process (so that other tests' allocations do not blur
/// its memory figures) and returns false there; in the parent, asserts the child passed and
/// returns true (the caller then returns).
pub fn ran_in_child(name: &str) -> bool {
    const CHILD: &str = "RUSTDIST_RSS_CHILD";
    if std::env::var_os(CHILD).is_some() {
        return false;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "the child ran the test: {text}");
    true
}
