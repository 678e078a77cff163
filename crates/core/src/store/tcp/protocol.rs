//! Wire format of the TCP store: every message is a frame, a u32 little-endian length followed
//! by that many bytes; a request frame starts with an opcode, a response frame with a status.
//! Decoding trusts nothing: claimed lengths are checked against the bytes present, and
//! [`read_frame`] grows its buffer only as bytes arrive.
//!
//! With `RUSTDIST_AUTH_KEY` set, a connection opens with [`Request::AuthInit`] (the client's
//! nonce), [`Response::Challenge`] (the server's nonce and its proof),
//! [`Request::AuthProof`] (the client's proof) and [`Response::Ok`]; see [`crate::auth`].

use std::io::{self, Read};

use crate::auth::{Nonce, Tag};
use crate::error::{Error, Result};
use crate::store::codec::{Reader, Writer};

/// The largest frame either side accepts; a peer claiming more is dropped at once.
pub const MAX_FRAME: usize = 256 << 20;
/// The largest frame a server expecting authentication reads before the client proved itself.
pub const MAX_AUTH_FRAME: usize = 128;
/// Bytes read per step while a frame arrives (what a frame's buffer may exceed its bytes by).
const CHUNK: usize = 64 << 10;

const OP_HELLO: u8 = 1;
const OP_SET: u8 = 2;
const OP_GET: u8 = 3;
const OP_ADD: u8 = 4;
const OP_APPEND: u8 = 5;
const OP_CHECK: u8 = 6;
const OP_COMPARE_SET: u8 = 7;
const OP_DELETE: u8 = 8;
const OP_MULTI_SET: u8 = 9;
const OP_NUM_KEYS: u8 = 10;
const OP_WAIT: u8 = 11;
const OP_AUTH_INIT: u8 = 12;
const OP_AUTH_PROOF: u8 = 13;

const RE_OK: u8 = 0;
const RE_BYTES: u8 = 1;
const RE_LIST: u8 = 2;
const RE_INT: u8 = 3;
const RE_BOOL: u8 = 4;
const RE_TIMEOUT: u8 = 5;
const RE_ERROR: u8 = 6;
const RE_CHALLENGE: u8 = 7;
const RE_AUTH_FAILED: u8 = 8;

/// A client request. Blocking requests carry the client's wait in milliseconds, so the server
/// gives up (and answers [`Response::Timeout`]) when the client would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Sent once by each new `TcpStore` client; counted by the server for `wait_for_workers`.
    Hello,
    Set {
        key: String,
        value: Vec<u8>,
    },
    /// `get` and `multi_get`: the values once every key exists.
    Get {
        keys: Vec<String>,
        timeout_ms: u64,
    },
    Add {
        key: String,
        delta: i64,
    },
    Append {
        key: String,
        value: Vec<u8>,
    },
    Check {
        keys: Vec<String>,
    },
    CompareSet {
        key: String,
        expected: Vec<u8>,
        desired: Vec<u8>,
    },
    Delete {
        key: String,
    },
    MultiSet {
        keys: Vec<String>,
        values: Vec<Vec<u8>>,
    },
    NumKeys,
    Wait {
        keys: Vec<String>,
        timeout_ms: u64,
    },
    /// Opens authentication: the client's challenge.
    AuthInit {
        nonce: Nonce,
    },
    /// The client's proof over both challenges.
    AuthProof {
        tag: Tag,
    },
}

/// A server response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    Ok,
    Bytes(Vec<u8>),
    List(Vec<Vec<u8>>),
    Int(i64),
    Bool(bool),
    /// The wait ended with these keys still missing.
    Timeout(Vec<String>),
    /// The request failed (e.g. `add` on a non-integer value).
    Error(String),
    /// The server's challenge and its proof over both challenges.
    Challenge {
        nonce: Nonce,
        tag: Tag,
    },
    /// Authentication failed (the reason); the server closes the connection.
    AuthFailed(String),
}

/// A frame: the length, then what `body` writes.
fn frame(body: impl FnOnce(&mut Writer)) -> Vec<u8> {
    let mut w = Writer::default();
    w.u32(0);
    body(&mut w);
    let len = (w.0.len() - 4) as u32;
    w.0[..4].copy_from_slice(&len.to_le_bytes());
    w.0
}

