//! Links: the byte pipes the mesh reads frames from and writes frames to. A peer on this host
//! is reached through a shared-memory pipe (`shm.rs`), any other through its TCP socket, or
//! through several sockets striped into one pipe where one stream cannot fill the link; the
//! socket of a shared-memory peer stays open only to tell whether the peer lives.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};

use crate::error::{Error, Result};
use crate::transport::shm::ShmPipe;
use crate::transport::tcp::pollfd;

/// A non-blocking byte pipe to one peer.
pub(super) trait Link: Send {
    /// Reads what is there; `WouldBlock` when nothing is.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Writes what fits; `WouldBlock` when nothing does.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
    /// Whether the pipe is memory (waiting is then on the doorbell, not poll(2)).
    fn in_memory(&self) -> bool;
    /// Memory pipes: whether unread bytes wait, and whether a write would fit (a socket
    /// answers both through poll(2)).
    fn has_data(&self) -> bool;
    fn has_space(&self) -> bool;
    /// Sockets: the ones poll(2) waits on for the next read and the next write.
    fn poll_fds(&self) -> Option<(RawFd, RawFd)>;
    /// Sockets: ends every stream both ways, so the peer reads EOF wherever it reads.
    fn shutdown(&self);
}

impl Link for TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Read::read(self, buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        Write::write_vectored(self, bufs)
    }

    fn in_memory(&self) -> bool {
        false
    }

    fn has_data(&self) -> bool {
        false
    }

    fn has_space(&self) -> bool {
        false
    }

    fn poll_fds(&self) -> Option<(RawFd, RawFd)> {
        Some((self.as_raw_fd(), self.as_raw_fd()))
    }

    fn shutdown(&self) {
        let _ = TcpStream::shutdown(self, Shutdown::Both);
    }
}

/// Bytes of a stripe: the pipe's bytes go round the streams this many at a time. Large enough
/// that a frame costs few system calls, small next to one stream's window, so that every
/// stream of a large frame is busy at once.
const STRIPE_BYTES: usize = 256 << 10;

/// Several TCP streams to one peer as one byte pipe: byte `i` travels on stream
/// `(i / STRIPE_BYTES) % n`. Each stream delivers in order, and both ends count the bytes, so
/// the reader takes each stripe from the stream it was written to.
pub(super) struct Striped {
    streams: Vec<TcpStream>,
    read: usize,
    written: usize,
}

impl Striped {
    pub(super) fn new(streams: Vec<TcpStream>) -> Striped {
        Striped {
            streams,
            read: 0,
            written: 0,
        }
    }

    /// The stream that carries byte `at` of the pipe, and the bytes left in its stripe.
    fn stripe(&self, at: usize) -> (usize, usize) {
        (
            (at / STRIPE_BYTES) % self.streams.len(),
            STRIPE_BYTES - at % STRIPE_BYTES,
        )
    }
}

