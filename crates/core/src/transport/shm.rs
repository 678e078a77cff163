//! Shared memory between ranks on one host: links (byte pipes) and the collective workspace.
//!
//! Each rank owns one segment holding its doorbell, one single-producer single-consumer byte
//! ring per peer (the peer writes, this rank reads) and its region of the group's workspace
//! (`workspace.rs`). A link to peer p reads from the ring p
//! writes in our segment and writes into the ring for us in p's segment. The byte stream is the
//! same framed stream the TCP links carry, so the mesh's progress loop serves both. A waiter
//! sleeps on its own doorbell (a futex in shared memory) that writers ring; the TCP connection
//! to the peer stays open only to notice a peer that dies (EOF).

use std::io::{self, IoSlice};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::store::Store;
use crate::timeout::remaining;
use crate::transport::cma;
use crate::transport::shm_object::SharedObject;
use crate::transport::workspace::{Workspace, REGION_BYTES};

/// Bytes of one ring's data area: large enough that big messages move in few wake-ups, small
/// enough to stay cache-friendly.
const RING_BYTES: usize = 1 << 20;
/// The rings of one segment (one per rank of the group) share this much at most, down to
/// `MIN_RING_BYTES` each: a segment of a world of 512 would otherwise map 512 MiB.
const RING_BUDGET_BYTES: usize = 64 << 20;
const MIN_RING_BYTES: usize = 64 << 10;
const LINE: usize = 64;
const BELL_BYTES: usize = 2 * LINE;
const RING_HEADER: usize = 2 * LINE;

/// The data bytes of each ring of a segment made for a group of `slots` ranks (a power of
/// two): `RING_BYTES` up to 64 ranks, less beyond.
fn ring_bytes(slots: usize) -> usize {
    let share = RING_BUDGET_BYTES / slots.max(1);
    let pow2 = if share.is_power_of_two() {
        share
    } else {
        share.next_power_of_two() / 2
    };
    pow2.clamp(MIN_RING_BYTES, RING_BYTES)
}

fn ring_stride(slots: usize) -> usize {
    RING_HEADER + ring_bytes(slots)
}

/// One rank's segment: its doorbell, a ring per peer and its workspace region.
pub struct Segment {
    obj: SharedObject,
    /// Ring slots: the size of the group it was made for.
    slots: usize,
}

impl Segment {
    /// Offset of the workspace region: after the rings, on a page boundary.
    fn workspace_offset(size: usize) -> usize {
        (BELL_BYTES + size * ring_stride(size)).div_ceil(4096) * 4096
    }

    fn len_for(size: usize) -> usize {
        Self::workspace_offset(size) + REGION_BYTES
    }

    /// Creates this rank's segment with one ring slot per rank of a group of `size`. Sparse:
    /// only the parts the ranks on this host use are reserved, once they are known
    /// (`reserve`); a ring per rank of a large group would be hundreds of MiB.
    fn create(name: &str, size: usize) -> Result<Segment> {
        Ok(Segment {
            obj: SharedObject::create(name, Self::len_for(size))?,
            slots: size,
        })
    }

    /// Maps a peer's segment created with the same `size`.
    fn open(name: &str, size: usize) -> Result<Segment> {
        Ok(Segment {
            obj: SharedObject::open(name, Self::len_for(size))?,
            slots: size,
        })
    }

    fn base(&self) -> *mut u8 {
        self.obj.base()
    }

    /// Reserves the pages this host's ranks will use (the doorbell, the rings of `writers`,
    /// the workspace), so that a full /dev/shm fails here, not with SIGBUS on first use.
    fn reserve(&self, writers: &[usize]) -> Result<()> {
        let stride = ring_stride(self.slots);
        let ranges = std::iter::once((0, BELL_BYTES))
            .chain(writers.iter().map(|&w| (BELL_BYTES + w * stride, stride)))
            .chain(std::iter::once((
                Self::workspace_offset(self.slots),
                REGION_BYTES,
            )));
        self.obj
            .reserve(ranges, &format!("the {} ranks on this host", writers.len()))
    }

