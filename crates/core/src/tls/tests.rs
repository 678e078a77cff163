use std::io::{self, IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::*;

/// A fresh directory with a test PKI for hosts `a` and `b`, removed when dropped.
struct Pki(PathBuf);

impl std::ops::Deref for Pki {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pki() -> Pki {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("rustdist-tls-{}-{n}", std::process::id()));
    write_test_pki(&dir, &["a", "b"]).unwrap();
    Pki(dir)
}

fn files(dir: &std::path::Path, name: &str, ca: &str) -> Tls {
    let p = |f: String| dir.join(f).to_str().unwrap().to_string();
    let (cert, key, ca) = (
        p(format!("{name}.pem")),
        p(format!("{name}.key")),
        p(ca.into()),
    );
    Tls::with_files([("C", &cert), ("K", &key), ("A", &ca)], false).unwrap()
}

/// A connected pair of non-blocking loopback sockets.
fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    for s in [&a, &b] {
        s.set_nonblocking(true).unwrap();
    }
    (a, b)
}

/// Drives both handshakes until both are over, or returns the first side's error (client,
/// server) as text.
fn shake(c: &mut TlsStream, s: &mut TlsStream) -> Result<(), (Option<String>, Option<String>)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut ce, mut se) = (None, None);
    loop {
        let cd = ce.is_none()
            && c.handshake()
                .map_err(|e| ce = Some(e.to_string()))
                .unwrap_or(false);
        let sd = se.is_none()
            && s.handshake()
                .map_err(|e| se = Some(e.to_string()))
                .unwrap_or(false);
        if cd && sd {
            return Ok(());
        }
        if ce.is_some() && (se.is_some() || sd) || se.is_some() && (ce.is_some() || cd) {
            // The other side learns of the refusal on its next read.
            let mut b = [0u8; 1];
            if ce.is_none() {
                ce = c.read(&mut b).err().map(|e| e.to_string());
            }
            if se.is_none() {
                se = s.read(&mut b).err().map(|e| e.to_string());
            }
            return Err((ce, se));
        }
        assert!(Instant::now() < deadline, "handshake stuck");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sends `data` from `w` to `r` through the non-blocking streams, reading in odd sizes.
fn carry(w: &mut TlsStream, r: &mut TlsStream, data: &[u8]) -> Vec<u8> {
    let (mut sent, mut got) = (0, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut buf = vec![0u8; 70_001];
    while got.len() < data.len() {
        assert!(Instant::now() < deadline, "stuck at {} bytes", got.len());
        if sent < data.len() {
            let half = (data.len() - sent) / 2 + sent;
            let bufs = [IoSlice::new(&data[sent..half]), IoSlice::new(&data[half..])];
            match w.write_vectored(&bufs) {
                Ok(n) => sent += n,
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
            }
        } else {
            while !w.flush_out().unwrap() {}
        }
        match r.read(&mut buf) {
            Ok(n) => {
                assert!(n > 0, "EOF");
                got.extend_from_slice(&buf[..n]);
            }
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
        }
    }
    got
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn certificate_files_carry_data_both_ways() {
    let dir = pki();
    let (a, b) = (files(&dir, "a", "ca.pem"), files(&dir, "b", "ca.pem"));
    let (x, y) = pair();
    let mut c = TlsStream::client(x, a.client_config(None).unwrap()).unwrap();
    let mut s = TlsStream::server(y, b.server_config(None).unwrap()).unwrap();
    shake(&mut c, &mut s).unwrap();
    let data = pattern(3 << 20);
    assert!(carry(&mut c, &mut s, &data) == data);
    assert!(carry(&mut s, &mut c, &data[..100_000]) == data[..100_000]);
    assert!(!c.buffered() && !s.buffered());
    // A CA given as a directory of PEM files verifies the same.
    let ca_dir = dir.join("cas");
    std::fs::create_dir_all(&ca_dir).unwrap();
    std::fs::copy(dir.join("ca.pem"), ca_dir.join("ca.pem")).unwrap();
    std::fs::write(ca_dir.join("README"), "not a certificate").unwrap();
    let d = files(&dir, "a", "cas");
    let (x, y) = pair();
    let mut c = TlsStream::client(x, d.client_config(None).unwrap()).unwrap();
    let mut s = TlsStream::server(y, b.server_config(None).unwrap()).unwrap();
    shake(&mut c, &mut s).unwrap();
}

#[test]
fn a_certificate_of_another_ca_is_refused_on_both_sides() {
    let dir = pki();
    let good = files(&dir, "b", "ca.pem");
    let rogue = files(&dir, "rogue", "ca.pem");
    for rogue_is_client in [true, false] {
        let (x, y) = pair();
        let (mut c, mut s) = if rogue_is_client {
            (
                TlsStream::client(x, rogue.client_config(None).unwrap()).unwrap(),
                TlsStream::server(y, good.server_config(None).unwrap()).unwrap(),
            )
        } else {
            (
                TlsStream::client(x, good.client_config(None).unwrap()).unwrap(),
                TlsStream::server(y, rogue.server_config(None).unwrap()).unwrap(),
            )
        };
        let (ce, se) = shake(&mut c, &mut s).unwrap_err();
        let (refused, refusing) = if rogue_is_client { (ce, se) } else { (se, ce) };
        let refusing = refusing.unwrap();
        assert!(refusing.contains("certificate was refused"), "{refusing}");
        assert!(refusing.contains("UnknownIssuer"), "{refusing}");
        let refused = refused.unwrap();
        assert!(refused.contains("ended the TLS session"), "{refused}");
    }
}

#[test]
fn pinned_keys_accept_exactly_the_published_certificate() {
    let me = Tls::with_pinned_key(false).unwrap();
    let pin = fingerprint(&me.chain[0]);
    let (x, y) = pair();
    let mut c = TlsStream::client(x, me.client_config(Some(pin)).unwrap()).unwrap();
    let mut s = TlsStream::server(y, me.server_config(Some(pin)).unwrap()).unwrap();
    shake(&mut c, &mut s).unwrap();
    assert!(carry(&mut c, &mut s, b"pinned") == b"pinned");
    let mut other = pin;
    other[0] ^= 1;
    let (x, y) = pair();
    let mut c = TlsStream::client(x, me.client_config(Some(pin)).unwrap()).unwrap();
    let mut s = TlsStream::server(y, me.server_config(Some(other)).unwrap()).unwrap();
    let (ce, se) = shake(&mut c, &mut s).unwrap_err();
    let se = se.unwrap();
    assert!(
        se.contains("not the certificate that rank published"),
        "{se}"
    );
    assert!(ce.unwrap().contains("ended the TLS session"));
}

#[test]
fn an_altered_record_fails_the_connection() {
    let dir = pki();
    let (a, b) = (files(&dir, "a", "ca.pem"), files(&dir, "b", "ca.pem"));
    // A relay that flips one byte once 64 KiB have passed from the client (application data
    // by then: the handshake is a few KiB).
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server_side = TcpListener::bind("127.0.0.1:0").unwrap();
    let (la, sa) = (
        listener.local_addr().unwrap(),
        server_side.local_addr().unwrap(),
    );
    std::thread::spawn(move || {
        let (mut from_client, _) = listener.accept().unwrap();
        let mut to_server = TcpStream::connect(sa).unwrap();
        let (mut back_from, mut back_to) = (
            to_server.try_clone().unwrap(),
            from_client.try_clone().unwrap(),
        );
        std::thread::spawn(move || io::copy(&mut back_from, &mut back_to));
        let (mut buf, mut passed) = (vec![0u8; 4096], 0usize);
        while let Ok(n) = from_client.read(&mut buf) {
            if n == 0 {
                break;
            }
            if passed < 65536 && passed + n >= 65536 {
                buf[65536 - passed] ^= 0x40;
            }
            passed += n;
            if to_server.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    let x = TcpStream::connect(la).unwrap();
    let (y, _) = server_side.accept().unwrap();
    x.set_nonblocking(true).unwrap();
    y.set_nonblocking(true).unwrap();
    let mut c = TlsStream::client(x, a.client_config(None).unwrap()).unwrap();
    let mut s = TlsStream::server(y, b.server_config(None).unwrap()).unwrap();
    shake(&mut c, &mut s).unwrap();
    let data = pattern(1 << 20);
    let (mut sent, mut got) = (0, 0);
    let mut buf = vec![0u8; 1 << 16];
    let deadline = Instant::now() + Duration::from_secs(20);
    let err = loop {
        assert!(
            Instant::now() < deadline,
            "the altered record went unnoticed"
        );
        if sent < data.len() {
            if let Ok(n) = c.write_vectored(&[IoSlice::new(&data[sent..])]) {
                sent += n;
            }
        }
        match s.read(&mut buf) {
            Ok(n) => {
                assert!(n > 0);
                assert!(
                    buf[..n] == data[got..got + n],
                    "altered bytes were delivered"
                );
                got += n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    assert!(err.to_string().contains("altered"), "{err}");
    assert!(
        got < 65536,
        "{got} bytes delivered before the altered record"
    );
}

#[test]
fn a_plain_peer_is_told_apart() {
    let dir = pki();
    let b = files(&dir, "b", "ca.pem");
    let (mut x, y) = pair();
    let mut s = TlsStream::server(y, b.server_config(None).unwrap()).unwrap();
    x.write_all(&[0x52, 0x44, 0x48, 0x32, 0, 0, 0, 0, 0, 0])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let err = loop {
        match s.handshake() {
            Err(e) => break e,
            Ok(_) => assert!(Instant::now() < deadline),
        }
    };
    assert!(err.to_string().contains("does not speak TLS"), "{err}");
}

#[test]
fn ranks_agree_on_the_mode_and_pins_are_signed() {
    let key = AuthKey::new(b"k").unwrap();
    let me = Tls::with_pinned_key(false).unwrap();
    let entry = |r: usize| format!("p/addr/{r}");
    let tokens: Vec<String> = (0..3).map(|r| me.token(Some(&key), &entry(r))).collect();
    let pins = agree(&tokens, 1, Some(&key), &entry).unwrap();
    assert!(pins.iter().all(|p| *p == Some(fingerprint(&me.chain[0]))));
    // Signed for another rank's key, or with another auth key: refused.
    let moved = vec![tokens[0].clone(), tokens[0].clone(), tokens[2].clone()];
    let e = agree(&moved, 0, Some(&key), &entry)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank 1 published a TLS key not signed"), "{e}");
    let other = AuthKey::new(b"other").unwrap();
    assert!(agree(&tokens, 0, Some(&other), &entry).is_err());
    // Modes that differ are listed by rank, the same on every rank.
    let mixed = vec![tokens[0].clone(), String::new(), "tls=ca".into()];
    let e = agree(&mixed, 2, Some(&key), &entry)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ranks [0] have TLS with pinned keys, ranks [1] have TLS off, ranks [2] have TLS with certificate files"),
        "{e}"
    );
    assert_eq!(
        agree(&mixed, 0, Some(&key), &entry)
            .unwrap_err()
            .to_string(),
        e
    );
    let plain = vec!["tls=off".to_string(), String::new()];
    assert_eq!(agree(&plain, 0, None, &entry).unwrap(), vec![None, None]);
    // A rank that cannot use its settings says why, and every rank repeats it.
    let why = Error::invalid("RUSTDIST_TLS_KEY (k.pem) does not match its certificate");
    let broken = vec!["tls=ca".to_string(), broken_token(&why)];
    for rank in 0..2 {
        let e = agree(&broken, rank, None, &entry).unwrap_err().to_string();
        assert!(
            e.contains("rank 1 cannot use its TLS settings: ")
                && e.contains("RUSTDIST_TLS_KEY (k.pem) does not match its certificate"),
            "{e}"
        );
    }
}

/// Process CPU seconds (user and system) so far.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given, which lives for the call.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is a valid target.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// Waits until `fd` is ready for `events` (at most 100 ms).
fn wait_for(fd: std::os::fd::RawFd, events: libc::c_short) {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the call's duration.
    unsafe { libc::poll(&mut p, 1, 100) };
}

/// The CPU TLS costs per GiB moved, both ends together, against plain TCP: one thread writes
/// `GIB` GiB through a loopback pair in 1 MiB writes, another reads them. A measurement, run by
/// hand (docs/across-hosts.md): `cargo test --release -p rustdist-core --lib
/// tls::tests::cpu_cost_per_gib -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, run by hand"]
fn cpu_cost_per_gib() {
    use std::os::fd::AsRawFd;
    const GIB: usize = 4;
    let dir = pki();
    let (a, b) = (files(&dir, "a", "ca.pem"), files(&dir, "b", "ca.pem"));
    for tls in [false, true] {
        let (x, y) = pair();
        let (xfd, yfd) = (x.as_raw_fd(), y.as_raw_fd());
        type Writer = Box<dyn FnMut(&[u8]) -> io::Result<usize> + Send>;
        type Reader = Box<dyn FnMut(&mut [u8]) -> io::Result<usize>>;
        let (mut w, mut r): (Writer, Reader) = if tls {
            let mut c = TlsStream::client(x, a.client_config(None).unwrap()).unwrap();
            let mut s = TlsStream::server(y, b.server_config(None).unwrap()).unwrap();
            shake(&mut c, &mut s).unwrap();
            (
                Box::new(move |buf| c.write_vectored(&[IoSlice::new(buf)])),
                Box::new(move |buf| s.read(buf)),
            )
        } else {
            let (mut x, mut y) = (x, y);
            (
                Box::new(move |buf| x.write(buf)),
                Box::new(move |buf| y.read(buf)),
            )
        };
        let total = GIB << 30;
        let (cpu, start) = (cpu_seconds(), Instant::now());
        let writer = std::thread::spawn(move || {
            let buf = pattern(1 << 20);
            let mut sent = 0;
            while sent < total {
                let off = sent % buf.len();
                let n = (buf.len() - off).min(total - sent);
                match w(&buf[off..off + n]) {
                    Ok(k) => sent += k,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_for(xfd, libc::POLLOUT),
                    Err(e) => panic!("{e}"),
                }
            }
            w
        });
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        while got < total {
            match r(&mut buf) {
                Ok(0) => panic!("EOF"),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_for(yfd, libc::POLLIN),
                Err(e) => panic!("{e}"),
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu;
        drop(writer.join().unwrap());
        println!(
            "{}: {:.2} GB/s, {:.3} CPU s per GiB (both ends)",
            if tls { "TLS" } else { "plain" },
            total as f64 / secs / 1e9,
            cpu / GIB as f64
        );
    }
}
