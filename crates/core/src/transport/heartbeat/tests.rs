use super::wire::*;
use super::*;
use crate::recorder::MAX_ACTIVITY;

fn id(rank: usize) -> Identity {
    Identity {
        job: 7,
        group: 3,
        rank,
        size: 2,
    }
}

fn status() -> Status {
    Status {
        entered: 41,
        activity: "broadcast #17 of group 'tp' (started)".into(),
        age_ms: 1500,
    }
}

fn said() -> Said {
    Said {
        served: 3,
        failed: None,
        status: status(),
        reason: String::new(),
    }
}

fn beat_from(rank: usize, count: u64) -> Option<Datagram> {
    Some(Datagram {
        kind: BEAT,
        rank,
        count,
        said: said(),
    })
}

#[test]
fn datagrams_carry_the_sender_s_status() {
    let b = encode(BEAT, &id(1), &said(), None, 0);
    assert_eq!(decode(&b, &id(0), None), beat_from(1, 0));
    let failed = Said {
        served: 9,
        failed: Some(2),
        reason: "rank 0: all_reduce (collective #4) Timed out".into(),
        ..said()
    };
    let got = decode(&encode(BEAT, &id(1), &failed, None, 0), &id(0), None).unwrap();
    assert_eq!(got.said, failed);
    let long = Said {
        status: Status {
            activity: "x".repeat(MAX_ACTIVITY + 50),
            ..status()
        },
        ..said()
    };
    let got = decode(&encode(BEAT, &id(1), &long, None, 0), &id(0), None).unwrap();
    let kept = got.said.status.activity.len();
    assert_eq!(kept, MAX_ACTIVITY, "cut to the longest kept");
}

#[test]
fn datagrams_of_other_jobs_groups_and_ranks_are_ignored() {
    let b = encode(BEAT, &id(1), &said(), None, 0);
    assert_eq!(decode(&b, &id(0), None), beat_from(1, 0));
    assert_eq!(decode(&b, &id(1), None), None, "from itself");
    assert_eq!(decode(&b[..23], &id(0), None), None, "short");
    assert_eq!(decode(&b[..b.len() - 1], &id(0), None), None, "text cut");
    let other_job = Identity { job: 8, ..id(0) };
    assert_eq!(decode(&b, &other_job, None), None);
    let other_group = Identity { group: 4, ..id(0) };
    assert_eq!(decode(&b, &other_group, None), None);
    let mut bad = b.clone();
    bad[20] = 9;
    assert_eq!(decode(&bad, &id(0), None), None, "rank out of range");
    bad = b;
    bad[4] = 9;
    assert_eq!(decode(&bad, &id(0), None), None, "unknown kind");
}

#[test]
fn under_a_key_only_datagrams_signed_with_it_count() {
    let key = AuthKey::new(b"secret").unwrap();
    let other = AuthKey::new(b"other").unwrap();
    let signed = encode(BEAT, &id(1), &said(), Some(&key), 7);
    assert_eq!(decode(&signed, &id(0), Some(&key)), beat_from(1, 7));
    assert_eq!(decode(&signed, &id(0), Some(&other)), None, "another key");
    let plain = encode(BEAT, &id(1), &said(), None, 0);
    assert_eq!(decode(&plain, &id(0), Some(&key)), None, "unsigned");
    assert_eq!(
        decode(&signed, &id(0), None),
        None,
        "signed without a key here"
    );
    // The header, the status and its text are all covered by the tag.
    for i in [4, 20, 24, 28, 34, 45, signed.len() - 1] {
        let mut bad = signed.clone();
        bad[i] ^= 1;
        assert_eq!(decode(&bad, &id(0), Some(&key)), None, "byte {i} changed");
    }
}

const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

fn udp() -> UdpSocket {
    UdpSocket::bind((LOCAL, 0)).unwrap()
}

