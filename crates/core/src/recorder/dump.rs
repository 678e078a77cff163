//! Dumps: every group of the process, in the pickle format of torch's flight recorder (version
//! "2.10", as torch 2.13 writes it), which `python -m torch.distributed.flight_recorder.fr_trace`
//! reads. The file is `TORCH_FR_DUMP_TEMP_FILE` (torch's; `TORCH_NCCL_DEBUG_INFO_TEMP_FILE`
//! before it; default `/tmp/nccl_trace_rank_`) followed by the process's global rank, written
//! whole (a temporary file renamed), after a failure and on demand.
//!
//! torch's analyzer takes only its known backends' names in `profiling_name`: CPU operations
//! are named as gloo's (`gloo:all_reduce`), CUDA ones as NCCL's.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use std::sync::Arc;

use super::{global_rank, recorders, Entry, Recorder};
use crate::types::DType;

const VERSION: &str = "2.10";
const DEFAULT_PREFIX: &str = "/tmp/nccl_trace_rank_";

#[derive(Serialize)]
struct Dump {
    version: &'static str,
    pg_config: BTreeMap<String, PgConfig>,
    pg_status: BTreeMap<String, PgStatus>,
    comm_lib_version: String,
    entries: Vec<DumpEntry>,
}

#[derive(Serialize)]
struct PgConfig {
    name: String,
    desc: String,
    /// torch writes the list as its Python text.
    ranks: String,
}

#[derive(Serialize)]
struct PgStatus {
    last_enqueued_collective: i64,
    last_started_collective: i64,
    last_completed_collective: i64,
}

#[derive(Serialize)]
struct DumpFrame {
    name: String,
    filename: String,
    line: u32,
}

#[derive(Serialize)]
struct DumpEntry {
    frames: Vec<DumpFrame>,
    record_id: u64,
    pg_id: u64,
    process_group: (String, String),
    thread_name: String,
    thread_id: String,
    collective_seq_id: u64,
    p2p_seq_id: u64,
    op_id: u64,
    profiling_name: String,
    time_created_ns: u64,
    input_sizes: Vec<Vec<u64>>,
    input_dtypes: Vec<&'static str>,
    output_sizes: Vec<Vec<u64>>,
    output_dtypes: Vec<&'static str>,
    state: &'static str,
    time_discovered_started_ns: Option<u64>,
    time_discovered_completed_ns: Option<u64>,
    retired: bool,
    timeout_ms: u64,
    is_p2p: bool,
}

/// torch's name of a dtype (`ScalarType`'s).
fn torch_dtype(d: DType) -> &'static str {
    match d {
        DType::F32 => "Float",
        DType::F64 => "Double",
        DType::F16 => "Half",
        DType::BF16 => "BFloat16",
        DType::I8 => "Char",
        DType::I16 => "Short",
        DType::I32 => "Int",
        DType::I64 => "Long",
        DType::U8 => "Byte",
        DType::Bool => "Bool",
        DType::C64 => "ComplexFloat",
        DType::C128 => "ComplexDouble",
    }
}

fn profiling_name(e: &Entry) -> String {
    let backend = if e.op.cuda { "nccl" } else { "gloo" };
    let any = |r: usize| if r == usize::MAX { -1 } else { r as i64 };
    match e.op.p2p {
        Some((src, dst)) if e.op.name == "recv" => {
            format!("{backend}:recv {}<-{}", any(dst), any(src))
        }
        Some((src, dst)) => format!("{backend}:{} {}->{}", e.op.name, any(src), any(dst)),
        None => format!("{backend}:{}", e.op.name),
    }
}

fn dump_entry(e: &Entry, pg_id: u64, name: &str, desc: &str) -> DumpEntry {
    let dtype = torch_dtype(e.op.dtype);
    DumpEntry {
        frames: e.frames.as_deref().map_or_else(Vec::new, |frames| {
            frames
                .iter()
                .map(|f| DumpFrame {
                    name: f.name.clone(),
                    filename: f.filename.clone(),
                    line: f.line,
                })
                .collect()
        }),
        record_id: e.record_id,
        pg_id,
        process_group: (name.to_string(), desc.to_string()),
        thread_name: e.thread.0.clone(),
        thread_id: e.thread.1.to_string(),
        collective_seq_id: e.collective_seq,
        p2p_seq_id: e.p2p_seq,
        op_id: e.op_id,
        profiling_name: profiling_name(e),
        time_created_ns: e.created_ns,
        input_sizes: vec![vec![e.op.input]],
        input_dtypes: vec![dtype],
        output_sizes: vec![vec![e.op.output]],
        output_dtypes: vec![dtype],
        state: e.state.name(),
        time_discovered_started_ns: e.started_ns,
        time_discovered_completed_ns: e.completed_ns,
        retired: e.completed_ns.is_some(),
        timeout_ms: e.timeout_ms,
        is_p2p: e.op.p2p.is_some(),
    }
}

