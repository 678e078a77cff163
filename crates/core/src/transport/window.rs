//! A one-sided window's memory on one host (torch's `Window`, UNIFIED access): a shared-memory
//! object per rank holding a doorbell, a state word, one signal counter per peer and the
//! registered bytes, mapped by every rank of the host. A `put` is a copy into the target's
//! bytes; a `signal` bumps the target's counter for the sender (SeqCst, after the puts it
//! follows) and rings its doorbell; a waiter spins briefly on its counter, then sleeps on its
//! doorbell (no core burnt while idle).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::spin::Spin;
use crate::timeout::remaining;
use crate::transport::shm::Bell;
use crate::transport::shm_object::SharedObject;

const LINE: usize = 64;
const PAGE: usize = 4096;
/// The state word's values: registered, then deregistered (puts into it are refused).
const OPEN: u32 = 0;
const CLOSED: u32 = 1;
/// A sleeping waiter looks at the group's health this often.
const HEALTH_CHECK: Duration = Duration::from_millis(20);

/// One rank's window memory on this host, its own or a peer's.
pub struct WindowMemory {
    obj: SharedObject,
    /// Signal counters: one per rank of the group.
    slots: usize,
    bytes: usize,
}

impl WindowMemory {
    /// Offset of the registered bytes: after the doorbell line and the counters, on a page.
    fn data_offset(slots: usize) -> usize {
        (LINE * (1 + slots)).div_ceil(PAGE) * PAGE
    }

    fn len_for(slots: usize, bytes: usize) -> usize {
        Self::data_offset(slots) + bytes.max(1)
    }

    /// Creates this rank's window memory (`bytes` registered bytes, zeroed, reserved) for a
    /// group of `slots` ranks, under the shared-memory name `name`.
    pub fn create(name: &str, slots: usize, bytes: usize) -> Result<WindowMemory> {
        let obj = SharedObject::create(name, Self::len_for(slots, bytes))?;
        obj.reserve(
            std::iter::once((0, obj.len())),
            &format!("a window of {bytes} bytes"),
        )?;
        Ok(WindowMemory { obj, slots, bytes })
    }

    /// Maps a peer's window memory made by [`WindowMemory::create`] with the same sizes.
    pub fn open(name: &str, slots: usize, bytes: usize) -> Result<WindowMemory> {
        let obj = SharedObject::open(name, Self::len_for(slots, bytes))?;
        Ok(WindowMemory { obj, slots, bytes })
    }

    /// Removes the name (once every peer has mapped it).
    pub fn unlink(&mut self) {
        self.obj.unlink();
    }

    /// The registered bytes' first byte.
    pub fn data(&self) -> *mut u8 {
        // SAFETY: the data lies inside the mapping (len_for covers it).
        unsafe { self.obj.base().add(Self::data_offset(self.slots)) }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn bell(&self) -> &Bell {
        // SAFETY: the mapping starts with a Bell-sized, line-aligned area (mmap is
        // page-aligned) that lives as long as the mapping.
        unsafe { &*(self.obj.base() as *const Bell) }
    }

    fn state(&self) -> &AtomicU32 {
        // SAFETY: bytes 8..12 of the first line, after the Bell's two words, aligned.
        unsafe { &*(self.obj.base().add(8) as *const AtomicU32) }
    }

    /// The signals rank `from` has sent so far.
    pub fn signals_from(&self, from: usize) -> u64 {
        self.counter(from).load(Ordering::Acquire)
    }

    /// The count of signals rank `from` has sent to this memory's owner.
    fn counter(&self, from: usize) -> &AtomicU64 {
        assert!(from < self.slots, "signal slot {from} of {}", self.slots);
        // SAFETY: line 1 + from lies inside the mapping (from < slots), 8-byte aligned.
        unsafe { &*(self.obj.base().add(LINE * (1 + from)) as *const AtomicU64) }
    }

    /// Marks the window deregistered: later puts into it fail.
    pub fn close(&self) {
        self.state().store(CLOSED, Ordering::SeqCst);
        self.bell().ring_if_sleeping();
    }

    pub fn is_open(&self) -> bool {
        self.state().load(Ordering::SeqCst) == OPEN
    }

    /// Copies `src` to byte `offset` of the registered bytes (of rank `owner`, for messages).
    ///
    /// # Safety
    /// `src` points to `len` readable bytes that stay valid for the call (they may overlap
    /// the window: the copy is a memmove).
    pub unsafe fn write(
        &self,
        offset: usize,
        src: *const u8,
        len: usize,
        owner: usize,
    ) -> Result<()> {
        self.check_put(offset, len, owner)?;
        // SAFETY: [offset, offset + len) lies inside the registered bytes (checked above); the
        // caller vouches for src.
        unsafe { std::ptr::copy(src, self.data().add(offset), len) };
        Ok(())
    }

    /// The `len` registered bytes from byte `offset`, for a put arriving on a link to land in
    /// (of rank `owner`, for messages); checked as [`WindowMemory::write`] checks.
    ///
    /// # Safety
    /// Nothing else in this process writes those bytes while the slice lives (the engine
    /// applies one put at a time; the owner's program reading them meanwhile sees a torn put,
    /// as with any one-sided put it has not waited for a signal of).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn landing(&self, offset: usize, len: usize, owner: usize) -> Result<&mut [u8]> {
        self.check_put(offset, len, owner)?;
        // SAFETY: inside the registered bytes (checked above); exclusive as the caller vouches.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.data().add(offset), len) })
    }

