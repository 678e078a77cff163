//! Connection setup under hostile input: fake peers with a wrong magic, job, group, size or
//! rank, duplicates, silent and half-sent connections, wrong or missing auth keys; each is
//! refused while the real ranks (threads over a HashStore) form the mesh. Plus interface
//! selection.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::connect::peer_entries;
use super::handshake::STATUSES;
use super::socket::{configure, HOST_LOCAL_SEND_BUFFER_BYTES};
use super::*;
use crate::auth::{AuthKey, NONCE_LEN, TAG_LEN};
use crate::error::{Error, Result};
use crate::netio::timed_out;
use crate::store::{HashStore, Store};
use crate::testutil::{assert_memory_flat, closed_by_peer, ran_in_child};

const GROUP: u32 = 7;

type Mesh = Result<Vec<Option<TcpStream>>>;

fn spawn_rank(
    store: &Arc<HashStore>,
    prefix: &str,
    rank: usize,
    size: usize,
    key: Option<&[u8]>,
) -> JoinHandle<Mesh> {
    let (store, prefix) = (Arc::clone(store), prefix.to_owned());
    let key = key.and_then(AuthKey::new);
    thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(60);
        connect_mesh_with(
            &*store,
            &prefix,
            rank,
            size,
            GROUP,
            deadline,
            key.as_ref(),
            Ok(None),
            &|_| true,
        )
        .map(|m| m.socks)
    })
}

/// Rank 0's listening address and the job id, once published.
fn rank0(store: &HashStore, prefix: &str) -> (SocketAddr, u64) {
    let entry = peer_entries(
        store,
        prefix,
        &[0],
        Instant::now() + Duration::from_secs(20),
    )
    .unwrap()
    .remove(0);
    (entry.addr, entry.job)
}

fn hello(job: u64, group: u32, size: u32, rank: u64) -> [u8; HELLO_LEN] {
    hello_stream(job, group, size, rank, 0)
}

fn hello_stream(job: u64, group: u32, size: u32, rank: u64, stream: u32) -> [u8; HELLO_LEN] {
    Hello {
        job,
        group,
        size,
        rank,
        stream,
        auth: false,
        nonce: [0; NONCE_LEN],
    }
    .encode()
}

