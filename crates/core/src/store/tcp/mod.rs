//! `TCPStore`: a store served by one process (the master) over TCP to every rank.
//!
//! Unlike torch, internal bookkeeping (workers announcing themselves for `wait_for_workers`)
//! lives outside the key space, so `num_keys` counts only the keys users wrote: a fresh store
//! reports 0 where torch reports 1.
//!
//! The master listens on `host` when that is an address of this machine (see
//! [`server::bind_address`]), else on every interface, as torch does. With TLS (the settings
//! of [`crate::tls`]) every connection is encrypted, and with an auth key
//! (`RUSTDIST_AUTH_KEY`) every connection authenticates both ways before anything else.

use std::net::TcpListener;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::auth::AuthKey;
use crate::error::{Error, Result};
use crate::store::{check_multi_set, deadline_after, Store, DEFAULT_TIMEOUT};
use crate::tls::Tls;

mod client;
mod conn;
mod event_loop;
pub mod protocol;
pub mod server;
mod shared;
#[cfg(test)]
mod tests;

use client::{checked, unexpected, waited, Client};
use protocol::{Request, Response};
pub use server::TcpServer;

/// Arguments of torch's `TCPStore(...)` (`use_libuv` has no equivalent: ignored).
#[derive(Debug, Clone)]
pub struct TcpStoreOptions {
    /// Where clients connect; the master listens there (every interface for `0.0.0.0`, an
    /// empty host, or a name or address that is not this machine's own; see
    /// [`server::bind_address`]).
    pub host: String,
    /// 0 on the master: any free port ([`TcpStore::port`] reports it).
    pub port: u16,
    /// With `wait_for_workers`, the master's constructor waits until this many stores (itself
    /// included) have connected.
    pub world_size: Option<usize>,
    pub is_master: bool,
    /// Default timeout of every call, and bound of connecting and of `wait_for_workers`.
    pub timeout: Duration,
    pub wait_for_workers: bool,
    /// Masters of one process on the same port share one server.
    pub multi_tenant: bool,
    /// A socket already bound and listening, for the master to serve on (it is duplicated;
    /// the caller keeps its own fd).
    pub master_listen_fd: Option<RawFd>,
    /// The shared secret both ends authenticate with (default: `RUSTDIST_AUTH_KEY`).
    pub auth_key: Option<AuthKey>,
    /// TLS on every connection (None: as the environment says, [`Tls::from_env`]).
    pub tls: Option<Tls>,
}

impl Default for TcpStoreOptions {
    fn default() -> Self {
        TcpStoreOptions {
            host: "127.0.0.1".into(),
            port: 0,
            world_size: None,
            is_master: false,
            timeout: DEFAULT_TIMEOUT,
            wait_for_workers: true,
            multi_tenant: false,
            master_listen_fd: None,
            auth_key: AuthKey::from_env(),
            tls: None,
        }
    }
}

/// Servers of `multi_tenant` masters in this process, by port.
static TENANTS: Mutex<Vec<(u16, Weak<TcpServer>)>> = Mutex::new(Vec::new());

/// torch's `TCPStore`. The master object owns the server: it serves while any `Arc` of the
/// master store (or of another tenant sharing it) lives.
pub struct TcpStore {
    // Declared before `server`: the client hangs up before the server stops.
    client: Client,
    server: Option<Arc<TcpServer>>,
    host: String,
    port: u16,
}

fn master_server(opts: &TcpStoreOptions, tls: Option<&Tls>) -> Result<Arc<TcpServer>> {
    let start = |listener| TcpServer::start(listener, opts.auth_key.clone(), tls);
    if let Some(fd) = opts.master_listen_fd {
        if fd < 0 {
            return Err(Error::invalid(format!(
                "master_listen_fd {fd} is not a valid fd"
            )));
        }
        // SAFETY: the caller promises `fd` is an open socket for the duration of this call;
        // it is duplicated at once and the duplicate is what the server owns.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let owned = borrowed
            .try_clone_to_owned()
            .map_err(|e| Error::invalid(format!("master_listen_fd {fd}: {e}")))?;
        return start(TcpListener::from(owned)).map(Arc::new);
    }
    let listen = || server::listen(&opts.host, opts.port);
    if !opts.multi_tenant {
        return start(listen()?).map(Arc::new);
    }
    let mut tenants = TENANTS.lock().unwrap_or_else(|p| p.into_inner());
    tenants.retain(|(_, w)| w.strong_count() > 0);
    let live = tenants
        .iter()
        .find(|(port, _)| opts.port != 0 && *port == opts.port)
        .and_then(|(_, w)| w.upgrade());
    if let Some(server) = live {
        return Ok(server);
    }
    let server = Arc::new(start(listen()?)?);
    tenants.push((server.port(), Arc::downgrade(&server)));
    Ok(server)
}