/// Rank 1 of a pair beating to `lower`, rank 0's socket.
fn upper(
    lower: SocketAddr,
    config: HeartbeatConfig,
    key: Option<AuthKey>,
) -> (Heartbeat, Arc<Cancel>) {
    let cancel = Arc::new(Cancel::default());
    let beat = Heartbeat::start(
        udp(),
        id(1),
        &[Some(LOCAL), None],
        &[Some(lower), None],
        config,
        key,
        cancel.clone(),
    )
    .unwrap();
    (beat, cancel)
}

/// Rank 0 of a pair on `sock`, learning rank 1's address from its datagrams.
fn lower(
    sock: UdpSocket,
    config: HeartbeatConfig,
    key: Option<AuthKey>,
) -> (Heartbeat, Arc<Cancel>) {
    let cancel = Arc::new(Cancel::default());
    let beat = Heartbeat::start(
        sock,
        id(0),
        &[None, Some(LOCAL)],
        &[None, None],
        config,
        key,
        cancel.clone(),
    )
    .unwrap();
    (beat, cancel)
}

fn raised_within(c: &Cancel, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if c.is_raised() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

const FAST: HeartbeatConfig = HeartbeatConfig {
    interval: Duration::from_millis(50),
    misses: 4,
};

#[test]
fn beating_peers_stay_up_and_a_departed_one_is_not_blamed() {
    let sock = udp();
    let (up, up_cancel) = upper(sock.local_addr().unwrap(), FAST, None);
    let (_low, low_cancel) = lower(sock, FAST, None);
    // Both beat (rank 0 learns rank 1's address): no failure over many silence windows.
    assert!(!raised_within(&low_cancel, FAST.interval * 16));
    assert!(!up_cancel.is_raised());
    // Rank 1 leaves with a goodbye: rank 0 does not fail.
    drop(up);
    assert!(!raised_within(&low_cancel, FAST.interval * 16));
}

#[test]
fn each_rank_knows_what_its_peers_last_said() {
    let sock = udp();
    let (up, _) = upper(sock.local_addr().unwrap(), FAST, None);
    let (low, _) = lower(sock, FAST, None);
    let end = Instant::now() + Duration::from_secs(5);
    while (low.peer_status(1).is_none() || up.peer_status(0).is_none()) && Instant::now() < end {
        std::thread::sleep(FAST.interval);
    }
    let heard = low.peer_status(1).expect("rank 0 heard rank 1's status");
    // Neither rank has an operation in this group's recorder (group 3 has none here).
    assert_eq!(heard.entered, 0);
    assert!(up.peer_status(0).is_some());
    assert!(low.peer_status(0).is_none(), "no status of itself");
}

#[test]
fn a_group_failed_on_a_peer_fails_here_unless_a_shrink_replaced_it() {
    let sock = udp();
    let (_up, up_cancel) = upper(sock.local_addr().unwrap(), FAST, None);
    let (_low, low_cancel) = lower(sock, FAST, None);
    up_cancel.raise(Error::backend("timed out"));
    assert!(raised_within(&low_cancel, FAST.interval * 20));
    let msg = low_cancel.check().unwrap_err().to_string();
    assert!(
        msg.contains("rank 1 failed: timed out (learnt from its heartbeat"),
        "{msg}"
    );

    // Rank 1 shrank to a new group; its old group's failure no longer counts.
    let sock = udp();
    let (up, up_cancel) = upper(sock.local_addr().unwrap(), FAST, None);
    let (low, low_cancel) = lower(sock, FAST, None);
    up_cancel.raise(Error::backend("failed before the shrink"));
    let fresh = Arc::new(Cancel::default());
    low.shrink(&[0, 1], 4, fresh.clone());
    assert!(!raised_within(&fresh, FAST.interval * 16));
    drop((up, low_cancel));
}

#[test]
fn a_shrink_stops_watching_the_ranks_it_leaves_out() {
    let frozen = udp();
    let (up, old_cancel) = upper(frozen.local_addr().unwrap(), FAST, None);
    // Rank 0 never beats; rank 1 shrinks the group to itself before the silence counts.
    let cancel = Arc::new(Cancel::default());
    up.shrink(&[1], 3, cancel.clone());
    assert!(!raised_within(&cancel, FAST.interval * 20));
    assert!(!old_cancel.is_raised());
}

#[test]
fn a_peer_that_never_beats_fails_the_group_naming_it() {
    let frozen = udp();
    let (_up, cancel) = upper(frozen.local_addr().unwrap(), FAST, None);
    assert!(raised_within(&cancel, FAST.interval * 20));
    let msg = cancel.check().unwrap_err().to_string();
    assert!(
        msg.contains("rank 0 (host 127.0.0.1) has been silent"),
        "{msg}"
    );
    // Rank 1 beat to rank 0 all along.
    let mut buf = [0u8; MAX_LEN];
    frozen
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let (n, _) = frozen.recv_from(&mut buf).unwrap();
    let got = decode(&buf[..n], &id(0), None).unwrap();
    assert_eq!((got.kind, got.rank, got.count), (BEAT, 1, 0));
}

#[test]
fn under_a_key_signed_peers_stay_up_and_replayed_or_unsigned_beats_do_not_help() {
    let key = AuthKey::new(b"secret");
    let sock = udp();
    let (_up, up_cancel) = upper(sock.local_addr().unwrap(), FAST, key.clone());
    let (_low, low_cancel) = lower(sock, FAST, key.clone());
    assert!(!raised_within(&low_cancel, FAST.interval * 16));
    assert!(!up_cancel.is_raised());

    // A silent rank 0: an attacker replays one of its genuine beats and sends unsigned
    // ones to rank 1 all along, which still names rank 0.
    let frozen = udp();
    let (_up, cancel) = upper(frozen.local_addr().unwrap(), FAST, key.clone());
    let genuine = encode(BEAT, &id(0), &said(), key.as_ref(), 1);
    let attacker = udp();
    frozen
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let mut buf = [0u8; MAX_LEN];
    let (_, rank1) = frozen.recv_from(&mut buf).unwrap();
    let end = Instant::now() + FAST.interval * 20;
    while Instant::now() < end && !cancel.is_raised() {
        let _ = attacker.send_to(&genuine, rank1);
        let _ = attacker.send_to(&encode(BEAT, &id(0), &said(), None, 0), rank1);
        std::thread::sleep(FAST.interval / 2);
    }
    // Sent from the attacker's socket on 127.0.0.1 like rank 0's: only the count and the
    // tag keep them out (the first replay is accepted once, then never again).
    assert!(raised_within(&cancel, FAST.interval * 20));
}

#[test]
fn a_failure_passed_on_is_not_wrapped_again() {
    let origin = Said {
        failed: Some(1),
        reason: "rank 5 (host 10.0.0.2) has been silent for 5.0 s".into(),
        ..said()
    };
    let first = origin.learnt_failure("rank 4").unwrap().to_string();
    assert!(first.starts_with("rank 4 failed: rank 5 (host 10.0.0.2) has been silent"));
    let relayed = Said {
        failed: Some(1),
        reason: cut(&first, MAX_ACTIVITY).to_string(),
        ..said()
    };
    let second = relayed.learnt_failure("rank 9").unwrap();
    assert!(matches!(&second, Error::Network(m) if m.starts_with("rank 4 failed: rank 5")));
}

#[test]
fn a_timeout_text_travels_whole() {
    // What a timeout says on 4 ranks (215 bytes), which the 200 bytes once carried cut inside
    // "(completed)": the peers could not tell which op was last.
    let reason = "rank 0: all_reduce (collective #4) Timed out waiting for rank(s) 2: rank 2 has \
                  not entered all_reduce #4 of group 'default_pg'; its last op is all_reduce #3 \
                  of group 'default_pg' (completed), issued 4.1 s ago";
    let key = AuthKey::new(b"secret");
    for key in [None, key.as_ref()] {
        let sent = Said {
            failed: Some(1),
            reason: reason.into(),
            ..said()
        };
        let bytes = encode(BEAT, &id(0), &sent, key, 1);
        assert!(bytes.len() <= MAX_LEN && MAX_LEN < 1200);
        let got = decode(&bytes, &id(1), key).unwrap();
        assert_eq!(got.said.reason, reason);
    }
}