fn dial(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// Sends `bytes` as a fake peer; the reply, or `None` when the acceptor closed without one.
fn fake(addr: SocketAddr, bytes: &[u8]) -> (TcpStream, Option<Reply>) {
    let mut s = dial(addr);
    s.write_all(bytes).unwrap();
    let mut b = [0u8; REPLY_LEN];
    let reply = s.read_exact(&mut b).ok().and_then(|()| Reply::decode(&b));
    (s, reply)
}

fn status(addr: SocketAddr, bytes: &[u8]) -> Option<Status> {
    let (mut s, reply) = fake(addr, bytes);
    if let Some(r) = reply {
        if r.status != Status::Ok && r.status != Status::Challenge {
            assert!(closed_by_peer(&mut s), "refused connections are closed");
        }
    }
    reply.map(|r| r.status)
}

/// Every rank of `meshes` holds a working socket to every other: a byte sent by rank a on its
/// socket to b arrives on b's socket to a.
fn assert_connected(meshes: &mut [Vec<Option<TcpStream>>]) {
    let mark = |a: usize, b: usize| (a * 16 + b) as u8;
    for (a, mesh) in meshes.iter_mut().enumerate() {
        assert!(mesh[a].is_none(), "no socket to itself");
        for (b, sock) in mesh.iter_mut().enumerate().filter(|(b, _)| *b != a) {
            sock.as_mut().unwrap().write_all(&[mark(a, b)]).unwrap();
        }
    }
    for (b, mesh) in meshes.iter_mut().enumerate() {
        for (a, sock) in mesh.iter_mut().enumerate().filter(|(a, _)| *a != b) {
            let rx = sock.as_mut().unwrap();
            rx.set_nonblocking(false).unwrap();
            rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut got = [0u8; 1];
            rx.read_exact(&mut got).unwrap();
            assert_eq!(got[0], mark(a, b), "rank {b} from {a}");
        }
    }
}

#[test]
fn tcp_mesh_forms_despite_hostile_connections() {
    let store = Arc::new(HashStore::new());
    let p = "hostile";
    let r0 = spawn_rank(&store, p, 0, 3, None);
    let (addr, job) = rank0(&store, p);
    // Silent and half-sent connections stay open meanwhile: they must not hold anyone up.
    let silent = dial(addr);
    let mut half = dial(addr);
    half.write_all(&hello(job, GROUP, 3, 1)[..20]).unwrap();
    let mut garbage = [0xa5u8; HELLO_LEN];
    garbage[..4].copy_from_slice(b"GET ");
    assert_eq!(
        status(addr, &garbage),
        None,
        "wrong magic: dropped unanswered"
    );
    let mut old = hello(job, GROUP, 3, 1);
    old[4] = 9;
    assert_eq!(status(addr, &old), None, "unknown version");
    assert_eq!(
        status(addr, &hello(job ^ 1, GROUP, 3, 1)),
        Some(Status::WrongJob)
    );
    assert_eq!(
        status(addr, &hello(job, GROUP + 1, 3, 1)),
        Some(Status::WrongGroup)
    );
    assert_eq!(
        status(addr, &hello(job, GROUP, 4, 1)),
        Some(Status::WrongSize)
    );
    assert_eq!(
        status(addr, &hello(job, GROUP, 3, 3)),
        Some(Status::BadRank)
    );
    assert_eq!(
        status(addr, &hello(job, GROUP, 3, u64::MAX)),
        Some(Status::BadRank)
    );
    assert_eq!(
        status(addr, &hello(job, GROUP, 3, 0)),
        Some(Status::BadRank),
        "itself"
    );
    assert_eq!(
        status(addr, &hello_stream(job, GROUP, 3, 1, 1)),
        Some(Status::BadRank),
        "an extra stream before the first connections are made"
    );
    // An auth hello to a rank without a key.
    let mut authed = hello(job, GROUP, 3, 1);
    authed[6] = 1;
    assert_eq!(status(addr, &authed), Some(Status::AuthUnexpected));
    let r1 = spawn_rank(&store, p, 1, 3, None);
    let r2 = spawn_rank(&store, p, 2, 3, None);
    let mut meshes: Vec<_> = [r0, r1, r2]
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    assert_connected(&mut meshes);
    drop((silent, half));
}

#[test]
fn tcp_duplicate_rank_is_refused() {
    let store = Arc::new(HashStore::new());
    let p = "dup";
    let r0 = spawn_rank(&store, p, 0, 3, None);
    let (addr, job) = rank0(&store, p);
    // The fakes' addresses (rank 0 reads them once its peers are in).
    for fake_rank in [1, 2] {
        store
            .set(
                &format!("{p}/addr/{fake_rank}"),
                format!("{addr} {job:016x}").as_bytes(),
            )
            .unwrap();
    }
    let (mut first, reply) = fake(addr, &hello(job, GROUP, 3, 1));
    assert_eq!(reply.map(|r| r.status), Some(Status::Ok));
    assert_eq!(
        status(addr, &hello(job, GROUP, 3, 1)),
        Some(Status::Duplicate)
    );
    let (_third, reply) = fake(addr, &hello(job, GROUP, 3, 2));
    assert_eq!(reply.map(|r| r.status), Some(Status::Ok));
    let mut mesh = r0.join().unwrap().unwrap();
    // The first claimant holds rank 1's slot.
    first.write_all(b"x").unwrap();
    let rx = mesh[1].as_mut().unwrap();
    rx.set_nonblocking(false).unwrap();
    let mut got = [0u8; 1];
    rx.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"x");
}