impl Request {
    /// The request as a complete frame.
    pub fn encode(&self) -> Vec<u8> {
        frame(|w| {
            match self {
                Request::Hello => w.u8(OP_HELLO),
                Request::Set { key, value } => w.u8(OP_SET).bytes(key.as_bytes()).bytes(value),
                Request::Get { keys, timeout_ms } => w.u8(OP_GET).strs(keys).u64(*timeout_ms),
                Request::Add { key, delta } => w.u8(OP_ADD).bytes(key.as_bytes()).i64(*delta),
                Request::Append { key, value } => {
                    w.u8(OP_APPEND).bytes(key.as_bytes()).bytes(value)
                }
                Request::Check { keys } => w.u8(OP_CHECK).strs(keys),
                Request::CompareSet {
                    key,
                    expected,
                    desired,
                } => w
                    .u8(OP_COMPARE_SET)
                    .bytes(key.as_bytes())
                    .bytes(expected)
                    .bytes(desired),
                Request::Delete { key } => w.u8(OP_DELETE).bytes(key.as_bytes()),
                Request::MultiSet { keys, values } => {
                    w.u8(OP_MULTI_SET).strs(keys).byte_lists(values)
                }
                Request::NumKeys => w.u8(OP_NUM_KEYS),
                Request::Wait { keys, timeout_ms } => w.u8(OP_WAIT).strs(keys).u64(*timeout_ms),
                Request::AuthInit { nonce } => w.u8(OP_AUTH_INIT).raw(nonce),
                Request::AuthProof { tag } => w.u8(OP_AUTH_PROOF).raw(tag),
            };
        })
    }

    /// Parses a frame's body; any malformation (unknown opcode included) is an error.
    pub fn decode(body: &[u8]) -> Result<Self> {
        let mut r = Reader::new(body);
        let req = match r.u8()? {
            OP_HELLO => Request::Hello,
            OP_SET => Request::Set {
                key: r.string()?,
                value: r.bytes()?,
            },
            OP_GET => Request::Get {
                keys: r.strs()?,
                timeout_ms: r.u64()?,
            },
            OP_ADD => Request::Add {
                key: r.string()?,
                delta: r.i64()?,
            },
            OP_APPEND => Request::Append {
                key: r.string()?,
                value: r.bytes()?,
            },
            OP_CHECK => Request::Check { keys: r.strs()? },
            OP_COMPARE_SET => Request::CompareSet {
                key: r.string()?,
                expected: r.bytes()?,
                desired: r.bytes()?,
            },
            OP_DELETE => Request::Delete { key: r.string()? },
            OP_MULTI_SET => Request::MultiSet {
                keys: r.strs()?,
                values: r.byte_lists()?,
            },
            OP_NUM_KEYS => Request::NumKeys,
            OP_WAIT => Request::Wait {
                keys: r.strs()?,
                timeout_ms: r.u64()?,
            },
            OP_AUTH_INIT => Request::AuthInit { nonce: r.array()? },
            OP_AUTH_PROOF => Request::AuthProof { tag: r.array()? },
            op => {
                return Err(Error::store(format!(
                    "malformed message: unknown opcode {op}"
                )))
            }
        };
        r.finish()?;
        Ok(req)
    }
}

impl Response {
    /// The response as a complete frame.
    pub fn encode(&self) -> Vec<u8> {
        frame(|w| {
            match self {
                Response::Ok => w.u8(RE_OK),
                Response::Bytes(b) => w.u8(RE_BYTES).bytes(b),
                Response::List(l) => w.u8(RE_LIST).byte_lists(l),
                Response::Int(v) => w.u8(RE_INT).i64(*v),
                Response::Bool(b) => w.u8(RE_BOOL).u8(u8::from(*b)),
                Response::Timeout(keys) => w.u8(RE_TIMEOUT).strs(keys),
                Response::Error(msg) => w.u8(RE_ERROR).bytes(msg.as_bytes()),
                Response::Challenge { nonce, tag } => w.u8(RE_CHALLENGE).raw(nonce).raw(tag),
                Response::AuthFailed(msg) => w.u8(RE_AUTH_FAILED).bytes(msg.as_bytes()),
            };
        })
    }

    pub fn decode(body: &[u8]) -> Result<Self> {
        let mut r = Reader::new(body);
        let resp = match r.u8()? {
            RE_OK => Response::Ok,
            RE_BYTES => Response::Bytes(r.bytes()?),
            RE_LIST => Response::List(r.byte_lists()?),
            RE_INT => Response::Int(r.i64()?),
            RE_BOOL => Response::Bool(r.u8()? != 0),
            RE_TIMEOUT => Response::Timeout(r.strs()?),
            RE_ERROR => Response::Error(String::from_utf8_lossy(&r.bytes()?).into_owned()),
            RE_CHALLENGE => Response::Challenge {
                nonce: r.array()?,
                tag: r.array()?,
            },
            RE_AUTH_FAILED => {
                Response::AuthFailed(String::from_utf8_lossy(&r.bytes()?).into_owned())
            }
            s => {
                return Err(Error::store(format!(
                    "malformed response: unknown status {s}"
                )))
            }
        };
        r.finish()?;
        Ok(resp)
    }
}

