//! The heartbeat datagram: a 24-byte header (magic, kind, job, group, rank) and the sender's
//! status; under a key, the sender's count and an HMAC over all of it. Anything else that
//! arrives is ignored.

use crate::auth::{AuthKey, TAG_LEN};
use crate::error::Error;
use crate::recorder::{Status, MAX_ACTIVITY};
use crate::transport::frame::{abort_class, error_from_abort};

const MAGIC: u32 = 0x5244_4842; // "RDHB"
/// "I am alive", with the sender's status.
pub(super) const BEAT: u32 = 1;
/// "I am leaving": no longer watch me.
pub(super) const GOODBYE: u32 = 2;
/// "Tell me your status now": answered with a beat (a timeout asks every rank it names).
pub(super) const ASK: u32 = 3;
const HEADER_LEN: usize = 24;
/// The status after the header: the id of the group served now and whether it has failed (0,
/// else the failure's class: [`abort_class`]),
/// the collective entered, the activity's age in ms, the text's length, the text.
const STATUS_LEN: usize = 4 + 1 + 8 + 8 + 2;
/// The longest failure text carried: a timeout's names the ranks missing, their last op and
/// groups, which a peer's tests and users read whole (200 bytes cut such texts mid-word).
const MAX_REASON: usize = 600;
/// The longest datagram: the header, the longest status and failure, the sender's count, the
/// tag (under 1,200 bytes: one unfragmented datagram on any path).
pub(super) const MAX_LEN: usize =
    HEADER_LEN + STATUS_LEN + MAX_ACTIVITY + 2 + MAX_REASON + 8 + TAG_LEN;
/// How a failure learnt from a heartbeat says so.
const LEARNT: &str = "learnt from its heartbeat";
/// The HMAC label of heartbeats (apart from the connection handshakes').
const LABEL: &[u8] = b"rustdist heartbeat v1";

/// Who this rank is, for the datagrams it sends and accepts.
#[derive(Debug, Clone, Copy)]
pub struct Identity {
    pub job: u64,
    pub group: u32,
    pub rank: usize,
    pub size: usize,
}

/// What a rank says in each datagram besides who it is.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Said {
    /// The id of the group its heartbeats serve now (the first one's until a shrink).
    pub(super) served: u32,
    /// That group has failed on it (a timeout, a dead peer, an abort): it has failed on every
    /// rank then, and the ones that are elsewhere learn it here (see `beat`). The class of
    /// its error ([`abort_class`]), so that they fail with the same kind of error.
    pub(super) failed: Option<u8>,
    pub(super) status: Status,
    /// Why it failed (the start of its error), when it has.
    pub(super) reason: String,
}

impl Said {
    /// What a rank serving group `served`, with `status`, says after `failure` (if any).
    pub(super) fn new(served: u32, status: Status, failure: Option<&Error>) -> Said {
        Said {
            served,
            failed: failure.map(abort_class),
            status,
            reason: failure.map(|e| e.to_string()).unwrap_or_default(),
        }
    }

    /// The error a rank that learns of this failure fails with: the same class, the sender
    /// named as `who`.
    pub(super) fn learnt_failure(&self, who: &str) -> Option<Error> {
        let class = self.failed?;
        // Passed on as it came: each hop of the spread would otherwise wrap it again.
        let text = if relayed(&self.reason) {
            self.reason.clone()
        } else {
            format!(
                "{who} failed: {} ({LEARNT} while this rank was not in the group's \
                 operations; the group is failed on every rank)",
                self.reason
            )
        };
        Some(error_from_abort(class, text))
    }
}

/// Whether `reason` is a failure a rank learnt from a heartbeat ("rank 7 failed: ..."; the
/// datagram may have cut off the words that say so).
fn relayed(reason: &str) -> bool {
    let named = reason
        .strip_prefix("rank ")
        .and_then(|r| r.split_once(" failed: "))
        .is_some_and(|(who, _)| !who.is_empty() && who.bytes().all(|b| b.is_ascii_digit()));
    named || reason.contains(LEARNT)
}

