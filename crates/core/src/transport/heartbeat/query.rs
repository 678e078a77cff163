//! The status query (`python -m rustdist.status`): anyone may ask a rank's heartbeat socket
//! what its process is doing, and its heartbeat thread answers with the state of every group
//! of the process (`recorder::snapshot`, as JSON) without the process pausing. A query
//! carries a random nonce that the answer repeats, so a client matches answers to its own
//! queries. Under `RUSTDIST_AUTH_KEY` only a query signed with the key is answered (a
//! stranger learns nothing) and the answer is signed too (nobody without the key can answer
//! for a rank).

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use crate::auth::{AuthKey, TAG_LEN};
use crate::error::{Error, Result};

const QUERY_MAGIC: u32 = 0x5244_5351; // "RDSQ"
const ANSWER_MAGIC: u32 = 0x5244_5341; // "RDSA"
const NONCE_LEN: usize = 16;
/// The HMAC label of status queries and answers (apart from the heartbeats').
const LABEL: &[u8] = b"rustdist status v1";
/// The largest answer a UDP datagram carries.
pub(super) const MAX_ANSWER: usize = 65_000;

pub(super) type Nonce = [u8; NONCE_LEN];

/// A query with `nonce`, signed with `key` when set.
fn encode_query(nonce: &Nonce, key: Option<&AuthKey>) -> Vec<u8> {
    let mut b = QUERY_MAGIC.to_le_bytes().to_vec();
    b.extend_from_slice(nonce);
    if let Some(key) = key {
        let tag = key.tag(LABEL, &[&b]);
        b.extend_from_slice(&tag);
    }
    b
}

/// The nonce of the query in `b` (checked under `key` when set); None for anything else.
pub(super) fn decode_query(b: &[u8], key: Option<&AuthKey>) -> Option<Nonce> {
    let plain = 4 + NONCE_LEN;
    if b.get(..4)? != QUERY_MAGIC.to_le_bytes() {
        return None;
    }
    match key {
        None if b.len() == plain => {}
        Some(key) if b.len() == plain + TAG_LEN => {
            let (signed, tag) = b.split_at(plain);
            if !key.verify(LABEL, &[signed], tag) {
                return None;
            }
        }
        _ => return None,
    }
    b[4..plain].try_into().ok()
}

/// The answer to the query with `nonce`: `body` (JSON), signed with `key` when set.
pub(super) fn encode_answer(nonce: &Nonce, body: &[u8], key: Option<&AuthKey>) -> Vec<u8> {
    let mut b = ANSWER_MAGIC.to_le_bytes().to_vec();
    b.extend_from_slice(nonce);
    b.extend_from_slice(body);
    if let Some(key) = key {
        let tag = key.tag(LABEL, &[&b]);
        b.extend_from_slice(&tag);
    }
    b
}

/// The body of the answer in `b` to the query with `nonce` (checked under `key` when set).
fn decode_answer<'a>(b: &'a [u8], nonce: &Nonce, key: Option<&AuthKey>) -> Option<&'a [u8]> {
    if b.get(..4)? != ANSWER_MAGIC.to_le_bytes() || b.get(4..4 + NONCE_LEN)? != nonce {
        return None;
    }
    let signed = match key {
        None => b,
        Some(key) => {
            let (signed, tag) = b.split_at(b.len().checked_sub(TAG_LEN)?);
            if !key.verify(LABEL, &[signed], tag) {
                return None;
            }
            signed
        }
    };
    signed.get(4 + NONCE_LEN..)
}

/// Asks every heartbeat socket at `addrs` for its process's state at once and returns each
/// answer's body (JSON) by position, None where none came within `within` (a dead process,
/// one whose heartbeats are off, or a lost datagram: each query is sent again every 100 ms
/// until answered).
pub fn ask_status(
    addrs: &[SocketAddr],
    key: Option<&AuthKey>,
    within: Duration,
) -> Result<Vec<Option<String>>> {
    let net = |e: std::io::Error| Error::network(format!("status query: {e}"));
    let any: SocketAddr = if addrs.iter().any(|a| a.is_ipv6()) {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    }
    .parse()
    .map_err(|e| Error::invalid(format!("{e}")))?;
    let sock = UdpSocket::bind(any).map_err(net)?;
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&crate::auth::nonce()?[..NONCE_LEN]);
    let query = encode_query(&nonce, key);
    let mut answers: Vec<Option<String>> = vec![None; addrs.len()];
    let mut by_addr: HashMap<SocketAddr, Vec<usize>> = HashMap::new();
    for (i, a) in addrs.iter().enumerate() {
        by_addr.entry(*a).or_default().push(i);
    }
    let deadline = Instant::now() + within;
    let mut buf = vec![0u8; MAX_ANSWER + 64];
    loop {
        for (i, a) in addrs.iter().enumerate() {
            if answers[i].is_none() {
                // A send that fails (no route yet) leaves the rank unanswered.
                let _ = sock.send_to(&query, a);
            }
        }
        let resend = (Instant::now() + Duration::from_millis(100)).min(deadline);
        while let Some(left) = resend.checked_duration_since(Instant::now()) {
            sock.set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .map_err(net)?;
            let Ok((n, from)) = sock.recv_from(&mut buf) else {
                break;
            };
            let Some(body) = decode_answer(&buf[..n], &nonce, key) else {
                continue;
            };
            for &i in by_addr.get(&from).into_iter().flatten() {
                answers[i] = Some(String::from_utf8_lossy(body).into_owned());
            }
            if answers.iter().all(Option::is_some) {
                return Ok(answers);
            }
        }
        if answers.iter().all(Option::is_some) || Instant::now() >= deadline {
            return Ok(answers);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_and_answers_round_trip_and_a_key_must_sign_both() {
        let nonce = [7u8; NONCE_LEN];
        let key = AuthKey::new(b"secret").expect("a key");
        let other = AuthKey::new(b"other").expect("a key");
        assert_eq!(decode_query(&encode_query(&nonce, None), None), Some(nonce));
        assert_eq!(decode_query(&encode_query(&nonce, None), Some(&key)), None);
        assert_eq!(
            decode_query(&encode_query(&nonce, Some(&key)), Some(&key)),
            Some(nonce)
        );
        assert_eq!(
            decode_query(&encode_query(&nonce, Some(&other)), Some(&key)),
            None
        );
        let answer = encode_answer(&nonce, b"{}", Some(&key));
        assert_eq!(decode_answer(&answer, &nonce, Some(&key)), Some(&b"{}"[..]));
        assert_eq!(decode_answer(&answer, &nonce, Some(&other)), None);
        assert_eq!(decode_answer(&answer, &[8u8; NONCE_LEN], Some(&key)), None);
        let plain = encode_answer(&nonce, b"{}", None);
        assert_eq!(decode_answer(&plain, &nonce, None), Some(&b"{}"[..]));
    }
}