    /// Removes the name once every peer has mapped it, so nothing outlives the processes.
    fn unlink(&mut self) {
        self.obj.unlink();
    }

    fn bell(&self) -> &Bell {
        // SAFETY: the segment starts with a Bell-sized, 64-byte aligned area (mmap is
        // page-aligned) that lives as long as the mapping.
        unsafe { &*(self.base() as *const Bell) }
    }

    /// The ring that rank `writer` fills in this segment.
    fn ring(&self, writer: usize) -> Ring {
        // SAFETY: writer < size, so the ring lies inside the mapping.
        let hdr = unsafe {
            self.base()
                .add(BELL_BYTES + writer * ring_stride(self.slots))
        };
        // SAFETY: the header's two lines and the data area lie inside the mapping.
        let (tail, data) = unsafe { (hdr.add(LINE), hdr.add(RING_HEADER)) };
        Ring {
            head: hdr as *const AtomicU64,
            tail: tail as *const AtomicU64,
            data,
            cap: ring_bytes(self.slots),
        }
    }
}

/// A rank's doorbell: `seq` is the futex word, `sleepers` says whether ringing must wake.
#[repr(C)]
pub(crate) struct Bell {
    seq: AtomicU32,
    sleepers: AtomicU32,
}

impl Bell {
    /// Wakes the rank if it sleeps. SeqCst pairs with [`Bell::sleep`]: a sleeper either
    /// sees what was published before this call or is woken by it.
    pub(crate) fn ring_if_sleeping(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.ring();
        }
    }

    fn ring(&self) {
        self.seq.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            // SAFETY: FUTEX_WAKE on a valid, aligned u32 in shared memory.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.seq.as_ptr(),
                    libc::FUTEX_WAKE,
                    i32::MAX,
                    std::ptr::null::<libc::timespec>(),
                    std::ptr::null::<u32>(),
                    0,
                )
            };
        }
    }

    /// Sleeps until a peer rings this rank's doorbell or `timeout` passes, unless `ready`
    /// (re-checked after announcing the sleep, so no ring is missed) says there is work.
    pub(crate) fn sleep(&self, timeout: Duration, ready: impl FnOnce() -> bool) {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        // `ready` reads the rings and flags with Acquire, not SeqCst: without this fence the
        // memory model lets those reads miss a store whose writer then read `sleepers` as 0.
        fence(Ordering::SeqCst);
        let seen = self.seq.load(Ordering::SeqCst);
        if !ready() {
            let ts = libc::timespec {
                tv_sec: timeout.as_secs() as libc::time_t,
                tv_nsec: timeout.subsec_nanos() as libc::c_long,
            };
            // SAFETY: FUTEX_WAIT on a valid, aligned u32 in shared memory with a valid timeout;
            // it returns at once if the word no longer equals `seen`.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.seq.as_ptr(),
                    libc::FUTEX_WAIT,
                    seen,
                    &ts as *const libc::timespec,
                    std::ptr::null::<u32>(),
                    0,
                )
            };
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One SPSC byte ring: `head` and `tail` count bytes ever written and read.
struct Ring {
    head: *const AtomicU64,
    tail: *const AtomicU64,
    data: *mut u8,
    /// Bytes of the data area.
    cap: usize,
}

impl Ring {
    fn head(&self) -> &AtomicU64 {
        // SAFETY: points into a live mapping (see `ShmPipe`'s Send impl), aligned to a line.
        unsafe { &*self.head }
    }

    fn tail(&self) -> &AtomicU64 {
        // SAFETY: as for `head`.
        unsafe { &*self.tail }
    }