/// Reads one frame's body. `Ok(None)` on a clean end of stream before a frame starts; an
/// error on a frame longer than `max` bytes (at most [`MAX_FRAME`]) or cut short. Memory grows
/// with the bytes that actually arrive (at most `CHUNK` ahead), never with the claimed length.
pub fn read_frame(r: &mut impl Read, max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut header = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_le_bytes(header) as usize;
    let max = max.min(MAX_FRAME);
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the {max}-byte limit"),
        ));
    }
    let mut buf = Vec::new();
    while buf.len() < len {
        let start = buf.len();
        buf.resize(start + CHUNK.min(len - start), 0);
        match r.read(&mut buf[start..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf.truncate(start + n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => buf.truncate(start),
            Err(e) => return Err(e),
        }
    }
    Ok(Some(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(frame: &[u8]) -> &[u8] {
        assert_eq!(
            u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize,
            frame.len() - 4
        );
        &frame[4..]
    }

    #[test]
    fn store_protocol_round_trips() {
        let reqs = vec![
            Request::Hello,
            Request::Set {
                key: "k".into(),
                value: vec![0, 1],
            },
            Request::Get {
                keys: vec!["a".into(), "b".into()],
                timeout_ms: 7,
            },
            Request::Add {
                key: "c".into(),
                delta: -5,
            },
            Request::Append {
                key: "k".into(),
                value: b"x".to_vec(),
            },
            Request::Check { keys: vec![] },
            Request::CompareSet {
                key: "k".into(),
                expected: vec![],
                desired: vec![9],
            },
            Request::Delete { key: "k".into() },
            Request::MultiSet {
                keys: vec!["a".into()],
                values: vec![vec![]],
            },
            Request::NumKeys,
            Request::Wait {
                keys: vec!["w".into()],
                timeout_ms: u64::MAX,
            },
            Request::AuthInit { nonce: [3; 32] },
            Request::AuthProof { tag: [4; 32] },
        ];
        for req in reqs {
            assert_eq!(Request::decode(body(&req.encode())).unwrap(), req);
        }
        let resps = vec![
            Response::Ok,
            Response::Bytes(vec![1]),
            Response::List(vec![vec![], vec![2]]),
            Response::Int(i64::MIN),
            Response::Bool(true),
            Response::Timeout(vec!["k".into()]),
            Response::Error("bad".into()),
            Response::Challenge {
                nonce: [5; 32],
                tag: [6; 32],
            },
            Response::AuthFailed("no".into()),
        ];
        for resp in resps {
            assert_eq!(Response::decode(body(&resp.encode())).unwrap(), resp);
        }
    }

    #[test]
    fn store_protocol_rejects_malformed() {
        assert!(Request::decode(&[]).is_err());
        assert!(Request::decode(&[200]).is_err());
        assert!(
            Request::decode(&[OP_NUM_KEYS, 0]).is_err(),
            "trailing bytes"
        );
        assert!(Request::decode(&[OP_SET, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(Response::decode(&[99]).is_err());
        assert!(
            Request::decode(&[OP_AUTH_INIT, 1, 2]).is_err(),
            "short nonce"
        );
        assert!(Response::decode(&[RE_CHALLENGE; 40]).is_err(), "short tag");
        // Frames: too long, cut short, clean end.
        let huge = (1u32 << 30).to_le_bytes();
        assert!(read_frame(&mut &huge[..], MAX_FRAME).is_err());
        let cut = [10u8, 0, 0, 0, 1, 2];
        assert!(read_frame(&mut &cut[..], MAX_FRAME).is_err());
        assert!(read_frame(&mut &[1u8, 0][..], MAX_FRAME).is_err());
        assert_eq!(read_frame(&mut &[][..], MAX_FRAME).unwrap(), None);
        let ok = [2u8, 0, 0, 0, 7, 8];
        assert_eq!(
            read_frame(&mut &ok[..], MAX_FRAME).unwrap(),
            Some(vec![7, 8])
        );
        // Before authentication only small frames are read.
        let big = [200u8, 0, 0, 0];
        assert!(read_frame(&mut &big[..], MAX_AUTH_FRAME).is_err());
    }
}
