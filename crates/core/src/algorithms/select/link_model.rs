//! What selection knows of a group's TCP links ([`LinkModel`]: latency and bandwidth), from
//! `RUSTDIST_LINK_LATENCY_US` and `RUSTDIST_LINK_BANDWIDTH` over what connecting
//! [`Measured`], and how a TCP threshold measured on the reference link scales to another.

use std::time::Duration;

use crate::error::{Error, Result};

/// The environment variables that configure the TCP link model (else: what connecting
/// measured, see [`Measured`]).
pub const LATENCY_ENV: &str = "RUSTDIST_LINK_LATENCY_US";
pub const BANDWIDTH_ENV: &str = "RUSTDIST_LINK_BANDWIDTH";

/// What selection knows of a group's TCP links (the same on every rank of the group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkModel {
    /// One-way latency of a small message.
    pub latency: Duration,
    /// Bytes per second one connection moves.
    pub bandwidth: u64,
}

/// What connecting measured of a group's TCP links, the same on every rank (None: not
/// measured, e.g. no link joins two hosts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Measured {
    /// Half the shortest handshake round trip.
    pub latency: Option<Duration>,
    /// The slowest link between hosts, bytes per second.
    pub bandwidth: Option<u64>,
}

impl Default for LinkModel {
    fn default() -> Self {
        LinkModel::REFERENCE
    }
}

impl LinkModel {
    /// TCP loopback between processes on this project's 2-core VM, where the TCP thresholds
    /// were measured: half the connect handshake's round trip, and one stream's rate.
    pub const REFERENCE: LinkModel = LinkModel {
        latency: Duration::from_micros(40),
        bandwidth: 2_000_000_000,
    };

    /// A measured latency below this is mostly scheduling noise and the reference's stands
    /// in, so that selection does not wander between runs (docs/tuning.md, "Link model").
    const MEASURED_LATENCY_MIN: Duration = Duration::from_micros(160);
    /// Links slower than this (half the reference's) limit a collective more than the hosts
    /// do.
    pub(super) const SLOW_BANDWIDTH: u64 = Self::REFERENCE.bandwidth / 2;
    /// A measured bandwidth counts only below this: a probe of a faster link is bound by the
    /// hosts (docs/tuning.md, "Link model").
    const MEASURED_BANDWIDTH_MAX: u64 = Self::REFERENCE.bandwidth / 4;

    /// The model with `RUSTDIST_LINK_LATENCY_US` and `RUSTDIST_LINK_BANDWIDTH` applied over
    /// what was `measured` (None, a latency under 160 us or a bandwidth over 500 MB/s: the
    /// reference's).
    pub fn from_env(measured: Measured) -> Result<LinkModel> {
        Self::from_settings(
            std::env::var(LATENCY_ENV).ok(),
            std::env::var(BANDWIDTH_ENV).ok(),
            measured,
        )
    }

    /// [`LinkModel::from_env`] with the variables' values given.
    fn from_settings(
        latency_us: Option<String>,
        bandwidth: Option<String>,
        measured: Measured,
    ) -> Result<LinkModel> {
        let latency = match latency_us {
            Some(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|us| us.is_finite() && *us > 0.0)
                .map(|us| Duration::from_secs_f64(us * 1e-6))
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "{LATENCY_ENV} must be a positive number of microseconds, not {v:?}"
                    ))
                })?,
            None => measured
                .latency
                .filter(|l| *l >= Self::MEASURED_LATENCY_MIN)
                .unwrap_or(Self::REFERENCE.latency),
        };
        let bandwidth = match bandwidth {
            Some(v) => parse_rate(&v).ok_or_else(|| {
                Error::invalid(format!(
                    "{BANDWIDTH_ENV} must be a rate such as 1gbit, 25gbit, 800mbit or 1.5GB                      (bytes per second), not {v:?}"
                ))
            })?,
            None => measured
                .bandwidth
                .filter(|&b| b > 0 && b < Self::MEASURED_BANDWIDTH_MAX)
                .unwrap_or(Self::REFERENCE.bandwidth),
        };
        Ok(LinkModel { latency, bandwidth })
    }

    /// The bandwidth-delay product in bytes: what the link holds in flight.
    pub(super) fn bdp(&self) -> f64 {
        self.latency.as_secs_f64() * self.bandwidth as f64
    }

    /// `reference_bytes`, a TCP crossover measured on [`LinkModel::REFERENCE`], on this link:
    /// scaled by the ratio of the bandwidth-delay products (within 1/64x..64x).
    pub(super) fn scale(&self, reference_bytes: usize) -> usize {
        let factor = (self.bdp() / Self::REFERENCE.bdp()).clamp(1.0 / 64.0, 64.0);
        (reference_bytes as f64 * factor) as usize
    }
}

