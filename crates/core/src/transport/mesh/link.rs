//! Links: the byte pipes the mesh reads frames from and writes frames to. A peer on this host
//! is reached through a shared-memory pipe (`shm.rs`), any other through its TCP socket, or
//! through several sockets striped into one pipe where one stream cannot fill the link; the
//! socket of a shared-memory peer stays open only to tell whether the peer lives.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};

use crate::tls::TlsStream;
use crate::transport::frame::{payload_len, HEADER_LEN};
use crate::transport::shm::ShmPipe;
use crate::transport::tcp::pollfd;

/// A non-blocking byte pipe to one peer.
pub(super) trait Link: Send {
    /// Reads what is there; `WouldBlock` when nothing is.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Writes what fits; `WouldBlock` when nothing does.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
    /// Sends what written bytes still wait in the link (TLS records); true once none do. A
    /// frame is sent only then, so that the peer gets it without this rank calling again.
    fn flush(&mut self) -> io::Result<bool> {
        Ok(true)
    }
    /// Whether the pipe is memory (waiting is then on the doorbell, not poll(2)).
    fn in_memory(&self) -> bool {
        false
    }
    /// Memory pipes: whether unread bytes wait, and whether a write would fit (a socket
    /// answers both through poll(2)).
    fn has_data(&self) -> bool {
        false
    }
    fn has_space(&self) -> bool {
        false
    }
    /// Sockets: whether the next read has bytes without the socket (decrypted already), which
    /// poll(2) cannot see.
    fn buffered(&self) -> bool {
        false
    }
    /// Moves TLS handshakes on; true once every stream's is over.
    fn handshake(&mut self) -> io::Result<bool> {
        Ok(true)
    }
    /// Sockets: the ones poll(2) waits on for the next read and the next write.
    fn poll_fds(&self) -> Option<(RawFd, RawFd)>;
    /// Sockets whose TLS handshake goes on or whose ciphertext waits, with what each waits
    /// for (these are polled instead of [`Link::poll_fds`]).
    fn tls_pollfds(&self) -> Vec<libc::pollfd> {
        Vec::new()
    }
    /// Sockets: ends every stream both ways, so the peer reads EOF wherever it reads.
    fn shutdown(&self);
}

/// One TCP stream of a link: the socket itself, or TLS over it (`tls::TlsStream`).
pub(super) trait Stream: Send {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
    fn fd(&self) -> RawFd;
    fn shutdown(&self);
    /// TLS: see the [`Link`] methods of the same names.
    fn flush(&mut self) -> io::Result<bool> {
        Ok(true)
    }
    fn buffered(&self) -> bool {
        false
    }
    fn handshake(&mut self) -> io::Result<bool> {
        Ok(true)
    }
    /// TLS: what poll(2) waits for while the handshake goes on or ciphertext waits.
    fn tls_events(&self) -> Option<libc::c_short> {
        None
    }
}

/// Reads smaller than this are served from one read-ahead of this many bytes: a frame's
/// header, a small payload and the next header then cost one recv(2) instead of three (an
/// acknowledged small put over TCP is a few microseconds). Larger reads go straight into the
/// caller's memory. Allocated on a link's first small read.
const READ_AHEAD: usize = 8 << 10;

/// A TCP stream without TLS, its reads served through a read-ahead buffer.
pub(super) struct PlainStream {
    sock: TcpStream,
    ahead: Vec<u8>,
    at: usize,
    end: usize,
}

impl PlainStream {
    pub(super) fn boxed(sock: TcpStream) -> Box<dyn Stream> {
        Box::new(PlainStream {
            sock,
            ahead: Vec::new(),
            at: 0,
            end: 0,
        })
    }
}

