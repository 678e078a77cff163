//! One connection of the event-loop server: its non-blocking socket (with TLS on it when the
//! server has TLS), the bytes received but not yet parsed, and the answers not yet written.

use std::io::{self, IoSlice, Read, Write};
use std::ops::Range;
use std::time::Instant;

use mio::net::TcpStream;

use super::protocol::{MAX_AUTH_FRAME, MAX_FRAME};
use super::shared::{EXPORTER_LABEL, WRITE_TIMEOUT};
use crate::auth::Nonce;
use crate::tls::TlsStream;

/// What a connection's bytes travel on.
pub(crate) enum Wire {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Wire {
    pub fn socket(&self) -> &TcpStream {
        match self {
            Wire::Plain(s) => s,
            Wire::Tls(t) => t.socket(),
        }
    }

    pub fn socket_mut(&mut self) -> &mut TcpStream {
        match self {
            Wire::Plain(s) => s,
            Wire::Tls(t) => t.socket_mut(),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Wire::Plain(s) => s.read(buf),
            Wire::Tls(t) => t.read(buf),
        }
    }

    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Wire::Plain(s) => s.write(buf),
            Wire::Tls(t) => t.write_vectored(&[IoSlice::new(buf)]),
        }
    }

    /// Sends TLS records still waiting; true once none are.
    fn flush(&mut self) -> io::Result<bool> {
        match self {
            Wire::Plain(_) => Ok(true),
            Wire::Tls(t) => t.flush_out(),
        }
    }

    fn pending(&self) -> bool {
        matches!(self, Wire::Tls(t) if t.wants_write())
    }

    /// What the auth key's proofs are bound to: the TLS session's exporter (empty without
    /// TLS).
    pub fn binding(&self) -> io::Result<Vec<u8>> {
        match self {
            Wire::Plain(_) => Ok(Vec::new()),
            Wire::Tls(t) => t
                .exporter(EXPORTER_LABEL)
                .map(|e| e.to_vec())
                .map_err(|e| io::Error::other(e.to_string())),
        }
    }
}

/// Bytes read per step; a connection's read buffer exceeds its current frame by at most this.
pub(crate) const CHUNK: usize = 64 << 10;

/// Where a connection is in its life.
pub(crate) enum Phase {
    /// Authentication required: waiting for the client's nonce.
    AwaitInit,
    /// Challenge sent: waiting for the client's proof.
    AwaitProof { client_nonce: Nonce, nonce: Nonce },
    /// Requests are served.
    Serving,
    /// Over the connection cap: its first bytes are answered with the refusal, the rest are
    /// discarded until it hangs up.
    Refusing { answered: bool },
}

/// What reading found.
pub(crate) enum ReadOutcome {
    /// Some bytes arrived (and were buffered, or discarded while refusing).
    Data,
    /// Nothing more for now.
    WouldBlock,
    /// The client hung up.
    Eof,
    /// The server has TLS and the client's first bytes are no TLS handshake.
    NotTls,
}

/// A TLS record's first bytes (a handshake, TLS 1.x): what a TLS client opens with.
const TLS_HANDSHAKE: [u8; 2] = [0x16, 0x03];

pub(crate) struct Conn {
    pub wire: Wire,
    /// Tells this connection's timers from those of an earlier one in the same slot.
    pub serial: u64,
    pub phase: Phase,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    /// Bytes of `wbuf` already written.
    wpos: usize,
    /// The parked request's id in the waiter table.
    pub parked: Option<u64>,
    /// Close once `wbuf` is written (a refusal or a failed authentication).
    pub closing: bool,
    /// Authentication or refusal must be over by then.
    pub phase_deadline: Option<Instant>,
    /// Dropped at this time unless the pending answer makes progress.
    pub write_deadline: Option<Instant>,
}

impl Conn {
    pub fn new(wire: Wire, serial: u64, phase: Phase, deadline: Option<Instant>) -> Self {
        Conn {
            wire,
            serial,
            phase,
            rbuf: Vec::new(),
            wbuf: Vec::new(),
            wpos: 0,
            parked: None,
            closing: false,
            phase_deadline: deadline,
            write_deadline: None,
        }
    }

    /// The largest frame this connection may send now.
    fn max_frame(&self) -> usize {
        match self.phase {
            Phase::AwaitInit | Phase::AwaitProof { .. } => MAX_AUTH_FRAME,
            Phase::Serving | Phase::Refusing { .. } => MAX_FRAME,
        }
    }

    /// Whether it may take its next request: nothing parked, nothing left to write.
    pub fn ready(&self) -> bool {
        self.parked.is_none() && !self.closing && self.wbuf.is_empty()
    }

    /// Whether some bytes of a frame have arrived and not been consumed.
    pub fn mid_frame(&self) -> bool {
        !self.rbuf.is_empty()
    }

