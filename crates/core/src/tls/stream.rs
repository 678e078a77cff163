//! A TLS connection over a non-blocking socket, for an event loop: reads return what has been
//! decrypted (`WouldBlock` when nothing is), writes encrypt a bounded batch and return how
//! much they took, and the handshake moves on inside either. Ciphertext is read from the
//! socket in large pieces (rustls alone reads one record at a time) and written with one
//! writev per batch.

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, Connection, ServerConfig, ServerConnection};

use crate::error::{Error, Result};

/// Ciphertext read from the socket at once.
const READ_BYTES: usize = 256 << 10;
/// Plaintext encrypted by one write: a writev's worth of records, and the most ciphertext a
/// write leaves unsent (what was accepted must reach the kernel before a frame counts as
/// sent, so that the peer gets it without this rank calling again).
const WRITE_BATCH: usize = 256 << 10;

/// One TLS connection (client or server side) over its socket (a std or mio one).
pub struct TlsStream<S = TcpStream> {
    sock: S,
    conn: Connection,
    /// Ciphertext read from the socket and not yet handed to rustls: `inbuf[at..len]`.
    inbuf: Vec<u8>,
    at: usize,
    len: usize,
    /// Decrypted bytes rustls holds for the next read.
    plain: usize,
    /// The socket has read EOF.
    eof: bool,
    /// The peer has accepted this end: at once for a server, for a client once a record came
    /// after its last handshake message (in TLS 1.3 the client finishes first, and only the
    /// server's session ticket says it took the client's certificate).
    confirmed: bool,
}

/// The I/O error of a TLS failure, saying what it means.
fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, describe(&e))
}

/// What a TLS failure means, for the person reading the error.
pub fn describe(e: &rustls::Error) -> String {
    use rustls::{AlertDescription, CertificateError};
    match e {
        rustls::Error::AlertReceived(AlertDescription::BadRecordMac) => {
            "a TLS record from this end failed authentication there: the data was altered on \
             the way"
                .into()
        }
        rustls::Error::AlertReceived(AlertDescription::HandshakeFailure) => {
            "the peer refused the TLS handshake (HandshakeFailure): is TLS off there?".into()
        }
        rustls::Error::AlertReceived(alert) => format!(
            "the peer ended the TLS session ({alert:?}): it refused this end's certificate or \
             key, or this end refused its"
        ),
        rustls::Error::InvalidCertificate(CertificateError::Other(why)) => {
            format!("its TLS certificate was refused: {}", why.0)
        }
        rustls::Error::InvalidCertificate(c) => format!("its TLS certificate was refused: {c:?}"),
        rustls::Error::NoCertificatesPresented => "it presented no TLS certificate".into(),
        rustls::Error::DecryptError => {
            "a TLS record failed authentication: the data was altered on the way".into()
        }
        rustls::Error::InvalidMessage(_) => format!(
            "it does not speak TLS ({e}): is TLS off there (RUSTDIST_TLS, RUSTDIST_TLS_CERT)?"
        ),
        other => format!("TLS: {other}"),
    }
}

/// `describe` for an I/O error that may carry a TLS failure.
pub fn describe_io(e: &io::Error) -> String {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(tls) => describe(tls),
        None if e.kind() == io::ErrorKind::UnexpectedEof => {
            "the connection closed during the TLS handshake (is TLS on there, with the same \
             mode?)"
                .into()
        }
        None => e.to_string(),
    }
}

impl<S: Read + Write> TlsStream<S> {
    /// The client side of a session on `sock` (non-blocking).
    pub fn client(sock: S, config: Arc<ClientConfig>) -> Result<TlsStream<S>> {
        let name = ServerName::try_from("rustdist").map_err(|e| Error::invalid(e.to_string()))?;
        let conn =
            ClientConnection::new(config, name).map_err(|e| Error::network(format!("TLS: {e}")))?;
        Ok(TlsStream::on(sock, conn.into(), false))
    }

    /// The server side of a session on `sock` (non-blocking).
    pub fn server(sock: S, config: Arc<ServerConfig>) -> Result<TlsStream<S>> {
        let conn =
            ServerConnection::new(config).map_err(|e| Error::network(format!("TLS: {e}")))?;
        Ok(TlsStream::on(sock, conn.into(), true))
    }

