//! TCP store tests: the common conformance suite, server lifetime and options, and hostile
//! clients against the server.

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::protocol::{read_frame, Request, Response, MAX_FRAME};
use super::*;
use crate::auth::AuthKey;
use crate::store::hash::conformance;
use crate::testutil::{assert_memory_flat, closed_by_peer, ran_in_child, rss_bytes};

fn master(timeout: Duration) -> TcpStore {
    TcpStore::new(TcpStoreOptions {
        is_master: true,
        timeout,
        ..Default::default()
    })
    .unwrap()
}

fn client_of(port: u16, timeout: Duration) -> TcpStore {
    TcpStore::new(TcpStoreOptions {
        port,
        timeout,
        ..Default::default()
    })
    .unwrap()
}

fn keyed(key: &[u8]) -> Option<AuthKey> {
    AuthKey::new(key)
}

fn raw(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// A raw request/response exchange.
fn exchange(s: &mut TcpStream, req: &Request) -> Response {
    s.write_all(&req.encode()).unwrap();
    Response::decode(&read_frame(s, MAX_FRAME).unwrap().unwrap()).unwrap()
}

/// The server still answers a normal client promptly.
fn assert_serving(port: u16) {
    let t = Instant::now();
    let c = client_of(port, Duration::from_secs(10));
    c.set("alive", b"yes").unwrap();
    assert_eq!(c.get("alive", None).unwrap(), b"yes");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[test]
fn store_tcp_all_methods() {
    let m = master(Duration::from_secs(30));
    conformance::all_methods(&m);
    // A second client sees the same keys.
    let c = client_of(m.port(), Duration::from_secs(30));
    assert_eq!(c.get("a", None).unwrap(), b"hello world");
    assert_eq!(c.num_keys().unwrap(), 7, "no internal keys are counted");
    assert_eq!(m.host(), "127.0.0.1");
    assert!(m.port() != 0 && c.port() == m.port());
    assert!(m.server().is_some() && c.server().is_none());
}

#[test]
fn store_tcp_timeouts_and_wakeups() {
    let m = master(Duration::from_secs(30));
    conformance::timeouts(&m);
    let c: Arc<dyn Store> = Arc::new(client_of(m.port(), Duration::from_secs(30)));
    conformance::wakes_waiter(Arc::clone(&c));
    conformance::concurrent_adds(c);
}

#[test]
fn store_tcp_client_retries_until_master_starts() {
    let port = server::listen("127.0.0.1", 0)
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = thread::spawn(move || {
        TcpStore::new(TcpStoreOptions {
            port,
            timeout: Duration::from_secs(20),
            ..Default::default()
        })
    });
    // Whenever this runs, the client is either still retrying or (if it already gave up) the
    // test fails below.
    let m = TcpStore::new(TcpStoreOptions {
        port,
        is_master: true,
        ..Default::default()
    })
    .unwrap();
    let c = client.join().unwrap().unwrap();
    c.set("k", b"v").unwrap();
    assert_eq!(m.get("k", None).unwrap(), b"v");
}

#[test]
fn store_tcp_connect_timeout_is_network_error() {
    let port = server::listen("127.0.0.1", 0)
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = Instant::now();
    let err = TcpStore::new(TcpStoreOptions {
        port,
        timeout: Duration::from_millis(300),
        ..Default::default()
    })
    .err()
    .unwrap();
    assert!(
        matches!(&err, Error::Network(m) if m.contains(&port.to_string())),
        "{err:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    let err = TcpStore::new(TcpStoreOptions::default()).err().unwrap();
    assert!(
        matches!(err, Error::InvalidArgument(_)),
        "port 0 needs a master"
    );
}

#[test]
fn store_tcp_wait_for_workers() {
    let port = server::listen("127.0.0.1", 0)
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let opts = TcpStoreOptions {
        port,
        is_master: true,
        world_size: Some(2),
        timeout: Duration::from_secs(20),
        ..Default::default()
    };
    let m = thread::spawn(move || TcpStore::new(opts));
    let c = client_of(port, Duration::from_secs(20));
    let m = m.join().unwrap().unwrap();
    assert_eq!(m.num_keys().unwrap(), 0);
    drop((m, c));
    // Nobody else comes: the master's constructor fails at its timeout.
    let t = Instant::now();
    let err = TcpStore::new(TcpStoreOptions {
        is_master: true,
        world_size: Some(2),
        timeout: Duration::from_millis(300),
        ..Default::default()
    })
    .err()
    .unwrap();
    assert!(
        matches!(&err, Error::Store(m) if m.contains("world_size 2")),
        "{err:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    // wait_for_workers=false returns at once.
    TcpStore::new(TcpStoreOptions {
        is_master: true,
        world_size: Some(8),
        wait_for_workers: false,
        ..Default::default()
    })
    .unwrap();
}

#[test]
fn store_tcp_server_stops_on_drop_and_port_rebinds() {
    let m = master(Duration::from_secs(10));
    let port = m.port();
    let c = client_of(port, Duration::from_secs(2));
    m.set("k", b"v").unwrap();
    let server = Arc::clone(m.server().unwrap());
    drop(m);
    // The last Arc of the server keeps it alive...
    assert_eq!(c.get("k", None).unwrap(), b"v");
    drop(server);
    // ...and dropping it stops it: the client's calls fail, the port is free at once.
    assert!(matches!(c.get("k", None), Err(Error::Store(_))));
    let m2 = TcpStore::new(TcpStoreOptions {
        port,
        is_master: true,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(m2.num_keys().unwrap(), 0);
    // The old client reconnects to the new server on its next call.
    c.set("k2", b"v2").unwrap();
    assert_eq!(m2.get("k2", None).unwrap(), b"v2");
}

#[test]
fn store_tcp_multi_tenant_shares_server() {
    let opts = TcpStoreOptions {
        is_master: true,
        multi_tenant: true,
        ..Default::default()
    };
    let a = TcpStore::new(opts.clone()).unwrap();
    let b = TcpStore::new(TcpStoreOptions {
        port: a.port(),
        ..opts
    })
    .unwrap();
    assert!(Arc::ptr_eq(a.server().unwrap(), b.server().unwrap()));
    a.set("k", b"v").unwrap();
    drop(a);
    assert_eq!(b.get("k", None).unwrap(), b"v");
    // Without multi_tenant the port is taken.
    let err = TcpStore::new(TcpStoreOptions {
        port: b.port(),
        is_master: true,
        ..Default::default()
    })
    .err()
    .unwrap();
    assert!(matches!(err, Error::Network(_)), "{err:?}");
}

#[test]
fn store_tcp_master_listen_fd() {
    let listener = server::listen("127.0.0.1", 0).unwrap();
    let port = listener.local_addr().unwrap().port();
    let m = TcpStore::new(TcpStoreOptions {
        port,
        is_master: true,
        master_listen_fd: Some(listener.as_raw_fd()),
        ..Default::default()
    })
    .unwrap();
    drop(listener); // the server serves on its own duplicate
    assert_eq!(m.port(), port);
    assert_serving(port);
    assert!(TcpStore::new(TcpStoreOptions {
        is_master: true,
        master_listen_fd: Some(-1),
        ..Default::default()
    })
    .is_err());
}

#[test]
fn store_tcp_frozen_server_honours_timeout() {
    // A server that answers Hello, then freezes (what a SIGSTOPped process looks like): it
    // keeps the connection open and reads, but never answers again.
    let frozen = server::listen("127.0.0.1", 0).unwrap();
    let port = frozen.local_addr().unwrap().port();
    let fake = thread::spawn(move || {
        let (mut a, _) = frozen.accept().unwrap();
        assert_eq!(
            read_frame(&mut a, MAX_FRAME).unwrap().unwrap(),
            &Request::Hello.encode()[4..]
        );
        a.write_all(&Response::Ok.encode()).unwrap();
        // The second client's Hello is never answered.
        let (b, _) = frozen.accept().unwrap();
        (a, b, frozen)
    });
    let c = TcpStore::new(TcpStoreOptions {
        port,
        timeout: Duration::from_millis(500),
        ..Default::default()
    })
    .unwrap();
    let t = Instant::now();
    let err = c.get("k", Some(Duration::from_millis(300))).unwrap_err();
    assert!(
        matches!(&err, Error::Store(m) if m.contains("no answer")),
        "{err:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    let t = Instant::now();
    // The failed exchange closed the connection: the retry fails within the store timeout.
    assert!(matches!(c.set("k", b"v"), Err(Error::Store(_))));
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let err = TcpStore::new(TcpStoreOptions {
        port,
        timeout: Duration::from_millis(500),
        ..Default::default()
    })
    .err()
    .unwrap();
    assert!(matches!(err, Error::Store(_)), "{err:?}");
    drop(fake.join().unwrap());
}

#[test]
fn store_tcp_server_survives_garbage() {
    let m = master(Duration::from_secs(10));
    let port = m.port();
    // Random bytes (their first four claim a length, then the rest makes no request).
    let mut s = raw(port);
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let _ = s.write_all(&garbage);
    drop(s);
    // An unknown opcode in a well-formed frame: dropped.
    let mut s = raw(port);
    s.write_all(&[1, 0, 0, 0, 200]).unwrap();
    assert!(closed_by_peer(&mut s));
    // A known opcode with a truncated field: dropped.
    let mut s = raw(port);
    s.write_all(&[5, 0, 0, 0, 2, 0xff, 0xff, 0, 0]).unwrap();
    assert!(closed_by_peer(&mut s));
    // A claimed 1 GiB frame, then nothing: dropped at once, nothing allocated.
    let mut s = raw(port);
    s.write_all(&(1u32 << 30).to_le_bytes()).unwrap();
    assert!(closed_by_peer(&mut s));
    // Half a frame, then hang up.
    let mut s = raw(port);
    s.write_all(&[100, 0, 0, 0, 2, 1]).unwrap();
    s.shutdown(Shutdown::Both).unwrap();
    drop(s);
    assert_serving(port);
    m.set("k", b"v").unwrap();
    assert_eq!(m.get("k", None).unwrap(), b"v");
    // Every hostile connection has ended: once the master's own client is gone, none is open.
    let server = Arc::clone(m.server().unwrap());
    drop(m);
    assert!(server.wait_connections_closed(Instant::now() + Duration::from_secs(5)));
}

#[test]
fn store_tcp_claimed_length_is_not_allocated() {
    let m = master(Duration::from_secs(10));
    let port = m.port();
    let before = rss_bytes();
    // Eight connections each claim a frame just under the limit and send 10 bytes of it.
    let holders: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut s = raw(port);
            s.write_all(&((MAX_FRAME - 1) as u32).to_le_bytes())
                .unwrap();
            s.write_all(&[0u8; 10]).unwrap();
            s
        })
        .collect();
    assert_serving(port);
    let grown = rss_bytes().saturating_sub(before);
    assert!(grown < 64 << 20, "RSS grew by {grown} bytes");
    drop(holders);
    assert_serving(port);
}

#[test]
fn store_tcp_slow_client_does_not_block_others() {
    let m = master(Duration::from_secs(10));
    let port = m.port();
    let slow = thread::spawn(move || {
        let mut s = raw(port);
        let frame = Request::Set {
            key: "slow".into(),
            value: b"v".to_vec(),
        }
        .encode();
        // One byte per 100 ms; the server serves everyone else meanwhile.
        for b in &frame {
            s.write_all(&[*b]).unwrap();
            thread::sleep(Duration::from_millis(100));
        }
        Response::decode(&read_frame(&mut s, MAX_FRAME).unwrap().unwrap()).unwrap()
    });
    let c = client_of(port, Duration::from_secs(10));
    for i in 0..20 {
        let t = Instant::now();
        c.set(&format!("fast{i}"), b"x").unwrap();
        assert_eq!(c.get(&format!("fast{i}"), None).unwrap(), b"x");
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
    }
    assert!(
        !m.check(&["slow".into()]).unwrap(),
        "the slow frame is still arriving"
    );
    assert_eq!(slow.join().unwrap(), Response::Ok);
    assert_eq!(m.get("slow", None).unwrap(), b"v");
}

#[test]
fn store_tcp_blocked_get_ends_with_its_client() {
    let m = master(Duration::from_secs(10));
    let server = Arc::clone(m.server().unwrap());
    let port = m.port();
    // A get that would wait 60 s, whose client disconnects: its server thread exits.
    let mut s = raw(port);
    s.write_all(
        &Request::Get {
            keys: vec!["never".into()],
            timeout_ms: 60_000,
        }
        .encode(),
    )
    .unwrap();
    // The deadline the client sent is honoured: a short wait is answered "timeout".
    let mut s2 = raw(port);
    let req = Request::Wait {
        keys: vec!["never".into()],
        timeout_ms: 100,
    };
    assert_eq!(
        exchange(&mut s2, &req),
        Response::Timeout(vec!["never".into()])
    );
    drop(s2);
    drop(s);
    drop(m);
    // Only `server`'s Arc remains; no connection is left open (the blocked one ended).
    assert!(server.wait_connections_closed(Instant::now() + Duration::from_secs(5)));
}

/// Runs itself in a child process (so other tests' allocations do not blur the numbers):
/// 10,000 malformed connections leave the server's memory flat.
#[test]
fn store_tcp_memory_flat_over_malformed_connections() {
    if ran_in_child("store::tcp::tests::store_tcp_memory_flat_over_malformed_connections") {
        return;
    }
    let m = master(Duration::from_secs(10));
    let port = m.port();
    let bad: [&[u8]; 4] = [
        &[1, 0, 0, 0, 200],                 // unknown opcode
        &[0, 0, 0, 0x40],                   // claims 1 GiB
        &[5, 0, 0, 0, 2, 0xff, 0xff, 0, 0], // truncated field
        &[3, 0, 0, 0, 10, 0, 0],            // trailing bytes after NumKeys
    ];
    let hit = |n: usize| {
        for i in 0..n {
            let mut s = raw(port);
            s.write_all(bad[i % bad.len()]).unwrap();
            assert!(closed_by_peer(&mut s));
        }
    };
    assert_memory_flat(10_000, "malformed connections", hit);
    assert_serving(port);
    let server = Arc::clone(m.server().unwrap());
    drop(m);
    assert!(server.wait_connections_closed(Instant::now() + Duration::from_secs(5)));

    // A server with a key, against clients that do not authenticate: a request instead of
    // the challenge, a claimed huge first frame, a wrong proof, a hang-up mid-exchange.
    let m = TcpStore::new(TcpStoreOptions {
        is_master: true,
        auth_key: keyed(b"k"),
        ..Default::default()
    })
    .unwrap();
    let port = m.port();
    let hit = |n: usize| {
        for i in 0..n {
            let mut s = raw(port);
            match i % 4 {
                0 => s.write_all(&Request::NumKeys.encode()).unwrap(),
                1 => s.write_all(&(1u32 << 30).to_le_bytes()).unwrap(),
                _ => {
                    let init = Request::AuthInit { nonce: [1; 32] };
                    assert!(matches!(
                        exchange(&mut s, &init),
                        Response::Challenge { .. }
                    ));
                    if i % 4 == 3 {
                        continue; // hangs up before its proof
                    }
                    s.write_all(&Request::AuthProof { tag: [0; 32] }.encode())
                        .unwrap();
                }
            }
            if i % 4 != 1 {
                let refusal = Response::decode(&read_frame(&mut s, MAX_FRAME).unwrap().unwrap());
                assert!(
                    matches!(refusal, Ok(Response::AuthFailed(_))),
                    "{refusal:?}"
                );
            }
            assert!(closed_by_peer(&mut s));
        }
    };
    assert_memory_flat(10_000, "unauthenticated connections", hit);
    let c = TcpStore::new(TcpStoreOptions {
        port,
        timeout: Duration::from_secs(10),
        auth_key: keyed(b"k"),
        ..Default::default()
    })
    .unwrap();
    c.set("k", b"v").unwrap();
    assert_eq!(m.get("k", None).unwrap(), b"v");
}

#[test]
fn store_tcp_auth_key_is_required_and_checked_both_ways() {
    let m = TcpStore::new(TcpStoreOptions {
        is_master: true,
        timeout: Duration::from_secs(30),
        auth_key: keyed(b"secret"),
        ..Default::default()
    })
    .unwrap();
    let port = m.port();
    let connect = |key: Option<AuthKey>| {
        TcpStore::new(TcpStoreOptions {
            port,
            timeout: Duration::from_secs(30),
            auth_key: key,
            ..Default::default()
        })
    };
    // Missing and wrong keys fail at once (not at the 30 s timeout), saying why.
    for (key, why) in [
        (None, "requires RUSTDIST_AUTH_KEY"),
        (keyed(b"Secret"), "RUSTDIST_AUTH_KEY differs"),
    ] {
        let t = Instant::now();
        let err = connect(key).err().unwrap();
        assert!(
            matches!(&err, Error::Network(msg) if msg.contains("authentication failed") && msg.contains(why)),
            "{err:?}"
        );
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
    // A raw client's request before authenticating is refused, and nothing it asked is done.
    let mut s = raw(port);
    let set = Request::Set {
        key: "sneaky".into(),
        value: b"v".to_vec(),
    };
    assert!(matches!(exchange(&mut s, &set), Response::AuthFailed(_)));
    assert!(closed_by_peer(&mut s));
    assert!(!m.check(&["sneaky".into()]).unwrap());
    // The right key: everything works, on every new connection of the client too.
    let c = Arc::new(connect(keyed(b"secret")).unwrap());
    c.set("k", b"v").unwrap();
    let waiter = {
        let c = Arc::clone(&c);
        thread::spawn(move || c.get("later", None))
    };
    c.set("later", b"x").unwrap(); // a second connection while the first waits
    assert_eq!(waiter.join().unwrap().unwrap(), b"x");
    assert_eq!(m.get("k", None).unwrap(), b"v");
    // A key on the client only.
    let plain = master(Duration::from_secs(30));
    let err = TcpStore::new(TcpStoreOptions {
        port: plain.port(),
        auth_key: keyed(b"secret"),
        ..Default::default()
    })
    .err()
    .unwrap();
    assert!(
        matches!(&err, Error::Network(msg) if msg.contains("set on this client but not on the TCPStore server")),
        "{err:?}"
    );
}

#[test]
fn store_tcp_master_listens_on_the_host_given() {
    assert_eq!(server::bind_address(""), None);
    assert_eq!(server::bind_address("0.0.0.0"), None);
    assert_eq!(server::bind_address("::"), None);
    assert_eq!(
        server::bind_address("192.0.2.1"),
        None,
        "not this machine's"
    );
    assert_eq!(
        server::bind_address("127.0.0.1"),
        Some([127, 0, 0, 1].into())
    );
    assert_eq!(
        server::bind_address("localhost"),
        Some([127, 0, 0, 1].into())
    );
    let reaches = |host: &str, port: u16| TcpStream::connect((host, port)).is_ok();
    // Bound to 127.0.0.1 only: another loopback address does not reach it.
    let only = master(Duration::from_secs(10));
    assert!(reaches("127.0.0.1", only.port()));
    assert!(!reaches("127.0.0.2", only.port()));
    // Every interface for 0.0.0.0.
    let every = TcpStore::new(TcpStoreOptions {
        host: "0.0.0.0".into(),
        is_master: true,
        ..Default::default()
    })
    .unwrap();
    assert!(reaches("127.0.0.1", every.port()) && reaches("127.0.0.2", every.port()));
}

#[test]
fn store_tcp_client_over_the_limit_is_told_why() {
    assert_eq!(server::default_max_clients(Some("7"), 20_000), 7);
    assert_eq!(
        server::default_max_clients(Some("0"), 20_000),
        20_000 - 1024
    );
    assert_eq!(server::default_max_clients(None, 1024), 1024 - 128);
    let server =
        TcpServer::start_with_limit(server::listen("127.0.0.1", 0).unwrap(), None, None, Some(2))
            .unwrap();
    let port = server.port();
    assert_eq!(server.max_clients(), 2);
    let served = client_of(port, Duration::from_secs(10));
    let mut held = raw(port);
    assert_eq!(exchange(&mut held, &Request::NumKeys), Response::Int(0));
    // A third store fails at once (not at its timeout), saying what the limit is and how to
    // raise it.
    let t = Instant::now();
    let err = TcpStore::new(TcpStoreOptions {
        port,
        timeout: Duration::from_secs(30),
        ..Default::default()
    })
    .err()
    .unwrap();
    assert!(
        matches!(&err, Error::Network(m) if m.contains("connection limit reached (2 clients)")
            && m.contains("raise RUSTDIST_STORE_MAX_CLIENTS") && m.contains("ulimit -n")),
        "{err:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // A raw client's first request gets the refusal, then the server hangs up.
    let mut over = raw(port);
    assert!(matches!(
        exchange(&mut over, &Request::NumKeys),
        Response::Error(m) if m.starts_with(super::shared::LIMIT_REFUSAL)
    ));
    assert!(closed_by_peer(&mut over));
    served.set("k", b"v").unwrap();
    // A slot that frees up serves the next client.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    let next = loop {
        match TcpStore::new(TcpStoreOptions {
            port,
            timeout: Duration::from_secs(5),
            ..Default::default()
        }) {
            Ok(c) => break c,
            Err(e) if Instant::now() < deadline => drop(e),
            Err(e) => panic!("{e:?}"),
        }
    };
    assert_eq!(next.get("k", None).unwrap(), b"v");

    // With authentication, the refusal still says why (not "authentication failed").
    let key = keyed(b"s");
    let listener = server::listen("127.0.0.1", 0).unwrap();
    let server = TcpServer::start_with_limit(listener, key.clone(), None, Some(1)).unwrap();
    let connect = || {
        TcpStore::new(TcpStoreOptions {
            port: server.port(),
            timeout: Duration::from_secs(30),
            auth_key: key.clone(),
            ..Default::default()
        })
    };
    let first = connect().unwrap();
    let err = connect().err().unwrap();
    assert!(
        matches!(&err, Error::Network(m) if m.contains("connection limit reached (1 clients")),
        "{err:?}"
    );
    first.set("a", b"1").unwrap();
}

#[test]
fn store_tcp_parked_wait_needs_every_key_and_pipelined_requests_follow() {
    let m = master(Duration::from_secs(10));
    let mut s = raw(m.port());
    // A get of two keys, then a request pipelined behind it: neither is answered until both
    // keys exist, and then in order.
    let get = Request::Get {
        keys: vec!["x".into(), "y".into()],
        timeout_ms: 20_000,
    };
    let mut both = get.encode();
    both.extend(Request::NumKeys.encode());
    s.write_all(&both).unwrap();
    m.set("x", b"1").unwrap();
    thread::sleep(Duration::from_millis(100));
    s.set_nonblocking(true).unwrap();
    assert!(
        s.peek(&mut [0u8; 1]).is_err(),
        "answered with a key missing"
    );
    s.set_nonblocking(false).unwrap();
    m.append("y", b"2").unwrap();
    let answer = Response::decode(&read_frame(&mut s, MAX_FRAME).unwrap().unwrap()).unwrap();
    assert_eq!(answer, Response::List(vec![b"1".to_vec(), b"2".to_vec()]));
    let answer = Response::decode(&read_frame(&mut s, MAX_FRAME).unwrap().unwrap()).unwrap();
    assert_eq!(answer, Response::Int(2));
}

/// Certificate files for hosts `a` and `b` of a fresh test PKI, as [`Tls`] settings.
fn tls_files(names: &[&str]) -> Vec<Tls> {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("rustdist-store-tls-{}-{n}", std::process::id()));
    crate::tls::write_test_pki(&dir, &["a", "b"]).unwrap();
    let p = |f: String| dir.join(f).to_str().unwrap().to_string();
    let made = names
        .iter()
        .map(|name| {
            let (cert, key) = (p(format!("{name}.pem")), p(format!("{name}.key")));
            let ca = p("ca.pem".into());
            Tls::with_files([("C", &cert), ("K", &key), ("A", &ca)], false).unwrap()
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    made
}

fn store_with(master: bool, port: u16, key: Option<AuthKey>, tls: Option<Tls>) -> Result<TcpStore> {
    TcpStore::new(TcpStoreOptions {
        is_master: master,
        port,
        timeout: Duration::from_secs(10),
        auth_key: key,
        tls,
        ..Default::default()
    })
}

#[test]
fn tls_stores_serve_with_certificates_and_with_pinned_keys() {
    let files = tls_files(&["a", "b"]);
    let pinned = Tls::with_pinned_key(false).unwrap();
    for (server, client, key) in [
        (&files[0], &files[1], None),
        (&files[0], &files[1], keyed(b"k")),
        (&pinned, &pinned, keyed(b"k")),
    ] {
        let m = store_with(true, 0, key.clone(), Some(server.clone())).unwrap();
        let c = store_with(false, m.port(), key, Some(client.clone())).unwrap();
        c.set("x", &vec![7u8; 1 << 20]).unwrap();
        assert_eq!(m.get("x", None).unwrap(), vec![7u8; 1 << 20]);
        assert_eq!(c.add("n", 5).unwrap(), 5);
    }
    // Pinned keys authenticate through the key: another key is refused.
    let m = store_with(true, 0, keyed(b"k"), Some(pinned.clone())).unwrap();
    let err = store_with(false, m.port(), keyed(b"K"), Some(pinned))
        .err()
        .unwrap();
    assert!(err.to_string().contains("authentication failed"), "{err}");
}

#[test]
fn tls_and_plain_stores_refuse_each_other_at_once() {
    let files = tls_files(&["a", "b"]);
    let started = Instant::now();
    let m = store_with(true, 0, None, Some(files[0].clone())).unwrap();
    let err = store_with(false, m.port(), None, None)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("requires TLS"), "{err}");
    let m = store_with(true, 0, None, None).unwrap();
    let err = store_with(false, m.port(), None, Some(files[1].clone()))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("TLS handshake") && err.contains("TLS off there"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}