    /// Whether a plain connection opens with a TLS handshake (a client with TLS on, this
    /// server without): its bytes are no request.
    pub fn speaks_tls(&self) -> bool {
        matches!(self.wire, Wire::Plain(_))
            && matches!(self.phase, Phase::AwaitInit | Phase::Serving)
            && self.rbuf.starts_with(&TLS_HANDSHAKE)
    }

    /// The byte range of the next complete frame's body in the read buffer, `None` while it
    /// is incomplete; an error for a frame over the limit (before any of it is buffered
    /// beyond what arrived).
    pub fn next_frame(&self) -> io::Result<Option<Range<usize>>> {
        let Some(header) = self.rbuf.get(..4) else {
            return Ok(None);
        };
        let mut len = [0u8; 4];
        len.copy_from_slice(header);
        let len = u32::from_le_bytes(len) as usize;
        let max = self.max_frame();
        if len > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("frame of {len} bytes exceeds the {max}-byte limit"),
            ));
        }
        Ok((self.rbuf.len() >= 4 + len).then_some(4..4 + len))
    }

    pub fn frame(&self, body: Range<usize>) -> &[u8] {
        &self.rbuf[body]
    }

    /// Drops the bytes of a handled frame ending at `end`.
    pub fn consume(&mut self, end: usize) {
        self.rbuf.drain(..end);
        if self.rbuf.is_empty() && self.rbuf.capacity() > CHUNK {
            self.rbuf = Vec::new();
        }
    }

    /// Reads up to one chunk into `scratch`, appending it to the read buffer (or discarding
    /// it while refusing). A TLS connection's first byte is looked at before TLS reads it.
    pub fn read_some(&mut self, scratch: &mut [u8]) -> io::Result<ReadOutcome> {
        if let Wire::Tls(t) = &self.wire {
            if !t.started() {
                let mut first = [0u8; 1];
                match t.socket().peek(&mut first) {
                    Ok(0) => return Ok(ReadOutcome::Eof),
                    Ok(_) if first[0] != TLS_HANDSHAKE[0] => return Ok(ReadOutcome::NotTls),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return Ok(ReadOutcome::WouldBlock)
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        loop {
            return match self.wire.read(scratch) {
                Ok(0) => Ok(ReadOutcome::Eof),
                Ok(n) => {
                    if !matches!(self.phase, Phase::Refusing { .. }) {
                        self.rbuf.extend_from_slice(&scratch[..n]);
                    }
                    Ok(ReadOutcome::Data)
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(ReadOutcome::WouldBlock),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
        }
    }

    /// Answers a client that does not speak TLS to this TLS server in its own words (`frame`,
    /// in the clear), having read what it sent, so that closing does not reset the answer
    /// away; then ends the connection.
    pub fn refuse_in_the_clear(&mut self, frame: &[u8], scratch: &mut [u8]) {
        let mut sock = self.wire.socket();
        while matches!(sock.read(scratch), Ok(n) if n > 0) {}
        let _ = sock.write(frame);
        let _ = sock.shutdown(std::net::Shutdown::Write);
    }

    /// Whether the client hung up, without consuming what it sent (checked while a request
    /// of its is parked, when nothing else is read).
    pub fn hung_up(&self) -> bool {
        match self.wire.socket().peek(&mut [0u8; 1]) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ),
        }
    }

    /// Queues `frame` and writes what the socket takes now. Returns whether a write
    /// deadline was newly set (the caller arms a timer for it).
    pub fn send(&mut self, frame: &[u8], now: Instant) -> io::Result<bool> {
        self.wbuf.extend_from_slice(frame);
        self.flush(now)
    }

    /// Writes what the socket takes; see [`Conn::send`].
    pub fn flush(&mut self, now: Instant) -> io::Result<bool> {
        let mut progressed = false;
        while self.wpos < self.wbuf.len() {
            match self.wire.write(&self.wbuf[self.wpos..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.wpos += n;
                    progressed = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let sent = self.wire.flush()?;
        if self.wpos == self.wbuf.len() {
            self.wbuf.clear();
            self.wpos = 0;
            if self.wbuf.capacity() > CHUNK {
                self.wbuf = Vec::new();
            }
            if sent {
                self.write_deadline = None;
                return Ok(false);
            }
        }
        let armed = self.write_deadline.is_none();
        if armed || progressed {
            self.write_deadline = Some(now + WRITE_TIMEOUT);
        }
        Ok(armed)
    }

    pub fn flushed(&self) -> bool {
        self.wbuf.is_empty() && !self.wire.pending()
    }

    /// The earliest time something must happen to this connection.
    pub fn deadline(&self) -> Option<Instant> {
        match (self.phase_deadline, self.write_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