    /// Copies as much of `bufs` as fits; returns the bytes written.
    fn write(&self, bufs: &[IoSlice<'_>]) -> usize {
        let head = self.head().load(Ordering::Relaxed);
        let tail = self.tail().load(Ordering::Acquire);
        let mut free = self.cap - (head - tail) as usize;
        let mut pos = head;
        for b in bufs {
            let n = b.len().min(free);
            self.copy_in(pos, &b[..n]);
            pos += n as u64;
            free -= n;
            if free == 0 {
                break;
            }
        }
        self.head().store(pos, Ordering::SeqCst);
        (pos - head) as usize
    }

    fn copy_in(&self, pos: u64, src: &[u8]) {
        let at = (pos % self.cap as u64) as usize;
        let first = src.len().min(self.cap - at);
        // SAFETY: both ranges lie inside the ring's data area, in the part the consumer has
        // released (head - tail <= cap), so nobody reads them concurrently.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.data.add(at), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), self.data, src.len() - first);
        }
    }

    /// Copies up to `buf.len()` available bytes out; returns the bytes read.
    fn read(&self, buf: &mut [u8]) -> usize {
        let tail = self.tail().load(Ordering::Relaxed);
        let head = self.head().load(Ordering::Acquire);
        let n = ((head - tail) as usize).min(buf.len());
        if n == 0 {
            return 0;
        }
        let at = (tail % self.cap as u64) as usize;
        let first = n.min(self.cap - at);
        // SAFETY: [tail, tail + n) was published by the producer (head >= tail + n) and is not
        // overwritten until we advance tail.
        unsafe {
            std::ptr::copy_nonoverlapping(self.data.add(at), buf.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(self.data, buf.as_mut_ptr().add(first), n - first);
        }
        self.tail().store(tail + n as u64, Ordering::SeqCst);
        n
    }

    fn has_data(&self) -> bool {
        self.head().load(Ordering::Acquire) != self.tail().load(Ordering::Relaxed)
    }

    fn has_space(&self) -> bool {
        self.head().load(Ordering::Relaxed) - self.tail().load(Ordering::Acquire) < self.cap as u64
    }
}

/// This rank's view of the host's shared memory: its own segment and its peers'.
pub struct ShmHost {
    own: Segment,
    /// The local peers' segments, by group rank.
    peers: Vec<Option<Segment>>,
    /// Ring slots of every segment: the size of the group they were made for (a shrunk group
    /// keeps its parent's segments).
    slots: usize,
    /// CPUs the ranks on this host may run on between them (the union of their affinity).
    cores: usize,
    /// Process id by group rank (of the ranks on this host) when they can all read each
    /// other's memory (`cma`); None otherwise.
    pids: Option<Vec<i32>>,
}

impl ShmHost {
    /// The workspace of the ranks on this host (this one is group rank `me`).
    pub fn workspace(&self, me: usize) -> Workspace {
        let at = Segment::workspace_offset(self.slots);
        let mut ranks = Vec::new();
        let mut regions = Vec::new();
        for p in 0..self.peers.len() {
            let seg = if p == me {
                Some(&self.own)
            } else {
                self.peers[p].as_ref()
            };
            if let Some(seg) = seg {
                ranks.push(p);
                // SAFETY: the region lies inside the mapping (len_for covers it).
                regions.push(unsafe { seg.base().add(at) });
            }
        }
        let local = ranks.iter().position(|&r| r == me).unwrap_or(0);
        let pids = self
            .pids
            .as_ref()
            .map(|pids| ranks.iter().map(|&r| pids[r]).collect());
        // SAFETY: every region is REGION_BYTES of a page-aligned, zero-filled shared mapping
        // that this host (owned by the same transport as the workspace) keeps mapped.
        let ws = unsafe { Workspace::new(local, ranks, regions) };
        ws.with_pids(pids).with_cores(self.cores)
    }

    /// Wakes the local ranks (group ranks `ranks`) that sleep on their doorbells.
    pub fn wake(&self, ranks: &[usize], me: usize) {
        for &p in ranks {
            if p != me {
                if let Some(seg) = self.peers[p].as_ref() {
                    seg.bell().ring_if_sleeping();
                }
            }
        }
    }

    fn unlink_own(&mut self) {
        self.own.unlink();
    }