fn auth_error(h: JoinHandle<Mesh>) -> String {
    match h.join().unwrap() {
        Err(Error::Network(msg)) => msg,
        other => panic!("expected a network error, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn tcp_auth_key_is_required_and_checked_both_ways() {
    let store = Arc::new(HashStore::new());
    let p = "auth";
    let r0 = spawn_rank(&store, p, 0, 2, Some(b"right"));
    let (addr, job) = rank0(&store, p);
    // No key: refused, and told why.
    let msg = auth_error(spawn_rank(&store, p, 1, 2, None));
    assert!(
        msg.contains("authentication failed") && msg.contains("RUSTDIST_AUTH_KEY"),
        "{msg}"
    );
    assert!(msg.contains("not set here"), "{msg}");
    // A wrong key: refused.
    let msg = auth_error(spawn_rank(&store, p, 1, 2, Some(b"wrong")));
    assert!(
        msg.contains("authentication failed") && msg.contains("RUSTDIST_AUTH_KEY"),
        "{msg}"
    );
    // A fake that answers the challenge with garbage.
    let mut h = hello(job, GROUP, 2, 1);
    h[6] = 1;
    let (mut s, reply) = fake(addr, &h);
    assert_eq!(reply.map(|r| r.status), Some(Status::Challenge));
    s.write_all(&[0u8; TAG_LEN]).unwrap();
    let mut b = [0u8; REPLY_LEN];
    s.read_exact(&mut b).unwrap();
    assert_eq!(
        Reply::decode(&b).map(|r| r.status),
        Some(Status::AuthFailed)
    );
    assert!(closed_by_peer(&mut s));
    // The right key: the group forms.
    let r1 = spawn_rank(&store, p, 1, 2, Some(b"right"));
    let mut meshes = vec![r0.join().unwrap().unwrap(), r1.join().unwrap().unwrap()];
    assert_connected(&mut meshes);
}

#[test]
fn tcp_auth_key_on_one_side_only() {
    let store = Arc::new(HashStore::new());
    let p = "one-sided";
    let r0 = spawn_rank(&store, p, 0, 2, None);
    let msg = auth_error(spawn_rank(&store, p, 1, 2, Some(b"k")));
    assert!(
        msg.contains("RUSTDIST_AUTH_KEY is set here but not there"),
        "{msg}"
    );
    let r1 = spawn_rank(&store, p, 1, 2, None);
    r0.join().unwrap().unwrap();
    r1.join().unwrap().unwrap();
}

#[test]
fn tcp_stale_address_of_another_job_is_named() {
    let store = Arc::new(HashStore::new());
    let _r0 = spawn_rank(&store, "stale", 0, 3, None);
    rank0(&store, "stale");
    // Rank 1's entry is left over from another run.
    store
        .set("stale/addr/1", b"127.0.0.1:9 00000000000000bb")
        .unwrap();
    let err = spawn_rank(&store, "stale", 2, 3, None)
        .join()
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(&err, Error::Network(m) if m.contains("another job")),
        "{err:?}"
    );
}

/// Runs itself in a child process: thousands of bad connections leave rank 0's memory flat,
/// and the group still forms after them.
#[test]
fn tcp_memory_flat_over_bad_peer_connections() {
    if ran_in_child("transport::tcp::tests::tcp_memory_flat_over_bad_peer_connections") {
        return;
    }
    let store = Arc::new(HashStore::new());
    let p = "flood";
    let r0 = spawn_rank(&store, p, 0, 2, Some(b"k"));
    let (addr, job) = rank0(&store, p);
    let mut authed = hello(job, GROUP, 2, 1);
    authed[6] = 1;
    let bad: [Vec<u8>; 5] = [
        vec![0xffu8; HELLO_LEN],              // wrong magic
        hello(job ^ 1, GROUP, 2, 1).to_vec(), // wrong job
        hello(job, GROUP, 2, 5).to_vec(),     // rank out of range
        hello(job, GROUP, 2, 1).to_vec(),     // no key
        authed[..40].to_vec(),                // half a hello, then gone
    ];
    let hit = |n: usize| {
        for i in 0..n {
            let mut s = dial(addr);
            s.write_all(&bad[i % bad.len()]).unwrap();
            if i % bad.len() == 4 {
                continue; // hangs up mid-hello
            }
            let mut reply = [0u8; REPLY_LEN];
            let _ = s.read(&mut reply);
            assert!(closed_by_peer(&mut s), "connection {i} stays open");
        }
    };
    assert_memory_flat(5_000, "bad peer connections", hit);
    let r1 = spawn_rank(&store, p, 1, 2, Some(b"k"));
    let mut meshes = vec![r0.join().unwrap().unwrap(), r1.join().unwrap().unwrap()];
    assert_connected(&mut meshes);
}

#[test]
fn tcp_handshake_messages_round_trip() {
    let h = Hello {
        job: 0x0123_4567_89ab_cdef,
        group: 9,
        size: 4,
        rank: 3,
        stream: 5,
        auth: true,
        nonce: [7; NONCE_LEN],
    };
    assert_eq!(Hello::decode(&h.encode()), Some(h));
    let r = Reply {
        status: Status::Challenge,
        nonce: [1; NONCE_LEN],
        tag: [2; TAG_LEN],
    };
    assert_eq!(Reply::decode(&r.encode()), Some(r));
    for s in STATUSES {
        assert_eq!(
            Reply::decode(&Reply::plain(s).encode()).map(|r| r.status),
            Some(s)
        );
    }
    let mut bad = r.encode();
    bad[4] = 200;
    assert_eq!(Reply::decode(&bad), None, "unknown status");
    assert_eq!(Hello::decode(&[0; HELLO_LEN]), None);
}

#[test]
fn tcp_interface_selection_follows_nccl_syntax() {
    let ifs: Vec<Interface> = [
        ("lo", [127, 0, 0, 1]),
        ("eth0", [10, 77, 0, 1]),
        ("eth1", [10, 78, 0, 1]),
        ("eth10", [10, 79, 0, 1]),
    ]
    .into_iter()
    .map(|(n, ip)| Interface {
        name: n.into(),
        ip: ip.into(),
    })
    .collect();
    let pick = |spec: &str| select_interface("RUSTDIST_SOCKET_IFNAME", spec, &ifs).map(|i| i.name);
    assert_eq!(pick("eth1").unwrap(), "eth1", "prefix");
    assert_eq!(pick("eth").unwrap(), "eth0", "prefix: the first match");
    assert_eq!(pick("=eth1").unwrap(), "eth1", "exact");
    assert_eq!(
        pick("wlan,eth1, eth0").unwrap(),
        "eth1",
        "the list's first entry that matches"
    );
    assert_eq!(
        pick("^eth0").unwrap(),
        "eth1",
        "exclusion: loopback comes last"
    );
    assert_eq!(
        pick("^eth").unwrap(),
        "lo",
        "exclusion: loopback when nothing else is left"
    );
    assert_eq!(pick("^=eth1,lo,eth0").unwrap(), "eth10", "exact exclusion");
    assert!(pick("=eth").is_err(), "exact needs the whole name");
    let err = pick("wlan").unwrap_err().to_string();
    assert!(err.contains("RUSTDIST_SOCKET_IFNAME=\"wlan\""), "{err}");
    assert!(
        err.contains("eth0 (10.77.0.1)") && err.contains("lo (127.0.0.1)"),
        "{err}"
    );
    let err = select_interface("GLOO_SOCKET_IFNAME", "x", &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("GLOO_SOCKET_IFNAME") && err.contains("available: none"),
        "{err}"
    );
    // This machine's own list has loopback.
    assert!(interfaces().unwrap().iter().any(|i| i.ip.is_loopback()));
}

#[test]
fn every_rank_agrees_on_the_highest_ranks_latency() {
    let store = Arc::new(HashStore::new());
    let deadline = Instant::now() + Duration::from_secs(10);
    let handles: Vec<_> = (0..3)
        .map(|rank| {
            let store = store.clone();
            // Only the ranks that connected to lower ones measured a round trip.
            let round_trip = (rank > 0).then(|| Duration::from_micros(100 * rank as u64));
            std::thread::spawn(move || {
                agree_latency(&*store, "lat", rank, 3, round_trip, deadline).unwrap()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), Some(Duration::from_micros(100)));
    }
    assert_eq!(
        agree_latency(&*store, "alone", 0, 1, None, deadline).unwrap(),
        None
    );
}

/// A connected pair of non-blocking sockets; with `between_hosts`, their ends have different
/// addresses (127.0.0.1 and 127.0.0.2), as on two hosts.
fn socket_pair(between_hosts: bool) -> (TcpStream, TcpStream) {
    let ip = if between_hosts {
        "127.0.0.2"
    } else {
        "127.0.0.1"
    };
    let listener = TcpListener::bind((ip, 0)).unwrap();
    let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    for s in [&a, &b] {
        configure(s).unwrap();
    }
    (a, b)
}

/// Runs `agree_links` on every rank of `socks` (by rank) in threads, asking for `streams`
/// streams (and checking the window it is told); then checks that each link's stream holds
/// nothing more (the probe was read to its end).
fn agreed_links(socks: Vec<Vec<Option<TcpStream>>>, streams: usize) -> Vec<LinkAgreement> {
    let store = Arc::new(HashStore::new());
    let size = socks.len();
    let handles: Vec<_> = socks
        .into_iter()
        .enumerate()
        .map(|(rank, socks)| {
            let store = store.clone();
            thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(20);
                let policy = |rate: Option<u64>, window: u64| {
                    assert!(rate.is_some_and(|r| r > 0), "rate {rate:?}");
                    assert_eq!(window, stream_window());
                    Ok(streams)
                };
                let spans = socks.iter().flatten().any(super::socket::between_hosts);
                let agreed =
                    agree_links(&*store, "bw", rank, size, &socks, spans, deadline, &policy);
                (agreed.unwrap(), socks)
            })
        })
        .collect();
    let done: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for s in done.iter().flat_map(|(_, socks)| socks.iter().flatten()) {
        let err = (&*s).read(&mut [0u8; 1]).unwrap_err();
        assert!(timed_out(&err), "bytes left on the link: {err}");
    }
    done.into_iter().map(|(agreed, _)| agreed).collect()
}