    fn check_put(&self, offset: usize, len: usize, owner: usize) -> Result<()> {
        if !self.is_open() {
            return Err(Error::invalid(format!(
                "rank {owner}'s window was deregistered (tensor_deregister)"
            )));
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.bytes => {}
            _ => {
                return Err(Error::invalid(format!(
                    "a put of {len} bytes at byte {offset} does not fit rank {owner}'s window of {} bytes",
                    self.bytes
                )))
            }
        }
        Ok(())
    }

    /// Counts a signal from rank `from` and wakes the owner if it sleeps. SeqCst: the owner
    /// that sees the count also sees every write made before it.
    pub fn signal(&self, from: usize) {
        self.counter(from).fetch_add(1, Ordering::SeqCst);
        self.bell().ring_if_sleeping();
    }

    /// Waits until rank `from` has sent at least `count` signals, until `deadline`; `health`
    /// is asked between naps and its error ends the wait (a dead peer, an aborted group).
    pub fn wait(
        &self,
        from: usize,
        count: u64,
        deadline: Instant,
        health: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let counter = self.counter(from);
        let arrived = || counter.load(Ordering::Acquire) >= count;
        let mut spin = Spin::shared_memory(false);
        while !arrived() {
            if spin.again() {
                continue;
            }
            health()?;
            let Some(left) = remaining(deadline) else {
                return Err(Error::backend(format!(
                    "wait_signal timed out waiting for rank {from}'s signal"
                )));
            };
            self.bell().sleep(left.min(HEALTH_CHECK), arrived);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_put_then_a_signal_reach_the_owner_in_order_and_bounds_are_kept() {
        let name = format!("/rustdist-test-{}-window", std::process::id());
        let mut own = WindowMemory::create(&name, 2, 16).unwrap();
        let peer = WindowMemory::open(&name, 2, 16).unwrap();
        own.unlink();
        let payload = [7u8; 8];
        let healthy = || Ok(());
        let writer = std::thread::spawn(move || {
            // SAFETY: payload is 8 bytes, alive for the call.
            unsafe { peer.write(8, payload.as_ptr(), 8, 0) }.unwrap();
            peer.signal(1);
            peer
        });
        own.wait(1, 1, Instant::now() + Duration::from_secs(30), &healthy)
            .unwrap();
        // SAFETY: 16 registered bytes, written before the signal the wait saw.
        let data = unsafe { std::slice::from_raw_parts(own.data(), 16) };
        assert_eq!(&data[8..], &payload);
        let peer = writer.join().unwrap();
        // SAFETY: payload is 8 bytes.
        let past = unsafe { peer.write(12, payload.as_ptr(), 8, 0) };
        assert!(past.unwrap_err().to_string().contains("does not fit"));
        let late = own.wait(1, 2, Instant::now() + Duration::from_millis(30), &healthy);
        assert!(late.unwrap_err().to_string().contains("timed out"));
        own.close();
        // SAFETY: payload is 8 bytes.
        let closed = unsafe { peer.write(0, payload.as_ptr(), 8, 0) };
        assert!(closed.unwrap_err().to_string().contains("deregistered"));
    }
}
