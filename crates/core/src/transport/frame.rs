//! The frame header every message carries: group, collective sequence number and step (or the
//! point-to-point tag) and the collective's [`Signature`], so that messages of different
//! collectives, groups and tags never mix and a disagreement between ranks is caught at once.

use crate::error::{Error, Result};
use crate::transport::{OpCtx, Signature};
use crate::types::{CollectiveKind, DType, ReduceOp};

const MAGIC: u32 = 0x5244_5354; // "RDST"
pub const HEADER_LEN: usize = 40;
/// Where a header holds its payload's length.
const LEN_AT: usize = 32;

/// The payload length a header's bytes claim, read without checking the rest of the header.
pub fn payload_len(b: &[u8; HEADER_LEN]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[LEN_AT..LEN_AT + 8]);
    u64::from_le_bytes(w)
}

#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    Collective = 1,
    Tagged = 2,
    Abort = 3,
    Goodbye = 4,
    /// A survivor's marker while it shrinks the group: nothing of the old group follows it on
    /// its link (`mesh/shrink.rs`). `group` is the new group's id, `seq` the old one's, `step`
    /// the phase; the payload lists the excluded ranks.
    Shrink = 5,
    /// A one-sided put into the receiver's window (SEPARATE access, `mesh/window.rs`): `step`
    /// is the window, `seq` the byte offset; the target's engine copies the payload there.
    WindowPut = 6,
    /// A window signal: the receiver's counter for the sender goes up by one (`step`: the
    /// window). It follows the sender's earlier puts on the link, so they are in place by then.
    WindowSignal = 7,
    /// The sender deregistered the window (`step`): nothing more of it follows on the link.
    WindowClose = 8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: FrameKind,
    /// Collective kind; for `Abort`, the error class (see [`abort_class`]).
    pub coll: u8,
    pub dtype: u8,
    pub op: u8,
    pub group: u32,
    pub step: u32,
    /// Collective sequence number, or the tag of a tagged message.
    pub seq: u64,
    pub count: u64,
    pub len: u64,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.kind as u8;
        b[5] = self.coll;
        b[6] = self.dtype;
        b[7] = self.op;
        b[8..12].copy_from_slice(&self.group.to_le_bytes());
        b[12..16].copy_from_slice(&self.step.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.count.to_le_bytes());
        b[LEN_AT..LEN_AT + 8].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HEADER_LEN], peer: usize) -> Result<Header> {
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let long = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        if word(0) != MAGIC {
            return Err(Error::network(format!(
                "rank {peer} sent a malformed frame (bad magic {:#x})",
                word(0)
            )));
        }
        let kind = match b[4] {
            1 => FrameKind::Collective,
            2 => FrameKind::Tagged,
            3 => FrameKind::Abort,
            4 => FrameKind::Goodbye,
            5 => FrameKind::Shrink,
            6 => FrameKind::WindowPut,
            7 => FrameKind::WindowSignal,
            8 => FrameKind::WindowClose,
            other => {
                return Err(Error::network(format!(
                    "rank {peer} sent a malformed frame (kind {other})"
                )))
            }
        };
        Ok(Header {
            kind,
            coll: b[5],
            dtype: b[6],
            op: b[7],
            group: word(8),
            step: word(12),
            seq: long(16),
            count: long(24),
            len: payload_len(b),
        })
    }

    pub fn collective(group: u32, ctx: &OpCtx, step: u32, len: usize) -> Header {
        Header {
            kind: FrameKind::Collective,
            coll: ctx.sig.kind as u8,
            dtype: ctx.sig.dtype as u8,
            op: ctx.sig.op as u8,
            group,
            step,
            seq: ctx.seq,
            count: ctx.sig.count,
            len: len as u64,
        }
    }
}

pub fn abort_class(e: &Error) -> u8 {
    match e {
        Error::Network(_) => 1,
        _ => 2,
    }
}

pub fn error_from_abort(class: u8, msg: String) -> Error {
    if class == 1 {
        Error::Network(msg)
    } else {
        Error::Backend(msg)
    }
}

/// The collective a header belongs to, in words.
pub fn collective_name(hdr: &Header) -> String {
    CollectiveKind::from_code(hdr.coll)
        .map(|k| k.name().to_string())
        .unwrap_or_else(|_| format!("collective code {}", hdr.coll))
}

/// A peer's signature as codes (from a frame header or a workspace announce line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Codes {
    pub kind: u8,
    pub dtype: u8,
    pub op: u8,
    pub count: u64,
}

impl From<&Header> for Codes {
    fn from(hdr: &Header) -> Codes {
        Codes {
            kind: hdr.coll,
            dtype: hdr.dtype,
            op: hdr.op,
            count: hdr.count,
        }
    }
}

/// What differs between our signature and a peer's, in words.
pub fn signature_diff(ours: &Signature, theirs: Codes) -> Option<String> {
    if ours.kind as u8 != theirs.kind {
        let name = CollectiveKind::from_code(theirs.kind)
            .map(|k| k.name().to_string())
            .unwrap_or_else(|_| format!("collective code {}", theirs.kind));
        return Some(format!(
            "collective type differs: {} vs {name}",
            ours.kind.name()
        ));
    }
    if ours.dtype as u8 != theirs.dtype {
        let name = DType::from_code(theirs.dtype)
            .map(|d| d.name().to_string())
            .unwrap_or_else(|_| format!("dtype code {}", theirs.dtype));
        return Some(format!("dtype differs: {} vs {name}", ours.dtype.name()));
    }
    if ours.count != theirs.count {
        return Some(format!(
            "tensor size differs: {} vs {} elements",
            ours.count, theirs.count
        ));
    }
    if ours.op as u8 != theirs.op {
        let name = ReduceOp::from_code(theirs.op)
            .map(|o| o.name().to_string())
            .unwrap_or_else(|_| format!("op code {}", theirs.op));
        return Some(format!("reduce op differs: {} vs {name}", ours.op.name()));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip() {
        let h = Header {
            kind: FrameKind::Collective,
            coll: 2,
            dtype: 3,
            op: 1,
            group: 0xabcd,
            step: 7,
            seq: 99,
            count: 12345,
            len: 4096,
        };
        assert_eq!(Header::decode(&h.encode(), 1).unwrap(), h);
        let mut bad = h.encode();
        bad[0] ^= 0xff;
        assert!(matches!(Header::decode(&bad, 1), Err(Error::Network(_))));
    }
}
