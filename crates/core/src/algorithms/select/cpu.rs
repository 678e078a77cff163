//! The host's CPU kind ([`HostCpu`]), read from `vendor_id` in `/proc/cpuinfo`: the bands of
//! the single-copy algorithms depend on it (see `thresholds.rs`).

use std::ops::RangeInclusive;

use super::thresholds::{self, SingleCopyBands};

/// The CPU of the host, on which the bands of the single-copy algorithms (one copy by the
/// kernel from or to a peer's memory instead of two through the slots) depend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HostCpu {
    Intel,
    #[default]
    Other,
}

impl HostCpu {
    /// This host's, from `vendor_id` in /proc/cpuinfo (read once).
    pub fn of_this_host() -> HostCpu {
        static CPU: std::sync::OnceLock<HostCpu> = std::sync::OnceLock::new();
        *CPU.get_or_init(|| {
            let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
            HostCpu::from_cpuinfo(&info)
        })
    }

    fn from_cpuinfo(info: &str) -> HostCpu {
        let vendor = info
            .lines()
            .find_map(|l| l.strip_prefix("vendor_id"))
            .and_then(|rest| rest.split(':').nth(1))
            .map(str::trim);
        match vendor {
            Some("GenuineIntel") => HostCpu::Intel,
            _ => HostCpu::Other,
        }
    }

    /// This CPU kind's table of single-copy bands.
    fn bands(self) -> &'static SingleCopyBands {
        match self {
            HostCpu::Intel => &thresholds::INTEL,
            HostCpu::Other => &thresholds::OTHER,
        }
    }

    /// From how many bytes an all_reduce in shared memory (past the one-shot's sizes) has every
    /// rank reduce its slice from the same slice of the peers' buffers, read straight from
    /// their memory, where the ranks may (None: never; docs/tuning.md, "Single-copy
    /// all_reduce").
    pub fn single_copy_all_reduce_min_bytes(self, pair: bool) -> Option<usize> {
        match pair {
            true => self.bands().all_reduce_pair_min_bytes,
            false => self.bands().all_reduce_min_bytes,
        }
    }

    /// From how many bytes per rank an all_to_all of equal blocks in shared memory has every
    /// rank read its block straight from each peer's input, where the ranks may (None: never;
    /// with more ranks than cores, at least `SHARED_CORES_SINGLE_COPY_ALL_TO_ALL_MIN_BYTES`;
    /// docs/tuning.md, "Single-copy all_to_all").
    pub fn single_copy_all_to_all_min_bytes(self) -> Option<usize> {
        self.bands().all_to_all_min_bytes
    }

    /// A broadcast in shared memory from this many bytes copies straight between the root's
    /// memory and the others' where the ranks may (the readers read, the root writes each
    /// its own segment; docs/tuning.md, "Single-copy broadcast").
    pub fn single_copy_broadcast_min_bytes(self) -> Option<usize> {
        self.bands().broadcast_min_bytes
    }

    /// An all_gather of this many bytes (gathered) in shared memory reads every peer's input
    /// straight from its memory where the ranks may (docs/tuning.md, "Single-copy
    /// all_gather").
    pub fn single_copy_bytes(self) -> RangeInclusive<usize> {
        self.bands().all_gather_bytes.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_cpu_from_vendor_id() {
        let intel = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n";
        assert_eq!(HostCpu::from_cpuinfo(intel), HostCpu::Intel);
        let amd = "processor\t: 0\nvendor_id\t: AuthenticAMD\n";
        assert_eq!(HostCpu::from_cpuinfo(amd), HostCpu::Other);
        assert_eq!(
            HostCpu::from_cpuinfo("processor : 0\nCPU implementer : 0x41\n"),
            HostCpu::Other
        );
        assert_eq!(HostCpu::from_cpuinfo(""), HostCpu::Other);
    }
}