/// Adds the keys waited for to a failed blocking call's error (e.g. a server that froze).
fn naming(keys: &[String]) -> impl FnOnce(Error) -> Error + '_ {
    move |e| match e {
        Error::Store(msg) if !msg.starts_with("wait timeout") => {
            Error::Store(format!("{msg} (waiting for keys {keys:?})"))
        }
        other => other,
    }
}

/// Milliseconds of a wait sent to the server (saturating).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl TcpStore {
    /// Starts the server (master) and connects to it; blocks for `wait_for_workers`.
    pub fn new(opts: TcpStoreOptions) -> Result<Self> {
        let tls = match opts.tls.clone() {
            Some(tls) => Some(tls),
            None => Tls::from_env(opts.auth_key.as_ref())?,
        };
        let server = if opts.is_master {
            Some(master_server(&opts, tls.as_ref())?)
        } else {
            None
        };
        let port = server.as_ref().map_or(opts.port, |s| s.port());
        if port == 0 {
            return Err(Error::invalid(
                "TCPStore: port 0 (any free port) is only valid on the master",
            ));
        }
        let client = Client::connect(&opts.host, port, opts.timeout, opts.auth_key, tls.as_ref())?;
        if let (Some(server), Some(n), true) = (&server, opts.world_size, opts.wait_for_workers) {
            server.wait_workers(n, deadline_after(opts.timeout))?;
        }
        Ok(TcpStore {
            client,
            server,
            host: opts.host,
            port,
        })
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server this store runs, if it is a master.
    pub fn server(&self) -> Option<&Arc<TcpServer>> {
        self.server.as_ref()
    }

    fn call(&self, req: Request) -> Result<Response> {
        checked(self.client.call(&req, None)?)
    }

    fn values(&self, keys: &[String], timeout: Option<Duration>) -> Result<Vec<Vec<u8>>> {
        let t = timeout.unwrap_or_else(|| self.timeout());
        let req = Request::Get {
            keys: keys.to_vec(),
            timeout_ms: millis(t),
        };
        let resp = self.client.call(&req, Some(t)).map_err(naming(keys))?;
        match waited(resp, t)? {
            Response::List(v) if v.len() == keys.len() => Ok(v),
            other => Err(unexpected(other)),
        }
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let req = Request::Set {
            key: key.to_owned(),
            value: value.to_vec(),
        };
        match self.call(req)? {
            Response::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }
    fn get(&self, key: &str, timeout: Option<Duration>) -> Result<Vec<u8>> {
        let mut v = self.values(&[key.to_owned()], timeout)?;
        Ok(v.swap_remove(0))
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let req = Request::Add {
            key: key.to_owned(),
            delta,
        };
        match self.call(req)? {
            Response::Int(v) => Ok(v),
            other => Err(unexpected(other)),
        }
    }
    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        let req = Request::Append {
            key: key.to_owned(),
            value: value.to_vec(),
        };
        match self.call(req)? {
            Response::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }
    fn check(&self, keys: &[String]) -> Result<bool> {
        match self.call(Request::Check {
            keys: keys.to_vec(),
        })? {
            Response::Bool(b) => Ok(b),
            other => Err(unexpected(other)),
        }
    }
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let req = Request::CompareSet {
            key: key.to_owned(),
            expected: expected.to_vec(),
            desired: desired.to_vec(),
        };
        match self.call(req)? {
            Response::Bytes(v) => Ok(v),
            other => Err(unexpected(other)),
        }
    }
    fn delete_key(&self, key: &str) -> Result<bool> {
        match self.call(Request::Delete {
            key: key.to_owned(),
        })? {
            Response::Bool(b) => Ok(b),
            other => Err(unexpected(other)),
        }
    }
    fn multi_get(&self, keys: &[String], timeout: Option<Duration>) -> Result<Vec<Vec<u8>>> {
        self.values(keys, timeout)
    }
    fn multi_set(&self, keys: &[String], values: &[Vec<u8>]) -> Result<()> {
        check_multi_set(keys, values)?;
        let req = Request::MultiSet {
            keys: keys.to_vec(),
            values: values.to_vec(),
        };
        match self.call(req)? {
            Response::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }
    fn num_keys(&self) -> Result<i64> {
        match self.call(Request::NumKeys)? {
            Response::Int(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }
    fn wait(&self, keys: &[String], timeout: Option<Duration>) -> Result<()> {
        let t = timeout.unwrap_or_else(|| self.timeout());
        let req = Request::Wait {
            keys: keys.to_vec(),
            timeout_ms: millis(t),
        };
        let resp = self.client.call(&req, Some(t)).map_err(naming(keys))?;
        match waited(resp, t)? {
            Response::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }
    fn timeout(&self) -> Duration {
        self.client.timeout()
    }
    fn set_timeout(&self, timeout: Duration) {
        self.client.set_timeout(timeout)
    }
}