/// The recorders to dump, each with the group name it is dumped under and its entries.
/// torch's analyzer joins entries by group name, and each recorder numbers its operations
/// apart: recorders that share a name (a group's CPU and CUDA recorders, a group of an earlier
/// world under a name used again) must not share it in the dump. A recorder with nothing
/// recorded gives way to one that has; of the others the newest CPU one keeps the name, then
/// the newest CUDA one, and the rest get their recorder's id after it.
pub(super) fn named(all: Vec<Arc<Recorder>>) -> Vec<(Arc<Recorder>, String, Vec<Entry>)> {
    type Recorded = (Arc<Recorder>, Vec<Entry>);
    let mut by_name: BTreeMap<String, Vec<Recorded>> = BTreeMap::new();
    for r in all {
        let entries = r.entries();
        by_name.entry(r.info().name).or_default().push((r, entries));
    }
    let mut out = Vec::new();
    for (name, mut list) in by_name {
        if list.iter().any(|(_, e)| !e.is_empty()) {
            list.retain(|(_, e)| !e.is_empty());
        }
        // CPU first, newest first.
        list.sort_by_key(|(r, _)| (r.group.is_none(), std::cmp::Reverse(r.pg_id)));
        let cuda_first = list.iter().position(|(r, _)| r.group.is_none());
        for (i, (r, entries)) in list.into_iter().enumerate() {
            let dumped_as = match i {
                0 => name.clone(),
                _ if Some(i) == cuda_first => format!("{name}/cuda"),
                _ => format!("{name}/{}", r.pg_id),
            };
            out.push((r, dumped_as, entries));
        }
    }
    out
}

/// Every group's entries and configuration, as pickled bytes.
fn pickled() -> io::Result<Vec<u8>> {
    let mut dump = Dump {
        version: VERSION,
        pg_config: BTreeMap::new(),
        pg_status: BTreeMap::new(),
        comm_lib_version: String::new(),
        entries: Vec::new(),
    };
    for (recorder, name, entries) in named(recorders()) {
        let info = recorder.info();
        let last = |pred: &dyn Fn(&Entry) -> bool| {
            entries
                .iter()
                .filter(|e| e.op.p2p.is_none() && pred(e))
                .map(|e| e.collective_seq as i64)
                .max()
                .unwrap_or(-1)
        };
        let ranks: Vec<String> = info.ranks.iter().map(|r| r.to_string()).collect();
        dump.pg_status.insert(
            recorder.pg_id.to_string(),
            PgStatus {
                last_enqueued_collective: last(&|_| true),
                last_started_collective: last(&|e| e.started_ns.is_some()),
                last_completed_collective: last(&|e| e.completed_ns.is_some()),
            },
        );
        dump.entries.extend(
            entries
                .iter()
                .map(|e| dump_entry(e, recorder.pg_id, &name, &info.desc)),
        );
        dump.pg_config.insert(
            name.clone(),
            PgConfig {
                name,
                desc: info.desc,
                ranks: format!("[{}]", ranks.join(", ")),
            },
        );
    }
    dump.entries.sort_by_key(|e| e.record_id);
    serde_pickle::to_vec(&dump, serde_pickle::SerOptions::new())
        .map_err(|e| io::Error::other(format!("cannot pickle the flight recorder: {e}")))
}

/// Where this process's dump goes: the prefix (`TORCH_FR_DUMP_TEMP_FILE`, ...) and its
/// global rank; None until the rank is known.
pub fn dump_path(prefix: Option<&str>) -> Option<PathBuf> {
    let rank = global_rank();
    if rank < 0 {
        return None;
    }
    let prefix = prefix.map(str::to_string).unwrap_or_else(|| {
        ["TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
            .iter()
            .find_map(|v| std::env::var(v).ok())
            .unwrap_or_else(|| DEFAULT_PREFIX.to_string())
    });
    Some(PathBuf::from(format!("{prefix}{rank}")))
}

/// Writes every group's recorder to `prefix` and this process's global rank (the default
/// prefix when None); returns the file.
pub fn dump(prefix: Option<&str>) -> io::Result<PathBuf> {
    let path = dump_path(prefix).ok_or_else(|| {
        io::Error::other("the flight recorder has no global rank to name its dump after yet")
    })?;
    write_dump(&path)?;
    Ok(path)
}

/// Writes every group's recorder to `path`, whole: readers never see half a dump.
pub(crate) fn write_dump(path: &Path) -> io::Result<()> {
    let bytes = pickled()?;
    // Beside it, under a name without the prefix: torch's analyzer reads every file that has it.
    let tmp = path.with_file_name(format!(".rustdist-fr-{}.tmp", std::process::id()));
    std::fs::write(&tmp, &bytes)?;
    std::fs::rename(&tmp, path)
}

/// The dump after a group failed (`why`: a timeout, a dead or silent peer, an abort): written
/// when recording is on and the rank is known; a failure to write is logged, not raised.
pub fn dump_after_failure(why: &str) {
    if super::capacity() == 0 || global_rank() < 0 {
        return;
    }
    match dump(None) {
        Ok(path) => log::info!("flight recorder dumped to {} ({why})", path.display()),
        Err(e) => log::warn!("flight recorder dump after {why} failed: {e}"),
    }
}
