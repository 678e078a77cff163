use super::*;

fn op(name: &'static str) -> Op {
    Op {
        name,
        input: 4,
        output: 4,
        dtype: DType::F32,
        p2p: None,
        cuda: false,
    }
}

#[test]
fn sequence_numbers_count_collectives_and_point_to_point_apart() {
    let r = Recorder::new("seq", Some(1), 2);
    let t = Duration::from_secs(1);
    r.record(op("all_reduce"), t, true);
    r.record(
        Op {
            p2p: Some((0, 1)),
            ..op("send")
        },
        t,
        false,
    );
    r.record(op("broadcast"), t, false);
    let seqs: Vec<(u64, u64, u64)> = r
        .entries()
        .iter()
        .map(|e| (e.collective_seq, e.p2p_seq, e.op_id))
        .collect();
    assert_eq!(seqs, [(1, 0, 1), (1, 1, 2), (2, 1, 3)]);
    // The broadcast is only scheduled: the last collective entered is the all_reduce.
    assert_eq!(r.entered(), 1);
}

#[test]
fn states_move_from_scheduled_to_completed() {
    let r = Recorder::new("states", Some(2), 2);
    let t = r.record(op("all_reduce"), Duration::from_secs(1), false);
    assert_eq!(r.entries()[0].state, State::Scheduled);
    r.started(t);
    assert_eq!(r.entries()[0].state, State::Started);
    r.completed(t);
    let e = &r.entries()[0];
    assert_eq!(e.state, State::Completed);
    assert!(e.started_ns.unwrap() <= e.completed_ns.unwrap());
}

#[test]
fn a_ring_that_wraps_keeps_the_newest_entries() {
    let r = Recorder::new("wrap", Some(3), 2);
    let n = capacity() as u64 + 5;
    let mut tickets = Vec::new();
    for _ in 0..n {
        tickets.push(r.record(op("all_reduce"), Duration::from_secs(1), true));
    }
    let seqs: Vec<u64> = r.entries().iter().map(|e| e.collective_seq).collect();
    assert_eq!(seqs, (6..=n).collect::<Vec<_>>());
    // Marking an entry that was overwritten does nothing.
    r.completed(tickets[0]);
    assert!(r.entries().iter().all(|e| e.state == State::Started));
}

#[test]
fn the_next_operation_on_a_thread_takes_the_stack_given_for_it() {
    let r = Recorder::new("frames", Some(4), 2);
    set_next_frames(vec![Frame {
        name: "train".into(),
        filename: "train.py".into(),
        line: 7,
    }]);
    r.record(op("all_reduce"), Duration::from_secs(1), true);
    r.record(op("all_reduce"), Duration::from_secs(1), true);
    let entries = r.entries();
    assert_eq!(entries[0].frames.as_ref().unwrap()[0].line, 7);
    assert!(entries[1].frames.is_none());
}

#[test]
fn a_dump_is_a_pickle_of_torch_s_layout() {
    let r = Recorder::new("dumped", Some(5), 2);
    r.set_info("7", "tp", vec![3, 5]);
    let send = Op {
        p2p: Some((0, 1)),
        ..op("send")
    };
    r.record(send, Duration::from_secs(2), true);
    // No global rank is set in this process: failures elsewhere in it must not write dumps.
    let dir = std::env::temp_dir().join(format!("rustdist-fr-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace_3");
    write_dump(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let value = serde_pickle::value_from_slice(&bytes, Default::default()).unwrap();
    let text = format!("{value:?}");
    for needle in [
        "\"2.10\"",
        "\"7\"",
        "\"tp\"",
        "\"[3, 5]\"",
        "\"gloo:send 0->1\"",
        "\"Float\"",
    ] {
        assert!(text.contains(needle), "{needle} not in {text}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_hidden_group_is_left_out_of_dumps_and_status() {
    let r = Recorder::new("hidden", Some(6), 2);
    r.record(op("all_reduce"), Duration::from_secs(1), true);
    assert_eq!(status(6).entered, 1);
    r.hide();
    assert!(recorders().iter().all(|x| x.group != Some(6)));
    assert_eq!(status(6).entered, 0);
}

#[test]
fn recorders_that_share_a_name_are_dumped_apart() {
    let cpu = Recorder::new("shared-name", Some(7), 2);
    let cuda = Recorder::new("shared-name", None, 2);
    let empty = Recorder::new("shared-name", Some(8), 2);
    cpu.record(op("all_reduce"), Duration::from_secs(1), true);
    cuda.record(
        Op {
            cuda: true,
            ..op("broadcast")
        },
        Duration::from_secs(1),
        true,
    );
    let names: Vec<(u64, String)> = dump::named(vec![empty.clone(), cuda.clone(), cpu.clone()])
        .into_iter()
        .map(|(r, name, _)| (r.pg_id, name))
        .collect();
    assert_eq!(
        names,
        [
            (cpu.pg_id, "shared-name".to_string()),
            (cuda.pg_id, "shared-name/cuda".to_string())
        ]
    );
}

#[test]
fn a_snapshot_shows_each_live_group_s_pending_and_last_completed_operation() {
    let r = Recorder::new("snapshot-live", Some(9), 2);
    r.set_info("snapshot-live", "dp", vec![0, 1]);
    let t = Duration::from_secs(1);
    let first = r.record(op("all_reduce"), t, true);
    r.completed(first);
    // A failed operation is no group's current one; the next pending one is.
    let failed = r.record(op("broadcast"), t, true);
    r.ran(Some(failed), false, Duration::ZERO);
    r.record(op("all_gather"), t, false);
    let ended = Recorder::new("snapshot-ended", Some(10), 2);
    ended.set_info("snapshot-ended", "", vec![0, 1]);
    retire(&ended);
    let state = snapshot();
    assert!(state.groups.iter().all(|g| g.name != "snapshot-ended"));
    let g = (state.groups.iter())
        .find(|g| g.name == "snapshot-live")
        .expect("the live group");
    assert_eq!((g.desc.as_str(), &g.ranks[..]), ("dp", &[0, 1][..]));
    let current = g.current.as_ref().expect("a pending operation");
    assert_eq!(
        (current.op, current.seq, current.state),
        ("all_gather", 3, "scheduled")
    );
    let last = g.last_completed.as_ref().expect("a completed operation");
    assert_eq!(
        (last.op, last.seq, last.state),
        ("all_reduce", 1, "completed")
    );
}
