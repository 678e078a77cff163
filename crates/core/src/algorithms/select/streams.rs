//! TCP streams per peer on another host: `RUSTDIST_STREAMS_PER_PEER`, else enough streams to
//! keep a round trip of the link model's bandwidth in flight. Belongs to transport/tcp (it
//! waits here while that module is split); group.rs hands it to `MeshTransport::connect`.

use super::link_model::{LinkModel, Measured};
use crate::error::{Error, Result};

/// The environment variable that sets how many TCP streams join a rank to each peer on
/// another host (`auto` or unset: [`LinkModel::streams`]).
pub const STREAMS_ENV: &str = "RUSTDIST_STREAMS_PER_PEER";
/// The most streams per peer `RUSTDIST_STREAMS_PER_PEER` may ask for.
const MAX_STREAMS: usize = 16;

impl LinkModel {
    /// Most streams per peer chosen by [`LinkModel::streams`]: a link that needs more is far
    /// beyond what these are for, and every stream costs a socket on both ends.
    const MAX_AUTO_STREAMS: usize = 8;

    /// Streams to each peer on another host, so that together they keep a round trip's worth
    /// of the link's bandwidth in flight when one stream holds at most `window` bytes (TCP
    /// sends no more than its buffers hold before the acknowledgement comes back): 1 where one
    /// stream fills the link, as on a LAN, more on a long fast link (1 Gbit/s 20 ms away with
    /// 4 MiB send buffers: 3).
    pub fn streams(&self, window: u64) -> usize {
        let in_flight = 2.0 * self.bdp();
        ((in_flight / window.max(1) as f64).ceil() as usize).clamp(1, Self::MAX_AUTO_STREAMS)
    }
}

/// `RUSTDIST_STREAMS_PER_PEER` as a count of streams, None when unset or `auto` (chosen from
/// the link); anything else than 1 to 16 is an error naming the variable.
pub fn streams_setting() -> Result<Option<usize>> {
    parse_streams(std::env::var(STREAMS_ENV).ok().as_deref())
}

fn parse_streams(value: Option<&str>) -> Result<Option<usize>> {
    let Some(v) = value
        .map(str::trim)
        .filter(|v| !v.is_empty() && *v != "auto")
    else {
        return Ok(None);
    };
    match v.parse::<usize>() {
        Ok(n) if (1..=MAX_STREAMS).contains(&n) => Ok(Some(n)),
        _ => Err(Error::invalid(format!(
            "{STREAMS_ENV} must be auto or a number of streams from 1 to {MAX_STREAMS}, not {v:?}"
        ))),
    }
}

/// Streams to each peer on another host: `RUSTDIST_STREAMS_PER_PEER` when set, else what the
/// link model (the configured one over what connecting `measured`) needs with one stream
/// holding `window` bytes.
pub fn streams_per_peer(measured: Measured, window: u64) -> Result<usize> {
    match streams_setting()? {
        Some(n) => Ok(n),
        None => Ok(LinkModel::from_env(measured)?.streams(window)),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn streams_fill_the_round_trip_where_one_stream_cannot() {
        let window = 2 << 20;
        let far = |latency_ms: u64, rate: u64| {
            LinkModel {
                latency: Duration::from_millis(latency_ms),
                bandwidth: rate,
            }
            .streams(window)
        };
        assert_eq!(LinkModel::REFERENCE.streams(window), 1, "loopback");
        assert_eq!(far(1, 125_000_000), 1, "1 Gbit/s, 1 ms away");
        assert_eq!(far(10, 125_000_000), 2, "2.5 MB in flight");
        assert_eq!(far(20, 125_000_000), 3, "5 MB in flight");
        assert_eq!(far(100, 12_500_000_000), 8, "at most 8");
        assert_eq!(LinkModel::REFERENCE.streams(0), 8, "no window: the most");
    }

    #[test]
    fn streams_setting_parses_counts_and_auto() {
        assert_eq!(parse_streams(None).unwrap(), None);
        assert_eq!(parse_streams(Some("auto")).unwrap(), None);
        assert_eq!(parse_streams(Some(" ")).unwrap(), None);
        assert_eq!(parse_streams(Some("1")).unwrap(), Some(1));
        assert_eq!(parse_streams(Some(" 16 ")).unwrap(), Some(16));
        for bad in ["0", "17", "-1", "two", "2.5"] {
            let e = parse_streams(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains(STREAMS_ENV) && e.contains(&format!("{bad:?}")),
                "{bad}: {e}"
            );
        }
    }
}
