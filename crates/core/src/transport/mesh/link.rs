//! Links: the byte pipes the mesh reads frames from and writes frames to. A peer on this host
//! is reached through a shared-memory pipe (`shm.rs`), any other through its TCP socket; the
//! socket of a shared-memory peer stays open only to tell whether the peer lives.

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;

use crate::error::{Error, Result};
use crate::transport::shm::ShmPipe;

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
}

/// The connection to one peer: the link its data moves on, and its socket.
pub(super) struct Connection {
    pub(super) sock: TcpStream,
    data: Box<dyn Link>,
}

impl Connection {
    /// Data on `pipe` when given (the peer shares the host), else on the socket itself.
    pub(super) fn new(sock: TcpStream, pipe: Option<ShmPipe>) -> Result<Connection> {
        let data: Box<dyn Link> = match pipe {
            Some(pipe) => Box::new(pipe),
            None => Box::new(
                sock.try_clone()
                    .map_err(|e| Error::network(format!("cannot share a peer socket: {e}")))?,
            ),
        };
        Ok(Connection { sock, data })
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
