//! poll(2) helpers shared by connection setup (the acceptor, the link probes) and the mesh's
//! progress loop, which reaches them as `transport::tcp::{pollfd, poll_fds}`.

use std::time::Duration;

pub fn pollfd(fd: i32, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// poll(2) for at most `timeout` (at least 1 ms); readiness is found by trying the I/O after.
pub fn poll_fds(fds: &mut [libc::pollfd], timeout: Duration) {
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: `fds` is a valid, exclusively borrowed array of pollfd for the call's duration.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
}