/// Up to `len` bytes of `bufs` from byte `skip` on, as at most four slices (frames are a
/// header and a payload).
fn window<'a>(bufs: &'a [IoSlice<'_>], mut skip: usize, mut len: usize) -> Vec<IoSlice<'a>> {
    let mut out = Vec::with_capacity(bufs.len().min(4));
    for b in bufs {
        if len == 0 || out.len() == 4 {
            break;
        }
        if skip >= b.len() {
            skip -= b.len();
            continue;
        }
        let take = (b.len() - skip).min(len);
        out.push(IoSlice::new(&b[skip..skip + take]));
        len -= take;
        skip = 0;
    }
    out
}

impl Link for Striped {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            let (i, left) = self.stripe(self.read);
            let want = left.min(buf.len() - got);
            match Read::read(&mut self.streams[i], &mut buf[got..got + want]) {
                Ok(n) => {
                    got += n;
                    self.read += n;
                    if n < want {
                        break;
                    }
                }
                // What was read is reported first; the error comes back on the next call.
                Err(_) if got > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(got)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut sent = 0;
        while sent < total {
            let (i, left) = self.stripe(self.written);
            let want = left.min(total - sent);
            match Write::write_vectored(&mut self.streams[i], &window(bufs, sent, want)) {
                Ok(n) => {
                    sent += n;
                    self.written += n;
                    if n < want {
                        break;
                    }
                }
                Err(_) if sent > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(sent)
    }

    fn in_memory(&self) -> bool {
        false
    }

    fn has_data(&self) -> bool {
        false
    }

    fn has_space(&self) -> bool {
        false
    }

    fn poll_fds(&self) -> Option<(RawFd, RawFd)> {
        let fd = |at| self.streams[self.stripe(at).0].as_raw_fd();
        Some((fd(self.read), fd(self.written)))
    }

    fn shutdown(&self) {
        for s in &self.streams {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Link for ShmPipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        ShmPipe::read(self, buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        ShmPipe::write_vectored(self, bufs)
    }

    fn in_memory(&self) -> bool {
        true
    }

    fn has_data(&self) -> bool {
        ShmPipe::has_data(self)
    }

    fn has_space(&self) -> bool {
        ShmPipe::has_space(self)
    }

    fn poll_fds(&self) -> Option<(RawFd, RawFd)> {
        None
    }

    fn shutdown(&self) {}
}

/// The connection to one peer: the link its data moves on, and its socket.
pub(super) struct Connection {
    pub(super) sock: TcpStream,
    data: Box<dyn Link>,
}

impl Connection {
    /// Data on `pipe` when given (the peer shares the host), else on the socket itself, striped
    /// with the `extra` streams when there are any.
    pub(super) fn new(
        sock: TcpStream,
        pipe: Option<ShmPipe>,
        extra: Vec<TcpStream>,
    ) -> Result<Connection> {
        let data: Box<dyn Link> = match pipe {
            Some(pipe) => Box::new(pipe),
            None => {
                let first = sock
                    .try_clone()
                    .map_err(|e| Error::network(format!("cannot share a peer socket: {e}")))?;
                if extra.is_empty() {
                    Box::new(first)
                } else {
                    Box::new(Striped::new(std::iter::once(first).chain(extra).collect()))
                }
            }
        };
        Ok(Connection { sock, data })
    }

    /// What poll(2) waits on for this link (none for a memory link): readable, and writable
    /// when `writing`.
    pub(super) fn pollfds(&self, writing: bool) -> Vec<libc::pollfd> {
        match self.data.poll_fds() {
            None => Vec::new(),
            Some((r, _)) if !writing => vec![pollfd(r, libc::POLLIN)],
            Some((r, w)) if r == w => vec![pollfd(r, libc::POLLIN | libc::POLLOUT)],
            Some((r, w)) => vec![pollfd(r, libc::POLLIN), pollfd(w, libc::POLLOUT)],
        }
    }

    /// Ends the connection both ways (every stream of it).
    pub(super) fn shutdown(&self) {
        let _ = self.sock.shutdown(Shutdown::Both);
        self.data.shutdown();
    }

    pub(super) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.data.read(buf)
    }

    pub(super) fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.data.write_vectored(bufs)
    }

    pub(super) fn in_memory(&self) -> bool {
        self.data.in_memory()
    }

    pub(super) fn has_data(&self) -> bool {
        self.data.has_data()
    }

    pub(super) fn has_space(&self) -> bool {
        self.data.has_space()
    }

    /// For a memory link: false once the peer's socket reports EOF or an error.
    pub(super) fn alive(&mut self) -> bool {
        let mut probe = [0u8; 1];
        match Read::read(&mut self.sock, &mut probe) {
            Ok(0) => false,
            Ok(_) => true,
            Err(e) => matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    /// `n` connected pairs of non-blocking loopback sockets, as (writer ends, reader ends).
    fn streams(n: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        (0..n)
            .map(|_| {
                let a = TcpStream::connect(addr).unwrap();
                let (b, _) = listener.accept().unwrap();
                a.set_nonblocking(true).unwrap();
                b.set_nonblocking(true).unwrap();
                (a, b)
            })
            .unzip()
    }

    #[test]
    fn window_takes_a_span_across_slices() {
        let (a, b) = ([1u8, 2, 3], [4u8, 5, 6, 7]);
        let bufs = [IoSlice::new(&a), IoSlice::new(&b)];
        let flat = |w: Vec<IoSlice<'_>>| w.iter().flat_map(|s| s.to_vec()).collect::<Vec<_>>();
        assert_eq!(flat(window(&bufs, 0, 100)), [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(flat(window(&bufs, 2, 3)), [3, 4, 5]);
        assert_eq!(flat(window(&bufs, 3, 2)), [4, 5]);
        assert_eq!(flat(window(&bufs, 7, 5)), Vec::<u8>::new());
    }

    #[test]
    fn striped_streams_carry_one_byte_pipe_in_order() {
        let (tx, rx) = streams(3);
        let (mut w, mut r) = (Striped::new(tx), Striped::new(rx));
        // Frames of a header and a payload, some smaller than a stripe, some spanning several.
        let frames: Vec<(Vec<u8>, Vec<u8>)> = [10usize, 3 * STRIPE_BYTES + 17, 1, STRIPE_BYTES]
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let head = vec![i as u8; 40];
                let body = (0..n).map(|j| (j * 7 + i) as u8).collect();
                (head, body)
            })
            .collect();
        let want: Vec<u8> = frames
            .iter()
            .flat_map(|(h, b)| [h.clone(), b.clone()].concat())
            .collect();
        let mut got = vec![0u8; want.len()];
        let (mut frame, mut off, mut read) = (0, 0, 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while read < want.len() {
            assert!(
                std::time::Instant::now() < deadline,
                "stuck at {read} bytes"
            );
            if let Some((h, b)) = frames.get(frame) {
                let bufs = [IoSlice::new(h), IoSlice::new(b)];
                match w.write_vectored(&window(&bufs, off, usize::MAX)) {
                    Ok(n) => off += n,
                    Err(e) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
                }
                if off == h.len() + b.len() {
                    (frame, off) = (frame + 1, 0);
                }
            }
            // Small reads too: a read never crosses into a stripe that is not there yet.
            let cap = if read % 2 == 0 { 333 } else { got.len() - read };
            match r.read(&mut got[read..(read + cap).min(want.len())]) {
                Ok(n) => {
                    assert!(n > 0, "EOF before the end");
                    read += n;
                }
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
            }
        }
        assert!(got == want, "bytes differ");
        // Every stream carried its stripes, and every stream ends on shutdown.
        assert_eq!(w.written, want.len());
        assert!(want.len() > 3 * STRIPE_BYTES);
        Link::shutdown(&w);
        let mut one = [0u8; 1];
        let eof = loop {
            match r.read(&mut one) {
                Ok(n) => break n,
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
            }
            assert!(std::time::Instant::now() < deadline, "no EOF");
        };
        assert_eq!(eof, 0);
    }
}