    /// The shared memory of a group shrunk to the ranks `keep` (this group's ranks, in the new
    /// group's order): the segments of the others are unmapped. Pipes made before keep
    /// working; new ones cannot be made (their rings are numbered by this group's ranks).
    pub fn shrink(mut self, keep: &[usize]) -> ShmHost {
        let peers = keep.iter().map(|&r| self.peers[r].take()).collect();
        let pids = self
            .pids
            .map(|pids| keep.iter().map(|&r| pids[r]).collect());
        ShmHost {
            own: self.own,
            peers,
            slots: self.slots,
            cores: self.cores,
            pids,
        }
    }

    /// Zeroes this rank's workspace region, for a new workspace over it.
    ///
    /// # Safety
    /// No rank reads or writes the region meanwhile: every local peer has left the workspace
    /// the region served, and none has joined the next one yet.
    pub unsafe fn clear_own_region(&self) {
        let at = Segment::workspace_offset(self.slots);
        // SAFETY: the region lies inside the mapping (len_for covers it); the caller promises
        // that nobody else touches it.
        unsafe { std::ptr::write_bytes(self.own.base().add(at), 0, REGION_BYTES) };
    }

    /// The pipe between this rank (`me`) and peer `p`, if p shares the host.
    pub fn pipe(&self, me: usize, p: usize) -> Option<ShmPipe> {
        let theirs = self.peers.get(p)?.as_ref()?;
        Some(ShmPipe {
            rx: self.own.ring(p),
            tx: theirs.ring(me),
            peer_bell: theirs.bell() as *const Bell,
        })
    }

    fn own_bell(&self) -> &Bell {
        self.own.bell()
    }

    /// Sleeps until a peer rings this rank's doorbell or `timeout` passes, unless `ready`
    /// (re-checked after announcing the sleep, so no ring is missed) says there is work.
    pub fn sleep(&self, timeout: Duration, ready: impl FnOnce() -> bool) {
        self.own_bell().sleep(timeout, ready)
    }
}

/// A bidirectional byte pipe to one peer through shared memory.
pub struct ShmPipe {
    rx: Ring,
    tx: Ring,
    peer_bell: *const Bell,
}

// SAFETY: the raw pointers point into mappings owned by the ShmHost that outlives every pipe
// (both live in the same transport and are dropped together, pipes first).
unsafe impl Send for ShmPipe {}

impl ShmPipe {
    fn peer_bell(&self) -> &Bell {
        // SAFETY: see the Send impl: the mapping outlives the pipe.
        unsafe { &*self.peer_bell }
    }

    /// Non-blocking read: `WouldBlock` when the ring is empty.
    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        match self.rx.read(buf) {
            0 => Err(io::ErrorKind::WouldBlock.into()),
            n => {
                // The writer may be waiting for the space just freed.
                self.peer_bell().ring();
                Ok(n)
            }
        }
    }

    /// Non-blocking write: `WouldBlock` when the ring is full.
    pub fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self.tx.write(bufs) {
            0 if bufs.iter().any(|b| !b.is_empty()) => Err(io::ErrorKind::WouldBlock.into()),
            n => {
                self.peer_bell().ring();
                Ok(n)
            }
        }
    }

    pub fn has_data(&self) -> bool {
        self.rx.has_data()
    }

    pub fn has_space(&self) -> bool {
        self.tx.has_space()
    }
}

/// Identifies this machine (and boot), so that ranks can tell which peers share memory with it.
/// `RUSTDIST_HOST_ID` overrides it (to split ranks of one machine into test "hosts").
fn host_identity() -> String {
    if let Ok(id) = std::env::var("RUSTDIST_HOST_ID") {
        return id;
    }
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most `name.len()` bytes into the buffer.
    let ok = unsafe { libc::gethostname(name.as_mut_ptr() as *mut libc::c_char, name.len()) } == 0;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let host = if ok {
        String::from_utf8_lossy(&name[..end]).into_owned()
    } else {
        String::new()
    };
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{host}/{}", boot.trim())
}