/// Bytes per second of a rate written as tc writes them: `1gbit`, `800mbit`, `100kbit` (bits),
/// `1.5GB`, `200MB`, `64KB` (bytes), or a plain number of bytes per second.
fn parse_rate(text: &str) -> Option<u64> {
    let t = text.trim().to_ascii_lowercase();
    let units: [(&str, f64); 7] = [
        ("gbit", 1e9 / 8.0),
        ("mbit", 1e6 / 8.0),
        ("kbit", 1e3 / 8.0),
        ("gb", 1e9),
        ("mb", 1e6),
        ("kb", 1e3),
        ("", 1.0),
    ];
    let (number, unit) = units
        .iter()
        .find_map(|&(suffix, unit)| t.strip_suffix(suffix).map(|n| (n, unit)))?;
    let rate = number.trim().parse::<f64>().ok()? * unit;
    (rate.is_finite() && rate >= 1.0).then_some(rate as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::select::AlgoOverrides;

    #[test]
    fn measurements_count_once_clearly_a_long_or_slow_link_and_settings_win() {
        let measured = |us, bandwidth| {
            let latency = Some(Duration::from_micros(us));
            LinkModel::from_settings(None, None, Measured { latency, bandwidth }).unwrap()
        };
        assert_eq!(measured(90, None), LinkModel::REFERENCE, "loopback noise");
        assert_eq!(measured(2000, None).latency, Duration::from_millis(2));
        // A link timed at 900 MB/s may be a fast one timed on a busy host; 1 Gbit/s limits.
        assert_eq!(measured(90, Some(900_000_000)), LinkModel::REFERENCE);
        assert_eq!(measured(90, Some(118_000_000)).bandwidth, 118_000_000);
        assert!(
            AlgoOverrides {
                tcp: measured(90, Some(118_000_000)),
                ..AlgoOverrides::default()
            }
            .slow_tcp(),
            "a measured 1 Gbit/s link is slow"
        );
        let set = |l: &str, b: &str| {
            let long_and_slow = Measured {
                latency: Some(Duration::from_secs(1)),
                bandwidth: Some(1000),
            };
            LinkModel::from_settings(Some(l.into()), Some(b.into()), long_and_slow)
        };
        assert_eq!(
            set("250", "10gbit").unwrap(),
            LinkModel {
                latency: Duration::from_micros(250),
                bandwidth: 1_250_000_000
            }
        );
        let Err(Error::InvalidArgument(m)) = set("-3", "1gbit") else {
            panic!()
        };
        assert!(m.contains(LATENCY_ENV) && m.contains("\"-3\""), "{m}");
        let Err(Error::InvalidArgument(m)) = set("250", "fast") else {
            panic!()
        };
        assert!(m.contains(BANDWIDTH_ENV) && m.contains("\"fast\""), "{m}");
    }

    #[test]
    fn rates_parse_as_tc_writes_them() {
        assert_eq!(parse_rate("1gbit"), Some(125_000_000));
        assert_eq!(parse_rate(" 10GBit "), Some(1_250_000_000));
        assert_eq!(parse_rate("800mbit"), Some(100_000_000));
        assert_eq!(parse_rate("1.5GB"), Some(1_500_000_000));
        assert_eq!(parse_rate("64KB"), Some(64_000));
        assert_eq!(parse_rate("5000"), Some(5000));
        for bad in ["", "fast", "-1gbit", "0", "1 parsec", "nan"] {
            assert_eq!(parse_rate(bad), None, "{bad:?}");
        }
    }
}