#[test]
fn links_between_hosts_are_timed_and_every_rank_agrees_on_the_slowest() {
    // Two ranks on two hosts.
    let (a, b) = socket_pair(true);
    let agreed = agreed_links(vec![vec![None, Some(a)], vec![Some(b), None]], 3);
    assert!(agreed[0].bandwidth.is_some_and(|r| r > 0), "{agreed:?}");
    assert_eq!(agreed[0].streams, 3);
    assert_eq!(agreed[0], agreed[1]);
    // Ranks 0 and 1 on one host, rank 2 on another: only 1 -> 2 and 2 -> 0 are timed.
    let (s01, s10) = socket_pair(false);
    let (s12, s21) = socket_pair(true);
    let (s20, s02) = socket_pair(true);
    let agreed = agreed_links(
        vec![
            vec![None, Some(s01), Some(s02)],
            vec![Some(s10), None, Some(s12)],
            vec![Some(s20), Some(s21), None],
        ],
        2,
    );
    assert!(agreed[0].bandwidth.is_some_and(|r| r > 0), "{agreed:?}");
    assert!(agreed.iter().all(|a| *a == agreed[0]), "{agreed:?}");
    assert_eq!(agreed[0].streams, 2);
}

#[test]
fn links_on_one_host_are_not_timed() {
    let (a, b) = socket_pair(false);
    let one = LinkAgreement {
        bandwidth: None,
        streams: 1,
    };
    // The policy is not asked (it would say 4): one host needs one stream.
    assert_eq!(
        agreed_links(vec![vec![None, Some(a)], vec![Some(b), None]], 4),
        [one, one]
    );
}

#[test]
fn connections_on_one_host_get_a_small_send_buffer_and_others_the_kernels() {
    let send_buffer = |s: &TcpStream| socket2::SockRef::from(s).send_buffer_size().unwrap();
    let kernels = {
        let listener = TcpListener::bind(("127.0.0.2", 0)).unwrap();
        let plain = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        send_buffer(&plain)
    };
    let (a, b) = socket_pair(false);
    // Linux doubles what is asked, for its bookkeeping.
    for s in [&a, &b] {
        assert_eq!(send_buffer(s), 2 * HOST_LOCAL_SEND_BUFFER_BYTES);
    }
    assert_ne!(kernels, 2 * HOST_LOCAL_SEND_BUFFER_BYTES);
    let (c, d) = socket_pair(true);
    for s in [&c, &d] {
        assert_eq!(send_buffer(s), kernels);
    }
}

#[test]
fn the_stream_window_is_half_the_smaller_tcp_buffer() {
    let max = |name: &str| -> u64 {
        let t = std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}")).unwrap();
        t.split_whitespace().nth(2).unwrap().parse().unwrap()
    };
    assert_eq!(stream_window(), max("tcp_wmem").min(max("tcp_rmem")) / 2);
}
