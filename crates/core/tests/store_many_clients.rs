//! 10,000 clients connected at once to one TCP store server, which serves them all from a
//! constant number of threads. The clients run in a child process (this test binary run
//! again), since the server's and the clients' sockets together would pass the fd limit.

use std::fs::File;
use std::io::{self, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use rustdist_core::store::tcp::protocol::{read_frame, Request, Response, MAX_FRAME};
use rustdist_core::store::tcp::server::{self, raise_fd_limit};
use rustdist_core::store::tcp::TcpServer;

const TEST: &str = "store_serves_10000_clients_on_one_thread";
/// Set in the child: the server's port, and how many clients to run.
const PORT_ENV: &str = "RUSTDIST_MANY_CLIENTS_PORT";
const COUNT_ENV: &str = "RUSTDIST_MANY_CLIENTS";
const CLIENTS: usize = 10_000;
/// Threads driving the clients in the child.
const DRIVERS: usize = 4;
/// The whole run, child included, must end within this.
const BOUND: Duration = Duration::from_secs(60);
/// What the final client sets, which every blocked get waits for.
const FINAL: &str = "final";

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, Iterator::count)
}

fn ask(s: &mut TcpStream, req: &Request) -> io::Result<Response> {
    s.write_all(&req.encode())?;
    answer(s)
}

fn answer(s: &mut TcpStream) -> io::Result<Response> {
    let frame = read_frame(s, MAX_FRAME)?.ok_or(io::ErrorKind::UnexpectedEof)?;
    Response::decode(&frame).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

#[test]
fn store_serves_10000_clients_on_one_thread() {
    if let Ok(port) = std::env::var(PORT_ENV) {
        let n = std::env::var(COUNT_ENV).unwrap().parse().unwrap();
        return clients(port.parse().unwrap(), n);
    }
    let (soft, _) = raise_fd_limit();
    // Each side holds one fd per client (and a few more).
    let n = CLIENTS.min(usize::try_from(soft).unwrap().saturating_sub(256));
    assert!(
        n >= 1000,
        "the open-file limit ({soft}) is too low for this test"
    );
    let server = TcpServer::start(server::listen("127.0.0.1", 0).unwrap(), None, None).unwrap();
    assert!(server.max_clients() > n, "{}", server.max_clients());
    let before = threads();
    let started = Instant::now();
    let log_path = std::env::temp_dir().join(format!("{TEST}.{}.log", std::process::id()));
    let log = File::create(&log_path).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(PORT_ENV, server.port().to_string())
        .env(COUNT_ENV, n.to_string())
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let (mut fewest, mut most) = (before, before);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > BOUND {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the clients did not finish within {BOUND:?}");
        }
        let now = threads();
        fewest = fewest.min(now);
        most = most.max(now);
        thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let _ = std::fs::remove_file(&log_path);
    println!("{text}");
    assert!(status.success() && text.contains("1 passed"), "{text}");
    println!(
        "{n} concurrent clients served in {:.2} s; server process threads: {before} before, \
         {fewest}..{most} while serving",
        took.as_secs_f64()
    );
    assert_eq!((fewest, most), (before, before), "the thread count changed");
    drop(server);
}

/// The child: `n` clients, all connected at once, each setting and getting its own key, then
/// blocking on a key the last client sets.
fn clients(port: u16, n: usize) {
    raise_fd_limit();
    let t = Instant::now();
    let phase = Arc::new(Barrier::new(DRIVERS + 1));
    let drivers: Vec<_> = (0..DRIVERS)
        .map(|d| {
            let phase = Arc::clone(&phase);
            thread::spawn(move || drive(port, (d..n).step_by(DRIVERS).collect(), &phase))
        })
        .collect();
    phase.wait();
    println!(
        "{n} clients connected in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    phase.wait();
    println!(
        "set and get of {n} keys done at {:.2} s",
        t.elapsed().as_secs_f64()
    );
    // Every client has sent its blocking get: after a while, none has been answered.
    thread::sleep(Duration::from_millis(300));
    phase.wait();
    phase.wait();
    let mut last = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let set = Request::Set {
        key: FINAL.into(),
        value: b"go".to_vec(),
    };
    let woken = Instant::now();
    assert_eq!(ask(&mut last, &set).unwrap(), Response::Ok);
    let answered: usize = drivers.into_iter().map(|d| d.join().unwrap()).sum();
    assert_eq!(answered, n);
    println!(
        "{n} blocked gets answered {:.2} s after the final set; total {:.2} s",
        woken.elapsed().as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
}

/// One driver thread's share of the clients; returns how many got the final value.
fn drive(port: u16, ids: Vec<usize>, phase: &Barrier) -> usize {
    let mut socks: Vec<TcpStream> = ids
        .iter()
        .map(|_| {
            let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            s
        })
        .collect();
    phase.wait();
    for (s, i) in socks.iter_mut().zip(&ids) {
        let (key, value) = (format!("k{i}"), format!("v{i}").into_bytes());
        let set = Request::Set {
            key: key.clone(),
            value: value.clone(),
        };
        assert_eq!(ask(s, &set).unwrap(), Response::Ok);
        let get = Request::Get {
            keys: vec![key],
            timeout_ms: 10_000,
        };
        assert_eq!(ask(s, &get).unwrap(), Response::List(vec![value]));
        let blocked = Request::Get {
            keys: vec![FINAL.into()],
            timeout_ms: 50_000,
        };
        s.write_all(&blocked.encode()).unwrap();
    }
    phase.wait();
    phase.wait();
    for s in &socks {
        s.set_nonblocking(true).unwrap();
        let early = s.peek(&mut [0u8; 1]);
        assert!(
            matches!(&early, Err(e) if e.kind() == io::ErrorKind::WouldBlock),
            "a blocked get was answered before its key was set: {early:?}"
        );
        s.set_nonblocking(false).unwrap();
    }
    phase.wait();
    socks
        .iter_mut()
        .map(|s| answer(s).unwrap())
        .filter(|r| *r == Response::List(vec![b"go".to_vec()]))
        .count()
}