/// `text` cut to at most `max` bytes, on a character boundary.
pub(super) fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Rank `id`'s datagram of `kind` saying `said`; signed with `key` (with the sender's `count`)
/// when set.
pub(super) fn encode(
    kind: u32,
    id: &Identity,
    said: &Said,
    key: Option<&AuthKey>,
    count: u64,
) -> Vec<u8> {
    let status = &said.status;
    let text = cut(&status.activity, MAX_ACTIVITY).as_bytes();
    let reason = cut(&said.reason, MAX_REASON).as_bytes();
    let mut b = Vec::with_capacity(MAX_LEN);
    b.extend_from_slice(&MAGIC.to_le_bytes());
    b.extend_from_slice(&kind.to_le_bytes());
    b.extend_from_slice(&id.job.to_le_bytes());
    b.extend_from_slice(&id.group.to_le_bytes());
    b.extend_from_slice(&(id.rank as u32).to_le_bytes());
    b.extend_from_slice(&said.served.to_le_bytes());
    b.push(said.failed.unwrap_or(0));
    b.extend_from_slice(&status.entered.to_le_bytes());
    b.extend_from_slice(&status.age_ms.to_le_bytes());
    b.extend_from_slice(&(text.len() as u16).to_le_bytes());
    b.extend_from_slice(text);
    b.extend_from_slice(&(reason.len() as u16).to_le_bytes());
    b.extend_from_slice(reason);
    if let Some(key) = key {
        b.extend_from_slice(&count.to_le_bytes());
        let tag = key.tag(LABEL, &[&b]);
        b.extend_from_slice(&tag);
    }
    b
}

/// A datagram of this job and group from a peer.
#[derive(Debug, PartialEq)]
pub(super) struct Datagram {
    pub(super) kind: u32,
    pub(super) rank: usize,
    /// The sender's count (0 unsigned).
    pub(super) count: u64,
    pub(super) said: Said,
}

/// The datagram in `b` when it is one of this job and group, its tag checked under `key` when
/// set; `None` for anything else.
pub(super) fn decode(b: &[u8], id: &Identity, key: Option<&AuthKey>) -> Option<Datagram> {
    let u64_at = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
    let word = |i: usize| Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?));
    let len_at = |i: usize| Some(u16::from_le_bytes(b.get(i..i + 2)?.try_into().ok()?) as usize);
    let at = HEADER_LEN + STATUS_LEN;
    let text_end = at + len_at(at - 2)?;
    let plain = text_end + 2 + len_at(text_end)?;
    let count = match key {
        None if b.len() == plain => 0,
        Some(key) if b.len() == plain + 8 + TAG_LEN => {
            let (signed, tag) = b.split_at(plain + 8);
            if !key.verify(LABEL, &[signed], tag) {
                return None;
            }
            u64_at(plain)?
        }
        _ => return None,
    };
    let rank = word(20)? as usize;
    let kind = word(4)?;
    let ours = word(0)? == MAGIC
        && u64_at(8)? == id.job
        && word(16)? == id.group
        && rank < id.size
        && rank != id.rank
        && (kind == BEAT || kind == GOODBYE || kind == ASK);
    if !ours {
        return None;
    }
    Some(Datagram {
        kind,
        rank,
        count,
        said: Said {
            served: word(HEADER_LEN)?,
            failed: Some(*b.get(HEADER_LEN + 4)?).filter(|&c| c != 0),
            status: Status {
                entered: u64_at(HEADER_LEN + 5)?,
                age_ms: u64_at(HEADER_LEN + 13)?,
                activity: String::from_utf8_lossy(&b[at..text_end]).into_owned(),
            },
            reason: String::from_utf8_lossy(&b[text_end + 2..plain]).into_owned(),
        },
    })
}
