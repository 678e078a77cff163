//! An eventfd that wakes a poll(2): how the group's job queue wakes a worker asleep on its
//! links, and how a group's on-demand links wake its progress loop.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// An eventfd that wakes a poll(2): rung by whoever has news for the poller, which polls it
/// and drains it before looking for the news.
pub struct Wake {
    fd: File,
}

impl Wake {
    pub fn new() -> io::Result<Wake> {
        // SAFETY: eventfd takes no pointers; its result is checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        Ok(Wake { fd })
    }

    /// Makes the next (or the current) poll of it return.
    pub fn ring(&self) {
        // A full counter (never, at one per ring) would only mean it is readable already.
        let _ = (&self.fd).write(&1u64.to_ne_bytes());
    }

    /// Takes the rings so far: polls block again until the next.
    pub fn drain(&self) {
        let _ = (&self.fd).read(&mut [0u8; 8]);
    }

    pub fn pollfd(&self) -> libc::pollfd {
        libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }
    }
}
