//! The handshake's wire format: the hello a connecting rank sends, the statuses and replies the
//! accepting rank answers with, and the labels both sides' proofs are made under. Pure bytes, no
//! I/O, so the acceptor, the connecting side and the fuzz target share one definition.

use crate::auth::{Nonce, Tag, NONCE_LEN, TAG_LEN};

const HELLO_MAGIC: u32 = 0x5244_4832; // "RDH2"
const VERSION: u16 = 2;
/// The hello: magic, version, flags, job, group, size, rank, the connecting side's nonce.
pub const HELLO_LEN: usize = 36 + NONCE_LEN;
/// A reply: magic, status, the accepting side's nonce and proof (zero when unused).
pub const REPLY_LEN: usize = 8 + NONCE_LEN + TAG_LEN;
/// Hello flag: the connecting side holds an auth key.
const FLAG_AUTH: u16 = 1;
pub(super) const CONNECTOR_LABEL: &[u8] = b"rustdist peer connector v1";
pub(super) const ACCEPTOR_LABEL: &[u8] = b"rustdist peer acceptor v1";

// ---------------------------------------------------------------------------------------------
// Handshake messages

/// What a connecting rank says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The rendezvous' random id (drawn by rank 0).
    pub job: u64,
    /// The group's id (a hash of its name).
    pub group: u32,
    pub size: u32,
    pub rank: u64,
    /// Which of the streams between the two ranks this connection is (0: the first; more
    /// follow on links that one stream cannot fill).
    pub stream: u32,
    /// The connecting side holds an auth key; `nonce` is its challenge.
    pub auth: bool,
    pub nonce: Nonce,
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        let flags = if self.auth { FLAG_AUTH } else { 0 };
        b[6..8].copy_from_slice(&flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.job.to_le_bytes());
        b[16..20].copy_from_slice(&self.group.to_le_bytes());
        b[20..24].copy_from_slice(&self.size.to_le_bytes());
        b[24..32].copy_from_slice(&self.rank.to_le_bytes());
        b[32..36].copy_from_slice(&self.stream.to_le_bytes());
        b[36..].copy_from_slice(&self.nonce);
        b
    }

    /// The hello in `b`; `None` when it is not one (wrong magic or version).
    pub fn decode(b: &[u8; HELLO_LEN]) -> Option<Hello> {
        if u32_at(b, 0) != HELLO_MAGIC || u16_at(b, 4) != VERSION {
            return None;
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[36..]);
        Some(Hello {
            job: u64_at(b, 8),
            group: u32_at(b, 16),
            size: u32_at(b, 20),
            rank: u64_at(b, 24),
            stream: u32_at(b, 32),
            auth: u16_at(b, 6) & FLAG_AUTH != 0,
            nonce,
        })
    }
}

/// The accepting side's answer to a hello (and, with a key, to the proof).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Connected.
    Ok,
    /// Prove you hold the key (the reply carries the challenge and the acceptor's proof).
    Challenge,
    WrongJob,
    WrongGroup,
    WrongSize,
    BadRank,
    Duplicate,
    AuthRequired,
    AuthUnexpected,
    AuthFailed,
}

pub(super) const STATUSES: [Status; 10] = [
    Status::Ok,
    Status::Challenge,
    Status::WrongJob,
    Status::WrongGroup,
    Status::WrongSize,
    Status::BadRank,
    Status::Duplicate,
    Status::AuthRequired,
    Status::AuthUnexpected,
    Status::AuthFailed,
];

impl Status {
    fn code(self) -> u32 {
        STATUSES.iter().position(|&s| s == self).unwrap_or(0) as u32
    }

    /// Why a connection was refused, from the connecting side's point of view.
    pub(super) fn refusal(self) -> &'static str {
        match self {
            Status::Ok | Status::Challenge => {
                "authentication failed: it did not follow the RUSTDIST_AUTH_KEY exchange"
            }
            Status::WrongJob => {
                "it belongs to another job (the store holds an address of an earlier run?)"
            }
            Status::WrongGroup => "it is not in this process group",
            Status::WrongSize => "it has a different world size",
            Status::BadRank => "it does not expect a connection from this rank",
            Status::Duplicate => {
                "it is already connected to this rank (two processes with the same rank?)"
            }
            Status::AuthRequired => {
                "authentication failed: it requires RUSTDIST_AUTH_KEY, which is not set here"
            }
            Status::AuthUnexpected => {
                "authentication failed: RUSTDIST_AUTH_KEY is set here but not there"
            }
            Status::AuthFailed => {
                "authentication failed: its RUSTDIST_AUTH_KEY differs from this rank's"
            }
        }
    }
}

/// One reply of the accepting side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub status: Status,
    pub nonce: Nonce,
    pub tag: Tag,
}

impl Reply {
    pub(super) fn plain(status: Status) -> Reply {
        Reply {
            status,
            nonce: [0; NONCE_LEN],
            tag: [0; TAG_LEN],
        }
    }

    pub fn encode(&self) -> [u8; REPLY_LEN] {
        let mut b = [0u8; REPLY_LEN];
        b[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.status.code().to_le_bytes());
        b[8..8 + NONCE_LEN].copy_from_slice(&self.nonce);
        b[8 + NONCE_LEN..].copy_from_slice(&self.tag);
        b
    }

    /// The reply in `b`; `None` when it is not one.
    pub fn decode(b: &[u8; REPLY_LEN]) -> Option<Reply> {
        if u32_at(b, 0) != HELLO_MAGIC {
            return None;
        }
        let status = *STATUSES.get(usize::try_from(u32_at(b, 4)).ok()?)?;
        let mut reply = Reply::plain(status);
        reply.nonce.copy_from_slice(&b[8..8 + NONCE_LEN]);
        reply.tag.copy_from_slice(&b[8 + NONCE_LEN..]);
        Some(reply)
    }
}