/// The CPUs this process may run on (its affinity), as a comma list; empty when unknown.
fn allowed_cpus() -> String {
    // SAFETY: cpu_set_t is plain bits, for which all zeroes is a valid (empty) value.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most the size passed, that of `set`.
    let ok =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) }
            == 0;
    if !ok {
        return String::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE, inside `set`.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// How many CPUs `local` ranks may use between them, from the lists each published
/// (`allowed_cpus`); this process's own count when one is missing or unreadable.
fn shared_cores<'a>(local: impl Iterator<Item = &'a str>) -> usize {
    let mut union = std::collections::BTreeSet::new();
    for list in local {
        let cpus: Option<Vec<usize>> = list.split(',').map(|c| c.parse().ok()).collect();
        match cpus {
            Some(cpus) if !list.is_empty() => union.extend(cpus),
            _ => return std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
    union.len()
}

/// Host index of every rank, hosts numbered by their lowest rank; `keys[p]` is rank p's host
/// key, empty for a rank without shared memory (a host of its own).
fn hosts_of(keys: &[String]) -> Vec<usize> {
    let mut host_of: Vec<usize> = Vec::with_capacity(keys.len());
    let mut hosts = 0;
    for (p, key) in keys.iter().enumerate() {
        let same = (0..p).find(|&q| !key.is_empty() && keys[q] == *key);
        host_of.push(match same {
            Some(q) => host_of[q],
            None => {
                hosts += 1;
                hosts - 1
            }
        });
    }
    host_of
}

/// Sets up shared memory with the peers on this host: each rank's segment (pipes and its
/// workspace region) mapped by the others. Returns it (None when no peer shares the host, or
/// this rank could not create its segment: its pairs stay on TCP) and the host index of every
/// rank, which every rank computes the same from what all published.
pub fn share_memory(
    store: &dyn Store,
    prefix: &str,
    rank: usize,
    size: usize,
    group: u32,
    deadline: Instant,
) -> Result<(Option<ShmHost>, Vec<usize>)> {
    if size == 1 {
        return Ok((None, vec![0]));
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let name = format!(
        "/rustdist-{}-{group:x}-{rank}-{stamp:x}",
        std::process::id()
    );
    let own = Segment::create(&name, size).ok();
    let published = match &own {
        Some(_) => format!(
            "{}\n{name}\n{}\n{}:{}",
            host_identity(),
            allowed_cpus(),
            cma::pid(),
            cma::probe_address()
        ),
        None => String::new(),
    };
    store.set(&format!("{prefix}/shm/{rank}"), published.as_bytes())?;
    let mut keys = Vec::with_capacity(size);
    let mut names = Vec::with_capacity(size);
    let mut cpus = Vec::with_capacity(size);
    let mut probes = Vec::with_capacity(size);
    // Every entry in one request: the store serves O(world) requests for the group, not O(world²).
    let wanted: Vec<String> = (0..size).map(|p| format!("{prefix}/shm/{p}")).collect();
    let entries = store.multi_get(&wanted, remaining(deadline))?;
    for entry in &entries {
        let text = String::from_utf8_lossy(entry);
        let (host, rest) = text.split_once('\n').unwrap_or(("", ""));
        let (seg, rest) = rest.split_once('\n').unwrap_or((rest, ""));
        let (allowed, probe) = rest.split_once('\n').unwrap_or((rest, ""));
        keys.push(host.to_string());
        names.push(seg.to_string());
        cpus.push(allowed.to_string());
        probes.push(
            probe.split_once(':').and_then(|(pid, addr)| {
                Some((pid.parse::<i32>().ok()?, addr.parse::<usize>().ok()?))
            }),
        );
    }
    let host_of = hosts_of(&keys);
    let Some(own) = own else {
        return Ok((None, host_of));
    };
    let writers: Vec<usize> = (0..size)
        .filter(|&p| p != rank && host_of[p] == host_of[rank])
        .collect();
    own.reserve(&writers)?;
    let mut segments: Vec<Option<Segment>> = (0..size).map(|_| None).collect();
    for (p, slot) in segments.iter_mut().enumerate() {
        if p != rank && host_of[p] == host_of[rank] {
            *slot = Some(Segment::open(&names[p], size)?);
        }
    }
    // Whether this rank can read every local peer's memory (single-copy transfers); it says
    // so with the key that also tells the peers it has mapped their segments.
    let readable = (0..size)
        .filter(|&p| segments[p].is_some())
        .all(|p| probes[p].is_some_and(|(pid, addr)| cma::probe(pid, addr)));
    let verdict: &[u8] = if readable { b"1" } else { b"0" };
    // Once every local peer has mapped our segment its name can go: nothing leaks in /dev/shm.
    store.set(&format!("{prefix}/shm_mapped/{rank}"), verdict)?;
    let local: Vec<String> = (0..size)
        .filter(|&p| segments[p].is_some())
        .map(|p| format!("{prefix}/shm_mapped/{p}"))
        .collect();
    if local.is_empty() {
        return Ok((None, host_of));
    }
    let verdicts = store.multi_get(&local, remaining(deadline))?;
    let single_copy = readable && verdicts.iter().all(|v| v == b"1");
    let cores = shared_cores(
        (0..size)
            .filter(|&p| host_of[p] == host_of[rank])
            .map(|p| cpus[p].as_str()),
    );
    // Group rank -> process id of the ranks on this host, every one of which can read every
    // other's memory (whether reading pays is select's call).
    let pids = single_copy.then(|| {
        (0..size)
            .map(|p| {
                if p == rank {
                    cma::pid()
                } else {
                    probes[p].map_or(0, |(pid, _)| pid)
                }
            })
            .collect()
    });
    let mut host = ShmHost {
        own,
        peers: segments,
        slots: size,
        cores,
        pids,
    };
    host.unlink_own();
    Ok((Some(host), host_of))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_count() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }

    #[test]
    fn shared_cores_counts_the_union_of_the_local_ranks_cpus() {
        assert_eq!(shared_cores(["0", "1"].into_iter()), 2);
        assert_eq!(shared_cores(["0", "0"].into_iter()), 1);
        assert_eq!(shared_cores(["0,1", "1,2,3"].into_iter()), 4);
    }

    #[test]
    fn shared_cores_falls_back_to_this_process_when_a_list_is_missing_or_bad() {
        assert_eq!(shared_cores(["0", ""].into_iter()), own_count());
        assert_eq!(shared_cores(["0", "1,x"].into_iter()), own_count());
    }

    #[test]
    fn rings_shrink_past_64_ranks_and_carry_bytes_across_their_wrap() {
        assert_eq!(ring_bytes(2), RING_BYTES);
        assert_eq!(ring_bytes(64), RING_BYTES);
        assert_eq!(ring_bytes(100), 512 << 10);
        assert_eq!(ring_bytes(512), 128 << 10);
        assert_eq!(ring_bytes(100_000), MIN_RING_BYTES);
        // A segment of a world of 1,024 (64 KiB rings): bytes through ring 700 in pieces that
        // straddle its end come out whole and in order.
        let name = format!("/rustdist-test-{}-ring", std::process::id());
        let seg = Segment::create(&name, 1024).unwrap();
        seg.reserve(&[700]).unwrap();
        let ring = seg.ring(700);
        let sent: Vec<u8> = (0..3 * MIN_RING_BYTES).map(|i| (i % 251) as u8).collect();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 40_000];
        let mut at = 0;
        while got.len() < sent.len() {
            at += ring.write(&[IoSlice::new(&sent[at..(at + 50_000).min(sent.len())])]);
            let n = ring.read(&mut buf);
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got == sent, "bytes changed in the ring");
    }

    #[test]
    fn allowed_cpus_lists_this_process_affinity() {
        let list = allowed_cpus();
        assert_eq!(shared_cores([list.as_str()].into_iter()), own_count());
    }
}
