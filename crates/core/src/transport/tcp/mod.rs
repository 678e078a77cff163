//! TCP connection setup: every rank listens on its chosen interface, publishes its address in
//! the store, connects to the lower ranks and accepts the higher ones: all of them with
//! `RUSTDIST_EAGER_CONNECT=1`, else only its ring neighbours (and the peers it shares memory
//! with), the rest on first use ([`OnDemand`]).
//!
//! Each connection opens with a handshake. The connecting rank sends a fixed-size hello naming
//! the job (a random id rank 0 draws and publishes with its address, so two jobs never
//! cross-connect), the group, the world size and its rank; the accepting rank answers with a
//! status. With `RUSTDIST_AUTH_KEY` set, both sides prove they hold the key (HMAC over a fresh
//! challenge, see [`crate::auth`]) before the connection counts. Every handshake message has a
//! fixed size and is read into a fixed buffer, so a hostile connection is dropped (and logged)
//! before its bytes can decide any allocation; incoming handshakes progress concurrently, so a
//! silent connection cannot hold up the real peers.
//!
//! Where one stream cannot fill a link between hosts, more streams to the same peer follow once
//! the links are measured ([`connect_streams`]): the same handshake, its hello naming which
//! stream it is, and a stream nobody expects is refused like a wrong rank.
//!
//! The pieces, each in its own file, with imports running one way (a module uses only those
//! listed before it): `handshake` (the wire format), `interface` (which address to listen
//! on), `poll` (poll(2) helpers) and `socket` (a peer socket's setup) use none of the
//! others; `probe` (link latency and bandwidth) uses `poll` and `socket`; `acceptor` (the
//! accepting side) uses `handshake`, `poll` and `socket`; `connect` (the connecting side,
//! the mesh and its extra streams) uses `handshake`, `interface`, `socket` and `acceptor`.
//! `ondemand` (links made on first use, after connect: the listener served by a thread, the
//! dialling side) uses `acceptor`, `connect`, `handshake` and `poll`. Only this file uses
//! `connect` and `ondemand`; it re-exports the public surface, so every path stays
//! `transport::tcp::X`.

mod acceptor;
mod connect;
mod handshake;
mod interface;
mod ondemand;
mod poll;
mod probe;
mod socket;

pub use connect::{connect_mesh_with, connect_streams, peer_entries, Entry, Mesh};
pub use handshake::{Hello, Reply, Status, HELLO_LEN, REPLY_LEN};
pub use interface::{interfaces, select_interface, Interface, IFNAME_VARS};
pub use ondemand::{LinkSetup, OnDemand};
pub use poll::{poll_fds, pollfd};
pub use probe::{agree_latency, agree_links, stream_window, LinkAgreement};
pub use socket::between_hosts;

#[cfg(test)]
mod tests;
