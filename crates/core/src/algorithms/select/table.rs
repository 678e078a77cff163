//! The `--show-selection` table: what the policy picks for every collective, link kind,
//! world size and size ([`table`], rows of [`Choice`]).

use super::overrides::AlgoOverrides;
use crate::transport::workspace::SingleCopy;
use crate::transport::LinkKind;
use crate::types::{DType, ReduceOp};

/// One row of the selection table: the algorithm `collective` runs with `bytes` (per rank; the
/// gathered total for all_gather) on `world` ranks connected by `link`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub collective: &'static str,
    pub link: LinkKind,
    pub world: usize,
    pub bytes: usize,
    pub algorithm: &'static str,
}

/// The all_reduce rows, by what else the choice depends on: float32 SUM (also PRODUCT), then
/// f16/bf16 SUM, then float32 MIN/MAX/bitwise (two ranks' SUM and PRODUCT reduce into their
/// own buffers; f16/bf16 cost more per byte).
const ALL_REDUCE_ROWS: [(&str, DType, ReduceOp); 3] = [
    ("all_reduce", DType::F32, ReduceOp::Sum),
    ("all_reduce bf16/f16", DType::BF16, ReduceOp::Sum),
    ("all_reduce MIN/MAX/bitwise", DType::F32, ReduceOp::Max),
];

/// What the defaults (with `RUSTDIST_ALGO` applied when `overrides` holds it) choose for every
/// collective, link kind, world size in `worlds` and size in `sizes`, on a host of `cores`
/// cores whose ranks may read each other's memory.
pub fn table(
    overrides: &AlgoOverrides,
    worlds: &[usize],
    sizes: &[usize],
    cores: usize,
) -> Vec<Choice> {
    let links = [
        LinkKind::SharedMemory,
        LinkKind::Tcp,
        LinkKind::Hierarchical,
    ];
    let o = overrides;
    let mut rows = Vec::new();
    for link in links {
        for &world in worlds {
            let one_copy = if world <= cores {
                SingleCopy::CoreEach
            } else {
                SingleCopy::SharedCores
            };
            for &bytes in sizes {
                let all_reduce = ALL_REDUCE_ROWS.map(|(row, dtype, op)| {
                    let algo = o.all_reduce(bytes, dtype, op, world, link, one_copy);
                    (row, algo.name())
                });
                let others: [(&'static str, &'static str); 8] = [
                    (
                        "broadcast",
                        o.broadcast(bytes, world, link, one_copy).name(),
                    ),
                    (
                        "all_gather",
                        o.all_gather(bytes, world, link, one_copy).name(),
                    ),
                    ("reduce_scatter", o.reduce_scatter(link).name()),
                    ("reduce", o.reduce(link).name()),
                    ("gather", o.gather(link).name()),
                    ("scatter", o.scatter(link).name()),
                    (
                        "all_to_all",
                        o.all_to_all(Some(bytes), world, link, one_copy).name(),
                    ),
                    ("barrier", o.barrier(link).name()),
                ];
                let picks = all_reduce.into_iter().chain(others);
                rows.extend(picks.map(|(collective, algorithm)| Choice {
                    collective,
                    link,
                    world,
                    bytes,
                    algorithm,
                }));
            }
        }
    }
    rows
}