impl Stream for PlainStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at == self.end {
            // An empty read must not take bytes into the buffer and answer 0 (end of stream).
            if buf.is_empty() || buf.len() >= READ_AHEAD {
                return self.sock.read(buf);
            }
            if self.ahead.is_empty() {
                self.ahead = vec![0; READ_AHEAD];
            }
            self.end = self.sock.read(&mut self.ahead)?;
            self.at = 0;
        }
        let n = buf.len().min(self.end - self.at);
        buf[..n].copy_from_slice(&self.ahead[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.sock.write_vectored(bufs)
    }

    fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn shutdown(&self) {
        let _ = self.sock.shutdown(Shutdown::Both);
    }

    fn buffered(&self) -> bool {
        self.at < self.end
    }
}

impl Stream for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        TlsStream::read(self, buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        TlsStream::write_vectored(self, bufs)
    }

    fn fd(&self) -> RawFd {
        self.socket().as_raw_fd()
    }

    fn shutdown(&self) {
        let _ = self.socket().shutdown(Shutdown::Both);
    }

    fn flush(&mut self) -> io::Result<bool> {
        self.flush_out()
    }

    fn buffered(&self) -> bool {
        TlsStream::buffered(self)
    }

    fn handshake(&mut self) -> io::Result<bool> {
        TlsStream::handshake(self)
    }

    fn tls_events(&self) -> Option<libc::c_short> {
        let write = if self.wants_write() { libc::POLLOUT } else { 0 };
        (self.handshaking() || write != 0).then_some(libc::POLLIN | write)
    }
}

fn tls_pollfds(streams: &[Box<dyn Stream>]) -> Vec<libc::pollfd> {
    streams
        .iter()
        .filter_map(|s| s.tls_events().map(|ev| pollfd(s.fd(), ev)))
        .collect()
}

/// A link of one stream.
struct Single(Box<dyn Stream>);

impl Link for Single {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.0.write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<bool> {
        self.0.flush()
    }

    fn buffered(&self) -> bool {
        self.0.buffered()
    }

    fn handshake(&mut self) -> io::Result<bool> {
        self.0.handshake()
    }

    fn poll_fds(&self) -> Option<(RawFd, RawFd)> {
        Some((self.0.fd(), self.0.fd()))
    }

    fn tls_pollfds(&self) -> Vec<libc::pollfd> {
        tls_pollfds(std::slice::from_ref(&self.0))
    }

    fn shutdown(&self) {
        self.0.shutdown();
    }
}

/// Bytes of a stripe: a large payload goes round the streams this many at a time. Large
/// enough that a frame costs few system calls, small next to one stream's window, so that every
/// stream of a large frame is busy at once.
const STRIPE_BYTES: usize = 256 << 10;
/// Payloads below this travel whole on the first stream with their header: a stream left idle
/// for longer than its retransmission timeout restarts from a small congestion window, so
/// small frames spread over every stream took more round trips than on one warm stream (1
/// Gbit/s 20 ms away, world 4: a 256 KiB all_reduce in 89 ms striped, 77 ms on one stream, 70
/// ms like this), while the chain broadcast's 512 KiB segments still gain from striping.
const STRIPED_MIN_BYTES: usize = 2 * STRIPE_BYTES;

/// Where one end of a striped pipe is in the frames it carries. Both ends see the same bytes
/// in the same order, so both place every byte on the same stream.
struct FrameCursor {
    header: [u8; HEADER_LEN],
    /// Bytes of the current frame passed so far, its header first.
    at: usize,
    /// The current frame's payload length, once its header has passed.
    len: usize,
}

impl Default for FrameCursor {
    fn default() -> FrameCursor {
        FrameCursor {
            header: [0; HEADER_LEN],
            at: 0,
            len: 0,
        }
    }
}

impl FrameCursor {
    /// The stream that carries the next byte, and how many bytes in a row go there: headers
    /// and small payloads on stream 0, a large payload in stripes over all `streams`.
    fn next(&self, streams: usize) -> (usize, usize) {
        let Some(off) = self.at.checked_sub(HEADER_LEN) else {
            return (0, HEADER_LEN - self.at);
        };
        let left = self.len - off;
        if self.len < STRIPED_MIN_BYTES {
            return (0, left);
        }
        let stripe = off / STRIPE_BYTES;
        (
            stripe % streams,
            (STRIPE_BYTES - off % STRIPE_BYTES).min(left),
        )
    }

