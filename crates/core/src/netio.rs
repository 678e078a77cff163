//! Blocking socket I/O bounded by a deadline and interruptible (Ctrl-C), shared by the TCP
//! store client and the peer handshake.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::interrupt;

/// A stream whose every read and write fails with `TimedOut` once `deadline` has passed.
/// Reads wait in slices so that an interruption is noticed (`interrupted` then says so).
pub struct DeadlineIo<'a> {
    pub stream: &'a mut TcpStream,
    pub deadline: Instant,
    pub interrupted: bool,
    /// Checked while a read waits: true stops it as an interruption would.
    pub stop: Option<&'a dyn Fn() -> bool>,
}

/// How often a read checks `DeadlineIo::stop`.
const STOP_SLICE: Duration = Duration::from_millis(50);

impl<'a> DeadlineIo<'a> {
    pub fn new(stream: &'a mut TcpStream, deadline: Instant) -> Self {
        DeadlineIo {
            stream,
            deadline,
            interrupted: false,
            stop: None,
        }
    }

    fn remaining(&self) -> io::Result<Duration> {
        let now = Instant::now();
        if now >= self.deadline {
            return Err(io::ErrorKind::TimedOut.into());
        }
        Ok(self.deadline - now)
    }
}

impl Read for DeadlineIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let left = interrupt::slice(self.remaining()?);
            let wait = match self.stop {
                Some(_) => left.min(STOP_SLICE),
                None => left,
            };
            self.stream.set_read_timeout(Some(wait))?;
            match self.stream.read(buf) {
                Err(e) if timed_out(&e) => {
                    if interrupt::check().is_err() || self.stop.is_some_and(|stop| stop()) {
                        // Not ErrorKind::Interrupted: readers retry on that.
                        self.interrupted = true;
                        return Err(io::Error::other("interrupted"));
                    }
                }
                other => return other,
            }
        }
    }
}

impl Write for DeadlineIo<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.remaining()?))?;
        self.stream.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// A read or write that ran out of time (socket timeouts report `WouldBlock` on Linux).
pub fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

/// The listen backlog for a socket many peers may dial at once: the kernel's cap
/// (`net.core.somaxconn`; asking for more is cut to it), so that connections beyond those
/// being served wait in the kernel; std's 128 made thousands of ranks connecting at once
/// retry SYNs for seconds.
pub fn listen_backlog() -> i32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(4096)
}

/// A TCP listener on `addr` with [`listen_backlog`]'s backlog.
pub fn listen_on(addr: std::net::SocketAddr) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    sock.set_reuse_address(true)?;
    sock.bind(&addr.into())?;
    sock.listen(listen_backlog())?;
    Ok(sock.into())
}
