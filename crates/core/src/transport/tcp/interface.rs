//! Choosing the interface to listen on: `RUSTDIST_SOCKET_IFNAME` / `GLOO_SOCKET_IFNAME` in
//! NCCL_SOCKET_IFNAME's syntax, else the address that routes to MASTER_ADDR. Kept apart because
//! it reads only the environment and the system's interface list, nothing of the handshake.

use std::io;
use std::net::{IpAddr, Ipv4Addr, UdpSocket};

use crate::error::{Error, Result};

/// The variables naming the interface to use, in order of precedence.
pub const IFNAME_VARS: [&str; 2] = ["RUSTDIST_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"];

// ---------------------------------------------------------------------------------------------
// Choosing the interface

/// One IPv4 address of a network interface that is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub ip: Ipv4Addr,
}

/// The IPv4 addresses of the interfaces that are up, in the system's order.
pub fn interfaces() -> Result<Vec<Interface>> {
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `addrs` with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut addrs) } != 0 {
        return Err(Error::network(format!(
            "cannot list network interfaces: {}",
            io::Error::last_os_error()
        )));
    }
    let mut found = Vec::new();
    let mut cur = addrs;
    while !cur.is_null() {
        // SAFETY: `cur` is a non-null node of the list getifaddrs returned, alive until freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as libc::c_uint == 0 {
            continue;
        }
        // SAFETY: ifa_addr is non-null; the family says which sockaddr it is.
        if i32::from(unsafe { (*ifa.ifa_addr).sa_family }) != libc::AF_INET {
            continue;
        }
        // SAFETY: an AF_INET address is a sockaddr_in.
        let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        found.push(Interface {
            name: name.to_string_lossy().into_owned(),
            ip: Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
        });
    }
    // SAFETY: `addrs` came from getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(addrs) };
    Ok(found)
}

/// Picks the interface `spec` names, in NCCL_SOCKET_IFNAME's syntax: a comma-separated list of
/// name prefixes (`eth` matches eth0 and eth1), all exact names with a leading `=`, and an
/// exclusion list with a leading `^` (`^docker,lo`, `^=eth0`). With a list, its first entry
/// that matches an interface wins; with an exclusion list, the first interface in the system's
/// order that no entry matches, loopback only when nothing else is left. `var` names the
/// variable for the error, which lists the interfaces there are.
pub fn select_interface(var: &str, spec: &str, available: &[Interface]) -> Result<Interface> {
    let (exclude, rest) = match spec.trim().strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, spec.trim()),
    };
    let (exact, rest) = match rest.strip_prefix('=') {
        Some(rest) => (true, rest),
        None => (false, rest),
    };
    let entries: Vec<&str> = rest
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    let matches = |entry: &str, name: &str| {
        if exact {
            name == entry
        } else {
            name.starts_with(entry)
        }
    };
    let chosen = if exclude {
        let kept = || {
            available
                .iter()
                .filter(|i| !entries.iter().any(|e| matches(e, &i.name)))
        };
        kept()
            .find(|i| !i.ip.is_loopback())
            .or_else(|| kept().next())
    } else {
        entries
            .iter()
            .find_map(|e| available.iter().find(|i| matches(e, &i.name)))
    };
    chosen.cloned().ok_or_else(|| {
        let listed: Vec<String> = available
            .iter()
            .map(|i| format!("{} ({})", i.name, i.ip))
            .collect();
        Error::invalid(format!(
            "{var}={spec:?} matches no network interface that is up with an IPv4 address; \
             available: {}",
            if listed.is_empty() {
                "none".to_owned()
            } else {
                listed.join(", ")
            }
        ))
    })
}

/// The address to listen on: the interface `RUSTDIST_SOCKET_IFNAME` / `GLOO_SOCKET_IFNAME`
/// selects when set, else the local address that routes to MASTER_ADDR, else loopback.
pub(super) fn listen_ip() -> Result<IpAddr> {
    for var in IFNAME_VARS {
        if let Some(spec) = std::env::var(var).ok().filter(|s| !s.trim().is_empty()) {
            return select_interface(var, &spec, &interfaces()?).map(|i| IpAddr::V4(i.ip));
        }
    }
    let master = std::env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".into());
    let target = format!("{master}:9");
    let probe = UdpSocket::bind(("0.0.0.0", 0))
        .and_then(|s| s.connect(target.as_str()).map(|_| s))
        .and_then(|s| s.local_addr());
    Ok(probe
        .map(|a| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}