    fn on(sock: S, mut conn: Connection, confirmed: bool) -> TlsStream<S> {
        // Writes are bounded here (WRITE_BATCH), so rustls takes whatever it is given.
        conn.set_buffer_limit(None);
        TlsStream {
            sock,
            conn,
            inbuf: Vec::new(),
            at: 0,
            len: 0,
            plain: 0,
            eof: false,
            confirmed,
        }
    }

    pub fn socket(&self) -> &S {
        &self.sock
    }

    pub fn socket_mut(&mut self) -> &mut S {
        &mut self.sock
    }

    /// Whether any byte came from the peer yet.
    pub fn started(&self) -> bool {
        !self.inbuf.is_empty()
    }

    /// Whether the handshake is still going on, or (a client) not yet confirmed.
    pub fn handshaking(&self) -> bool {
        self.conn.is_handshaking() || !self.confirmed
    }

    /// Whether ciphertext waits for room in the socket.
    pub fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }

    /// Whether a read can return bytes without the socket: decrypted ones, or ciphertext
    /// read already.
    pub fn buffered(&self) -> bool {
        self.plain > 0 || self.at < self.len
    }

    /// Moves the handshake on as far as the socket allows; true once it is over, its last
    /// message sent and the peer's acceptance seen. EOF before then is an error.
    pub fn handshake(&mut self) -> io::Result<bool> {
        while self.handshaking() {
            self.flush_out()?;
            match self.receive() {
                Ok(()) if self.eof => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the connection during the TLS handshake (it refused \
                         this end, or has TLS off)",
                    ))
                }
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(self.flush_out()? && !self.handshaking())
    }

    /// Hands rustls ciphertext (from the socket when none is read already) and decrypts
    /// what completes; `WouldBlock` when the socket has none, EOF in `self.eof`.
    fn receive(&mut self) -> io::Result<()> {
        if self.at == self.len {
            if self.inbuf.is_empty() {
                self.inbuf = vec![0; READ_BYTES];
            }
            let n = loop {
                match self.sock.read(&mut self.inbuf) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    other => break other?,
                }
            };
            if n == 0 {
                self.eof = true;
                return Ok(());
            }
            (self.at, self.len) = (0, n);
        }
        let after_handshake = !self.conn.is_handshaking();
        let n = self.conn.read_tls(&mut &self.inbuf[self.at..self.len])?;
        self.at += n;
        self.confirmed |= after_handshake && n > 0;
        match self.conn.process_new_packets() {
            Ok(state) => {
                self.plain = state.plaintext_bytes_to_read();
                Ok(())
            }
            Err(e) => {
                // The alert rustls queued tells the peer why.
                let _ = self.flush_out();
                Err(tls_error(e))
            }
        }
    }

    /// Reads decrypted bytes; `Ok(0)` at EOF (a peer that exits sends no close_notify: the
    /// link's frames say whether anything was cut short).
    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if self.plain > 0 {
                let n = self.conn.reader().read(buf)?;
                self.plain -= n;
                return Ok(n);
            }
            if self.eof {
                return Ok(0);
            }
            // Handshake messages and key updates answer what is read.
            self.flush_out()?;
            self.receive()?;
        }
    }

    /// Encrypts up to `WRITE_BATCH` bytes of `bufs` and sends what the socket takes;
    /// `WouldBlock` while the handshake goes on or ciphertext of an earlier write waits.
    pub fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if self.conn.is_handshaking() {
            self.handshake()?;
            if self.conn.is_handshaking() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
        if !self.flush_out()? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        // One stream of records across the slices: a frame's header shares its payload's.
        let mut batch = Vec::with_capacity(bufs.len());
        let mut left = WRITE_BATCH;
        for b in bufs {
            let take = b.len().min(left);
            if take == 0 {
                break;
            }
            batch.push(IoSlice::new(&b[..take]));
            left -= take;
        }
        let taken = self.conn.writer().write_vectored(&batch)?;
        self.flush_out()?;
        Ok(taken)
    }

    /// Sends pending ciphertext; true once none is left.
    pub fn flush_out(&mut self) -> io::Result<bool> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut self.sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// The TLS exporter's secret for `label` (RFC 5705): both ends of one session get the
    /// same, a man in the middle two different ones.
    pub fn exporter(&self, label: &[u8]) -> Result<[u8; 32]> {
        self.conn
            .export_keying_material([0u8; 32], label, None)
            .map_err(|e| Error::network(format!("TLS: {e}")))
    }
}