    /// Passes `n` bytes, no more than [`FrameCursor::next`] said; `bytes` are at least those
    /// when they belong to a header.
    fn advance(&mut self, bytes: &[IoSlice<'_>], n: usize) {
        if self.at < HEADER_LEN {
            for b in window(bytes, 0, n) {
                self.header[self.at..self.at + b.len()].copy_from_slice(&b);
                self.at += b.len();
            }
            if self.at == HEADER_LEN {
                // A length past memory is no frame anyone can send; the rest of the pipe then
                // stays on stream 0 like any small payload would.
                self.len = usize::try_from(payload_len(&self.header)).unwrap_or(usize::MAX);
            }
        } else {
            self.at += n;
        }
        if self.at >= HEADER_LEN && self.at - HEADER_LEN == self.len {
            *self = FrameCursor::default();
        }
    }
}

/// Several TCP streams to one peer as one byte pipe: frame headers and small payloads on the
/// first stream, large payloads striped over all of them (see [`FrameCursor`]). Each stream
/// delivers in order, and both ends follow the frames, so the reader takes every byte from
/// the stream it was written to.
pub(super) struct Striped {
    streams: Vec<Box<dyn Stream>>,
    read: FrameCursor,
    written: FrameCursor,
}

impl Striped {
    pub(super) fn new(streams: Vec<Box<dyn Stream>>) -> Striped {
        Striped {
            streams,
            read: FrameCursor::default(),
            written: FrameCursor::default(),
        }
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
            let (i, left) = self.read.next(self.streams.len());
            let want = left.min(buf.len() - got);
            match self.streams[i].read(&mut buf[got..got + want]) {
                Ok(n) => {
                    self.read.advance(&[IoSlice::new(&buf[got..got + n])], n);
                    got += n;
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
            let (i, left) = self.written.next(self.streams.len());
            let want = left.min(total - sent);
            let span = window(bufs, sent, want);
            match self.streams[i].write_vectored(&span) {
                Ok(n) => {
                    self.written.advance(&span, n);
                    sent += n;
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

    fn flush(&mut self) -> io::Result<bool> {
        let mut done = true;
        for s in &mut self.streams {
            done &= s.flush()?;
        }
        Ok(done)
    }

    fn buffered(&self) -> bool {
        self.streams[self.read.next(self.streams.len()).0].buffered()
    }

    fn handshake(&mut self) -> io::Result<bool> {
        let mut done = true;
        for s in &mut self.streams {
            done &= s.handshake()?;
        }
        Ok(done)
    }

    fn poll_fds(&self) -> Option<(RawFd, RawFd)> {
        let fd = |at: &FrameCursor| self.streams[at.next(self.streams.len()).0].fd();
        Some((fd(&self.read), fd(&self.written)))
    }

    fn tls_pollfds(&self) -> Vec<libc::pollfd> {
        tls_pollfds(&self.streams)
    }

    fn shutdown(&self) {
        for s in &self.streams {
            s.shutdown();
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

/// A peer not linked yet (links are made on first use): nothing to read, no room to write.
struct Unlinked;

impl Link for Unlinked {
    fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
        Err(io::ErrorKind::WouldBlock.into())
    }

    fn write_vectored(&mut self, _: &[IoSlice<'_>]) -> io::Result<usize> {
        Err(io::ErrorKind::WouldBlock.into())
    }

    fn poll_fds(&self) -> Option<(RawFd, RawFd)> {
        None
    }

    fn shutdown(&self) {}
}

/// The connection to one peer: the link its data moves on (the socket itself for TCP).
pub(super) struct Connection {
    /// A memory link's socket, kept open only to tell whether the peer lives.
    watch: Option<TcpStream>,
    data: Box<dyn Link>,
    linked: bool,
}

impl Connection {
    /// A peer to link on first use.
    pub(super) fn unlinked() -> Connection {
        Connection {
            watch: None,
            data: Box::new(Unlinked),
            linked: false,
        }
    }

    /// Whether the peer is linked (see [`Connection::unlinked`]).
    pub(super) fn linked(&self) -> bool {
        self.linked
    }

    /// Data on `pipe` (the peer shares the host), `sock` kept to tell whether it lives.
    pub(super) fn memory(sock: TcpStream, pipe: ShmPipe) -> Connection {
        Connection {
            watch: Some(sock),
            data: Box::new(pipe),
            linked: true,
        }
    }

    /// Data on the streams, striped when there are several. One fd per stream: a world of
    /// n ranks holds n - 1 sockets per rank, not twice that.
    pub(super) fn streams(mut streams: Vec<Box<dyn Stream>>) -> Connection {
        let data: Box<dyn Link> = match streams.len() {
            1 => Box::new(Single(streams.remove(0))),
            _ => Box::new(Striped::new(streams)),
        };
        Connection {
            watch: None,
            data,
            linked: true,
        }
    }

    /// What poll(2) waits on for this link (none for a memory link): readable when `reading`,
    /// writable when `writing` (errors and hang-ups are reported either way).
    pub(super) fn pollfds(&self, reading: bool, writing: bool) -> Vec<libc::pollfd> {
        let Some((r, w)) = self.data.poll_fds() else {
            return Vec::new();
        };
        let read = if reading { libc::POLLIN } else { 0 };
        let write = if writing { libc::POLLOUT } else { 0 };
        let mut fds = if r == w {
            vec![pollfd(r, read | write)]
        } else {
            vec![pollfd(r, read), pollfd(w, write)]
        };
        // A TLS handshake or ciphertext waiting moves on whatever the frames need.
        fds.extend(self.data.tls_pollfds());
        fds
    }

    /// What poll(2) waits on while a TLS handshake goes on.
    pub(super) fn handshake_pollfds(&self) -> Vec<libc::pollfd> {
        self.data.tls_pollfds()
    }

    /// Ends the connection both ways (every stream of it).
    pub(super) fn shutdown(&self) {
        if let Some(sock) = &self.watch {
            let _ = sock.shutdown(Shutdown::Both);
        }
        self.data.shutdown();
    }

    pub(super) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.data.read(buf)
    }

    pub(super) fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.data.write_vectored(bufs)
    }

    pub(super) fn flush(&mut self) -> io::Result<bool> {
        self.data.flush()
    }

    pub(super) fn buffered(&self) -> bool {
        self.data.buffered()
    }

    pub(super) fn handshake(&mut self) -> io::Result<bool> {
        self.data.handshake()
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
        let Some(sock) = self.watch.as_mut() else {
            return true; // a socket link reports EOF where it is read
        };
        let mut probe = [0u8; 1];
        match Read::read(sock, &mut probe) {
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

    /// The bytes of a frame: a real header claiming `len` payload bytes, then the payload.
    fn frame(i: usize, len: usize) -> (Vec<u8>, Vec<u8>) {
        let head = crate::transport::frame::Header {
            kind: crate::transport::frame::FrameKind::Tagged,
            coll: 0,
            dtype: 0,
            op: 0,
            group: 1,
            step: 0,
            seq: i as u64,
            count: len as u64,
            len: len as u64,
        }
        .encode();
        (head.to_vec(), (0..len).map(|j| (j * 7 + i) as u8).collect())
    }

    #[test]
    fn headers_and_small_payloads_stay_on_the_first_stream() {
        let mut c = FrameCursor::default();
        let pass = |c: &mut FrameCursor, bytes: &[u8]| {
            let mut off = 0;
            let mut places = Vec::new();
            while off < bytes.len() {
                let (stream, run) = c.next(3);
                let n = run.min(bytes.len() - off);
                c.advance(&[IoSlice::new(&bytes[off..off + n])], n);
                places.push((stream, n));
                off += n;
            }
            places
        };
        let (h, b) = frame(0, STRIPED_MIN_BYTES - 1);
        assert_eq!(pass(&mut c, &h), [(0, HEADER_LEN)]);
        assert_eq!(pass(&mut c, &b), [(0, STRIPED_MIN_BYTES - 1)]);
        let (h, b) = frame(1, 0);
        assert_eq!(
            pass(&mut c, &h),
            [(0, HEADER_LEN)],
            "an empty payload ends the frame"
        );
        let (h, b2) = frame(2, 4 * STRIPE_BYTES + 5);
        assert!(b.is_empty());
        // A header that arrives a few bytes at a time still counts.
        assert_eq!(pass(&mut c, &h[..7]), [(0, 7)]);
        assert_eq!(pass(&mut c, &h[7..]), [(0, HEADER_LEN - 7)]);
        let s = STRIPE_BYTES;
        assert_eq!(pass(&mut c, &b2), [(0, s), (1, s), (2, s), (0, s), (1, 5)]);
        let (h, _) = frame(3, 1);
        assert_eq!(
            pass(&mut c, &h),
            [(0, HEADER_LEN)],
            "the next frame starts on stream 0"
        );
    }

    /// Reads `want` bytes from `r`, waiting for them (the socket is non-blocking).
    fn read_all(r: &mut dyn Stream, want: usize, chunk: usize) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = vec![0; chunk];
        while got.len() < want {
            match r.read(&mut buf[..chunk.min(want - got.len())]) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("read failed: {e}"),
            }
        }
        got
    }

    #[test]
    fn a_plain_stream_reads_ahead_for_small_reads_only() {
        let (mut tx, rx) = streams(1);
        let mut r = PlainStream::boxed(rx.into_iter().next().unwrap());
        let data: Vec<u8> = (0..3 * READ_AHEAD).map(|i| (i % 251) as u8).collect();
        tx[0].write_all(&data[..100]).unwrap();
        let head = read_all(&mut *r, 10, 10);
        assert_eq!(head, data[..10]);
        // The rest of what arrived came with the first read.
        assert!(r.buffered());
        assert_eq!(r.read(&mut []).unwrap(), 0, "an empty read takes nothing");
        assert_eq!(
            r.read(&mut [0; 1000]).unwrap(),
            90,
            "served from the read-ahead"
        );
        assert!(!r.buffered());
        tx[0].write_all(&data[100..]).unwrap();
        let rest = read_all(&mut *r, data.len() - 100, 2 * READ_AHEAD);
        assert_eq!(rest, data[100..]);
        assert!(
            !r.buffered(),
            "large reads go straight into the caller's memory"
        );
    }

    #[test]
    fn striped_streams_carry_one_byte_pipe_in_order() {
        let (tx, rx) = streams(3);
        let boxed = |v: Vec<TcpStream>| v.into_iter().map(PlainStream::boxed);
        let (mut w, mut r) = (
            Striped::new(boxed(tx).collect()),
            Striped::new(boxed(rx).collect()),
        );
        // Frames too small to stripe, empty ones, and large ones spanning every stream.
        let frames: Vec<(Vec<u8>, Vec<u8>)> = [
            10usize,
            3 * STRIPE_BYTES + 17,
            0,
            1,
            STRIPED_MIN_BYTES,
            STRIPED_MIN_BYTES - 1,
            5 * STRIPE_BYTES,
        ]
        .iter()
        .enumerate()
        .map(|(i, &n)| frame(i, n))
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
        // Both ends stand between frames; every stream ends on shutdown.
        assert_eq!((w.written.at, r.read.at), (0, 0));
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
