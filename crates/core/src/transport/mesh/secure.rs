//! TLS on a group's links: which streams get it (those between hosts, or every TCP one with
//! `RUSTDIST_TLS_LOCAL=1`), which end is the TLS server (the lower rank, whoever dialled, so
//! links made on demand by either rank agree), and what each end accepts (the CA's chains, or
//! exactly the certificate the peer published). Shared-memory pipes are never wrapped.

use std::io;
use std::net::TcpStream;

use super::link::{Connection, PlainStream, Stream};
use crate::error::{Error, Result};
use crate::tls::{Fingerprint, Tls, TlsStream};
use crate::transport::shm::ShmPipe;
use crate::transport::tcp::{between_hosts, LinkSetup};

/// A group's TLS: the settings and, with pinned keys, every rank's certificate hash.
#[derive(Clone)]
pub(super) struct LinkTls {
    tls: Tls,
    pins: Vec<Option<Fingerprint>>,
    rank: usize,
}

impl LinkTls {
    pub(super) fn new(tls: Tls, pins: Vec<Option<Fingerprint>>, rank: usize) -> LinkTls {
        LinkTls { tls, pins, rank }
    }

    /// `sock`, one stream to `peer`, as the link carries it.
    pub(super) fn wrap(&self, peer: usize, sock: TcpStream) -> Result<Box<dyn Stream>> {
        if !self.tls.local && !between_hosts(&sock) {
            return Ok(PlainStream::boxed(sock));
        }
        let pin = self.pins.get(peer).copied().flatten();
        let wrapped = || -> Result<Box<dyn Stream>> {
            Ok(if self.rank < peer {
                Box::new(TlsStream::server(sock, self.tls.server_config(pin)?)?)
            } else {
                Box::new(TlsStream::client(sock, self.tls.client_config(pin)?)?)
            })
        };
        wrapped().map_err(|e| e.context(&format!("rank {}", self.rank)))
    }

    /// The same for the group of ranks `keep` (sorted, old numbers) in which this rank is
    /// `me` (a shrink renumbers the ranks; their order, and so each link's roles, stay).
    pub(super) fn renumber(&self, keep: &[usize], me: usize) -> LinkTls {
        LinkTls {
            tls: self.tls.clone(),
            pins: keep
                .iter()
                .map(|&r| self.pins.get(r).copied().flatten())
                .collect(),
            rank: me,
        }
    }
}

/// The connection to `peer`: data on `pipe` when given (the peer shares the host; never
/// encrypted), else on `sock` and the `extra` streams, each wrapped with `tls` when given.
pub(super) fn connection(
    tls: Option<&LinkTls>,
    peer: usize,
    sock: TcpStream,
    pipe: Option<ShmPipe>,
    extra: Vec<TcpStream>,
) -> Result<Connection> {
    if let Some(pipe) = pipe {
        return Ok(Connection::memory(sock, pipe));
    }
    let streams = std::iter::once(sock)
        .chain(extra)
        .map(|s| match tls {
            Some(tls) => tls.wrap(peer, s),
            None => Ok(PlainStream::boxed(s)),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Connection::streams(streams))
}

/// The error of a TLS handshake that failed on the link to `peer`.
pub(super) fn handshake_failed(rank: usize, peer: usize, e: &io::Error) -> Error {
    Error::network(format!(
        "rank {rank}: the TLS handshake with rank {peer} failed: {e}"
    ))
}

/// How the links made on demand are made: [`connection`] with the group's TLS, if any, whose
/// handshake the accepting thread finishes for the links peers make to this rank. The one
/// owner of the TLS settings after connect: only these links are made later.
pub(super) struct OnDemandLinks {
    pub(super) tls: Option<LinkTls>,
}

impl LinkSetup for OnDemandLinks {
    type Link = Connection;

    fn start(&self, peer: usize, socks: Vec<TcpStream>) -> Result<Connection> {
        let mut socks = socks.into_iter();
        let first = socks
            .next()
            .ok_or_else(|| Error::backend(format!("rank {peer}'s link has no stream")))?;
        connection(self.tls.as_ref(), peer, first, None, socks.collect())
    }

    fn progress(&self, peer: usize, link: &mut Connection) -> Result<bool> {
        match &self.tls {
            Some(tls) => link
                .handshake()
                .map_err(|e| handshake_failed(tls.rank, peer, &e)),
            None => Ok(true),
        }
    }

    fn pollfds(&self, link: &Connection) -> Vec<libc::pollfd> {
        link.handshake_pollfds()
    }
}
