"""The flight recorder: jobs broken on purpose at worlds 2-4, through both doors, on shared
memory, TCP and the test hosts (the suite runs again in each mode). For each, every rank's dump
(torch's pickle format, ``TORCH_FR_DUMP_TEMP_FILE`` + rank) is there, torch's analyzer
(``python -m torch.distributed.flight_recorder.fr_trace``, unmodified) names the ranks and the
operation at fault, so does ``python -m rustdist.flight_recorder``'s verdict, and the
exceptions the ranks raised name them too.

The broken jobs (cases in fr_cases.py; each in a fresh world, whose groups it leaves failed):

- ``skip``: a rank skips the 4th all_reduce and enters a barrier of group "side" instead;
- ``busy``: a rank enters no collective at all while the others time out in the 4th;
- ``order``: the upper half of the ranks calls all_reduce on groups "first" and "second" in
  the opposite order to the lower half;
- ``mismatch``: a rank's all_reduce has one element more (detected at once, no timeout);
- ``p2p``: a send that is never received. Sends are eager (they complete once handed to the
  link, the receiver keeps the bytes; 16 MiB ones too), so nothing hangs and no dump is
  automatic: every rank dumps on demand, and both analyzers report the send nobody received;
- ``abort``: rank 0 aborts the default group once the others are in an all_reduce;
- ``wrap``: a ring of 8 entries after 20 all_reduces keeps the last 8.

They run at once, each in its own world (the module's fixture ``broken``): most of their time
is the 4 s group timeout, so together they take about as long as one. Both analyzers then run
over every directory in one process (tests/fr_analyze.py: each costs seconds of torch import).
Blocked in a collective, a rank dumps on SIGUSR1 (``dump_on_signal``), and the dumps of a rank
whose default group was shrunk after a peer died are still read; those two have worlds of
their own.

On the test hosts (RUSTDIST_TEST_HOSTS=2x2) a rank waits for its host's leader, which has
entered the collective: its message must still name the ranks that never came (from the
heartbeats), not only the leader it waits for.

torch's own gloo (RUSTDIST_TEST_DIST=torch without RUSTDIST_TEST_BACKEND) is not checked: its
recorder writes no dump when a group fails, records no point-to-point operation, leaves every
entry "scheduled" and its ``pg_config`` empty (checked on torch 2.13).
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

from harness import BACKEND, IS_TORCH, World, run_reaped

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(IS_TORCH and BACKEND == "gloo",
                       reason="torch's gloo flight recorder dumps nothing on a failure, records "
                       "no point-to-point operation and writes an empty pg_config"),
]

ANALYZE = Path(__file__).resolve().parent / "fr_analyze.py"
WORLDS = (2, 3, 4)
#: The broken jobs' group timeout: every hang ends within it.
TIMEOUT_S = 4.0
#: The dumps' file names: PREFIX + global rank.
PREFIX = "rank_"
#: Elements of every collective (fr_cases.N).
N = 4


def culprit_of(world: int) -> int:
    """The rank that breaks a job of ``world`` ranks: the last at world 2, rank 2 above."""
    return 1 if world == 2 else 2


def upper_half(world: int) -> list[int]:
    """The ranks that call the two groups in the opposite order."""
    return list(range((world + 1) // 2, world))


def pair_of(world: int) -> tuple[int, int]:
    """The sender and the receiver of the p2p job: the last two ranks, in group "pair"."""
    return world - 2, world - 1


@dataclass
class Job:
    """One broken job: how it is set up and broken, and what came of it."""

    kind: str
    world: int
    dir: Path
    setup: dict[str, Any]
    case: dict[str, Any] = field(default_factory=dict)
    #: Ranks told to run the case only once every other rank has said it entered its
    #: collective (``fr_cases._entered``): the rank that breaks the job, so that the others'
    #: entries are recorded before the failure reaches them.
    last: list[int] = field(default_factory=list)
    w: Optional[World] = None
    #: What the harness reported when the job's world failed (a rank raised, died, hung).
    failure: Optional[str] = None
    answers: list[Any] = field(default_factory=list)
    fr_trace: dict[str, Any] = field(default_factory=dict)
    timeline: dict[str, Any] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        return str(self.dir / PREFIX)

    @property
    def first(self) -> list[int]:
        """The ranks told to run the case at once."""
        return [r for r in range(self.world) if r not in self.last]


def make_jobs(root: Path) -> list[Job]:
    """Every broken job, each with a directory of its own for its dumps."""
    jobs = []

    def job(kind: str, world: int, **kw: Any) -> Job:
        j = Job(kind, world, root / f"{kind}-{world}", **kw)
        j.dir.mkdir()
        j.setup = dict(prefix=j.prefix, group_timeout=TIMEOUT_S, **j.setup)
        jobs.append(j)
        return j

    for world in WORLDS:
        everyone = list(range(world))
        job("skip", world, setup=dict(groups={"side": everyone}, warmup={"default": 3}),
            case=dict(culprit=culprit_of(world)))
        job("busy", world, setup=dict(groups={}, warmup={"default": 3}),
            case=dict(culprit=culprit_of(world), within=TIMEOUT_S * 3))
        job("order", world, setup=dict(groups={"first": everyone, "second": everyone},
                                       warmup={"default": 1, "first": 1, "second": 1}),
            case=dict(reversed_ranks=upper_half(world)))
        job("mismatch", world, setup=dict(groups={}, warmup={"default": 3}),
            case=dict(culprit=culprit_of(world)), last=[culprit_of(world)])
        sender, receiver = pair_of(world)
        # Two all_reduces on "pair" before the sends: torch's analyzer takes a collective with
        # collective_seq_id k followed by a p2p operation with p2p_seq_id k in the same group
        # for a coalesced pair (find_coalesced_group_with_non_p2p), and then fails on an
        # AssertionError ("can't get dst of non-p2p op"). torch numbers its own entries so.
        job("p2p", world, setup=dict(groups={"pair": [sender, receiver]},
                                     warmup={"default": 1, "pair": 2}),
            case=dict(sender=sender, receiver=receiver))
        job("abort", world, setup=dict(groups={}, warmup={"default": 3}), case=dict(aborter=0),
            last=[0])
    job("wrap", 2, setup=dict(groups={}, warmup={}, buffer_size=8), case=dict(count=20))
    return jobs


def _attempt(job: Job, step: Callable[[], Any]) -> Any:
    """Runs one step of a job's world; a failure is kept for the job's test, not raised."""
    if job.failure is not None:
        return None
    try:
        return step()
    except pytest.fail.Exception as e:
        job.failure = str(e)
        return None


def analyze(targets: list[tuple[Path, list[str]]]) -> dict[str, Any]:
    """Runs torch's fr_trace and rustdist's timeline over each (directory, extra fr_trace
    arguments) in one process (fr_analyze.py); returns their outputs by directory."""
    jobs_file = targets[0][0].parent / "analyze-jobs.json"
    out_file = targets[0][0].parent / "analyze-out.json"
    jobs_file.write_text(json.dumps([{"dir": str(d), "prefix": PREFIX, "fr_args": args}
                                     for d, args in targets]))
    proc = run_reaped([sys.executable, str(ANALYZE), str(jobs_file), str(out_file)],
                      timeout=120)
    assert proc.returncode == 0, f"fr_analyze.py failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(out_file.read_text())


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory,
           _log_dir: str) -> Iterator[dict[tuple[str, int], Job]]:
    """Every broken job, run at once: worlds started, set up (each rank past its warm-up
    before any rank is told to break the job), broken, killed; then both analyzers over
    every job's dumps."""
    jobs = make_jobs(tmp_path_factory.mktemp("fr"))
    try:
        for j in jobs:
            j.w = World(j.world, init=False, log_dir=_log_dir)
            _attempt(j, j.w.start)
        for j in jobs:
            _attempt(j, lambda j=j: j.w.submit("fr_cases:setup", **j.setup))
        for j in jobs:
            _attempt(j, lambda j=j: j.w.collect(list(range(j.world)), "setup", timeout=60))
        for j in jobs:
            _attempt(j, lambda j=j: j.w.submit(f"fr_cases:{j.kind}", ranks=j.first, **j.case))
        for j in jobs:
            if j.last:
                _attempt(j, lambda j=j: j.w.wait_notes(j.first, j.kind, timeout=60))
                _attempt(j, lambda j=j: j.w.submit(f"fr_cases:{j.kind}", ranks=j.last,
                                                   alongside=True, **j.case))
        for j in jobs:
            got = _attempt(j, lambda j=j: j.w.collect(j.first + j.last, j.kind, timeout=60))
            if got is not None:
                by_rank = dict(zip(j.first + j.last, got))
                j.answers = [by_rank[r] for r in range(j.world)]
    finally:
        for j in jobs:
            if j.w is not None:
                j.w.kill()
    results = analyze([(j.dir, []) for j in jobs if j.failure is None])
    for j in jobs:
        if j.failure is None:
            j.fr_trace = results[str(j.dir)]["fr_trace"]
            j.timeline = results[str(j.dir)]["timeline"]
    yield {(j.kind, j.world): j for j in jobs}


def ran(broken: dict[tuple[str, int], Job], kind: str, world: int) -> Job:
    """The job, which must have run to its end on every rank; its dumps must all be there."""
    j = broken[(kind, world)]
    if j.failure is not None:
        pytest.fail(f"{kind} at world {world}:\n{j.failure}", pytrace=False)
    # (A dump being rewritten when the world was killed may leave its temporary file.)
    dumps = sorted(p.name for p in j.dir.iterdir() if p.name.startswith(PREFIX))
    assert dumps == sorted(f"{PREFIX}{r}" for r in range(world)), (
        f"{kind} at world {world}: the dumps in {j.dir} are {dumps}")
    for r, a in enumerate(j.answers):
        assert a["dumped"], f"rank {r}: no dump when its call returned: {a}"
    assert j.fr_trace["rc"] == 0, f"fr_trace failed on {j.dir}:\n{j.fr_trace['out']}"
    assert j.timeline["rc"] == 0, (
        f"rustdist.flight_recorder failed on {j.dir}:\n{j.timeline['out']}")
    return j


# -- reading the analyzers' output --------------------------------------------------------------

@dataclass
class Report:
    """One collective fr_trace reports: its heading, sequence number and ``key: value`` lines."""

    head: str
    seq: int
    fields: dict[str, str]
    text: str

    @property
    def group(self) -> str:
        """The group's description (``group info: 1:side`` -> ``side``)."""
        return self.fields.get("group info", "").split(":", 1)[-1]

    def ranks(self, key: str) -> set[int]:
        return set(ast.literal_eval(self.fields[key])) if self.fields.get(key) else set()


def reports(out: str) -> list[Report]:
    """fr_trace's reports, in order."""
    found: list[Report] = []
    for line in out.splitlines():
        m = re.match(r"^Not all ranks joining collective, sequence number: (\d+)", line) or \
            re.match(r"^Collective sequence number: (\d+) has errors", line)
        if m:
            head = "missing" if line.startswith("Not all") else "errors"
            found.append(Report(head, int(m.group(1)), {}, line))
        elif found:
            found[-1].text += "\n" + line
            key, sep, value = line.partition(": ")
            if sep and key and key not in found[-1].fields:
                found[-1].fields[key] = value.strip()
    return found


def report(out: str, head: str, group: str, seq: int, collective: str) -> Report:
    """The one report of ``head`` ("missing" or "errors") on ``collective`` #``seq`` of the
    group with description ``group``."""
    got = [r for r in reports(out) if (r.head, r.group, r.seq, r.fields.get("collective"))
           == (head, group, seq, collective)]
    assert len(got) == 1, (f"fr_trace does not report {collective} #{seq} of group '{group}' "
                           f"({head}) once:\n{out}")
    return got[0]


def verdicts(out: str) -> list[str]:
    """The verdict and point-to-point lines of ``python -m rustdist.flight_recorder``."""
    return [line for line in out.splitlines()
            if line.startswith("verdict:") or line.startswith("point-to-point:")]


def some_verdict(out: str, *parts: str) -> str:
    """The verdict line that contains every one of ``parts``."""
    for line in verdicts(out):
        if all(p in line for p in parts):
            return line
    raise AssertionError(f"no verdict line says {parts}:\n{out}")


def named(text: str, op: str, group: str, last: str) -> set[int]:
    """The ranks that ``text`` says have not entered ``op`` of ``group`` and were last in
    ``last`` (an op and its group: "barrier #1 of group 'side'")."""
    return {int(m) for m in re.findall(rf"rank (\d+)(?: \(global rank \d+\))? has not entered "
                                       rf"{re.escape(op)} of group '{re.escape(group)}'; its last "
                                       rf"op is {re.escape(last)}", text)}


def check_texts(answers: list[dict[str, Any]],
                expect: dict[int, tuple[set[int], str, str, str]]) -> None:
    """Every rank ``r`` of ``expect`` raised DistBackendError after a timeout (within three
    group timeouts) whose text names ranks of ``expect[r][0]`` (at least one, no other; a
    rank waits for the ranks its algorithm needs first) as not having entered op
    ``expect[r][1]`` of group ``expect[r][2]``, their last op being ``expect[r][3]``. The
    ranks that waited got their own timeout's text or that of the rank that failed the group
    first ("rank N failed: ..."): either names the culprits."""
    problems = []
    for r, (culprits, op, group, last) in expect.items():
        a = answers[r]
        said = named(a["error"], op, group, last)
        why = None
        if a["type"] != "DistBackendError" or "Timed out" not in a["error"]:
            why = "not a DistBackendError of a timeout"
        elif not a["elapsed"] < TIMEOUT_S * 3:
            why = f"raised after {a['elapsed']:.1f} s"
        elif not said or not said <= culprits:
            why = (f"names {sorted(said)}, not ranks of {sorted(culprits)}, as not having entered "
                   f"{op} of group '{group}' and last in {last}")
        if why:
            problems.append(f"rank {r}: {why}: {a['error']}")
    assert not problems, "\n".join(problems)


# -- the broken jobs -----------------------------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS)
def test_a_rank_skips_an_all_reduce(broken: dict[tuple[str, int], Job], world: int) -> None:
    """The culprit skips all_reduce #4 of the default group for barrier #1 of "side".
    fr_trace: all_reduce #4 of default_pg misses the culprit, barrier #1 of side misses the
    others; rustdist's verdict names the culprit and its barrier. The others time out saying
    the culprit has not entered all_reduce #4 and that its last op is barrier #1 of 'side';
    the culprit's barrier times out naming others and their all_reduce #4."""
    j = ran(broken, "skip", world)
    c = culprit_of(world)
    others = {r for r in range(world) if r != c}
    out = j.fr_trace["out"]
    assert report(out, "missing", "default_pg", 4, "gloo:all_reduce").ranks("missing ranks") == {c}
    assert report(out, "missing", "side", 1, "gloo:barrier").ranks("missing ranks") == others
    some_verdict(j.timeline["out"], f"rank {c} never entered all_reduce #4 of group "
                 f"'default_pg'; its last op is barrier #1 of group 'side'")
    expect = {r: ({c}, "all_reduce #4", "default_pg", "barrier #1 of group 'side' (started)")
              for r in others}
    expect[c] = (others, "barrier #1", "side", "all_reduce #4 of group 'default_pg'")
    check_texts(j.answers, expect)


@pytest.mark.parametrize("world", WORLDS)
def test_a_rank_busy_outside_collectives(broken: dict[tuple[str, int], Job], world: int) -> None:
    """The culprit enters no collective while the others wait in all_reduce #4 and time out:
    the failure reaches it through the heartbeats, which writes its dump too (``ran`` checks
    that it appeared while the culprit waited for it), and its next all_reduce fails at once
    saying another rank failed the group. fr_trace: all_reduce #4 misses the culprit; the
    others' messages say it has not entered all_reduce #4, its last op being #3, completed."""
    j = ran(broken, "busy", world)
    c = culprit_of(world)
    out = j.fr_trace["out"]
    assert report(out, "missing", "default_pg", 4, "gloo:all_reduce").ranks("missing ranks") == {c}
    some_verdict(j.timeline["out"], f"rank {c} never entered all_reduce #4 of group "
                 f"'default_pg'; its last op is all_reduce #3 of group 'default_pg' (completed)")
    nxt = j.answers[c]["next"]
    assert nxt["type"] == "DistBackendError" and "failed" in nxt["error"], nxt
    assert nxt["elapsed"] < 1.0, f"the culprit's next all_reduce took {nxt['elapsed']:.2f} s: {nxt}"
    check_texts(j.answers, {r: ({c}, "all_reduce #4", "default_pg",
                                "all_reduce #3 of group 'default_pg' (completed)")
                            for r in range(world) if r != c})


@pytest.mark.parametrize("world", WORLDS)
def test_two_groups_in_opposite_orders(broken: dict[tuple[str, int], Job], world: int) -> None:
    """The upper half calls all_reduce on "second" then "first", the lower half the other way
    round. fr_trace reports all_reduce #2 of "first" missing the upper half and of "second"
    missing the lower half; so do rustdist's verdicts. Each side times out naming ranks of
    the other side and their all_reduce #2 of the other group."""
    j = ran(broken, "order", world)
    upper = set(upper_half(world))
    lower = set(range(world)) - upper
    out = j.fr_trace["out"]
    assert report(out, "missing", "first", 2, "gloo:all_reduce").ranks("missing ranks") == upper
    assert report(out, "missing", "second", 2, "gloo:all_reduce").ranks("missing ranks") == lower
    for o in upper:
        some_verdict(j.timeline["out"], f"rank {o} never entered all_reduce #2 of group 'first'; "
                     "its last op is all_reduce #2 of group 'second'")
    for o in lower:
        some_verdict(j.timeline["out"], f"rank {o} never entered all_reduce #2 of group "
                     "'second'; its last op is all_reduce #2 of group 'first'")
    expect = {r: (upper, "all_reduce #2", "first", "all_reduce #2 of group 'second'")
              for r in lower}
    expect.update({r: (lower, "all_reduce #2", "second", "all_reduce #2 of group 'first'")
                   for r in upper})
    check_texts(j.answers, expect)


@pytest.mark.parametrize("world", WORLDS)
def test_sizes_differ_in_one_all_reduce(broken: dict[tuple[str, int], Job], world: int) -> None:
    """The others enter all_reduce #4 with 4 elements, then the culprit with 5: every rank
    raises DistBackendError at once saying the ranks mismatch, naming the culprit and #4.
    fr_trace reports all_reduce #4 of default_pg with a size mismatch. It takes the sizes of
    the first dump it reads as the expected ones and calls every rank that differs a culprit:
    the culprit alone when that dump is not the culprit's, every other rank when it is (the
    order of the files in the directory decides). rustdist's verdict gives each rank's size."""
    j = ran(broken, "mismatch", world)
    c = culprit_of(world)
    for r, a in enumerate(j.answers):
        assert a["type"] == "DistBackendError", f"rank {r}: {a}"
        assert "mismatch between ranks" in a["error"] and "collective #4" in a["error"], a
        assert re.search(rf"\brank {c}\b", a["error"]), f"rank {r}: does not name rank {c}: {a}"
        assert a["elapsed"] < TIMEOUT_S, f"rank {r} took {a['elapsed']:.1f} s to raise: {a}"
    rep = report(j.fr_trace["out"], "errors", "default_pg", 4, "gloo:all_reduce")
    named = {int(m) for m in re.findall(r"Culprit rank (\d+)", rep.fields.get("error msg", ""))}
    if rep.fields["input sizes"] == f"[[{N}]]":
        assert named == {c}, rep.text
        assert f"found input sizes: '[[{N + 1}]]'" in rep.text, rep.text
    else:
        assert rep.fields["input sizes"] == f"[[{N + 1}]]", rep.text
        assert named == {r for r in range(world) if r != c}, rep.text
    assert "SIZE_OR_SYNTAX_MISMATCH" in rep.text, rep.text
    line = some_verdict(j.timeline["out"], "sizes differ in all_reduce #4 of group 'default_pg'")
    assert f"rank {c} [[{N + 1}]]" in line, line


@pytest.mark.parametrize("world", WORLDS)
def test_a_send_nobody_receives(broken: dict[tuple[str, int], Job], world: int) -> None:
    """On group "pair" (the last two ranks), a send that is received and then a send of 6
    elements that is not: both sends return at once (eager). With every rank's dump taken on
    demand, fr_trace reports exactly one thing: the 6-element "gloo:send 0->1" of "pair"
    missing the receiver (it matches the received send with its receive; it numbers the
    report with the group's collective sequence number, 2). rustdist's timeline says group
    rank 0 sent one message that group rank 1 did not receive."""
    j = ran(broken, "p2p", world)
    _, receiver = pair_of(world)
    out = j.fr_trace["out"]
    rep = report(out, "missing", "pair", 2, "gloo:send 0->1")
    assert rep.ranks("missing ranks") == {receiver}, rep.text
    assert rep.fields["input sizes"] == f"[[{N + 2}]]", rep.text
    assert len(reports(out)) == 1, f"fr_trace reports more than the unreceived send:\n{out}"
    some_verdict(j.timeline["out"], "point-to-point: group rank 0 sent 1 message(s) to group "
                 "rank 1 that it did not receive", "send #2 of group 'pair'")


@pytest.mark.parametrize("world", WORLDS)
def test_a_dump_after_abort(broken: dict[tuple[str, int], Job], world: int) -> None:
    """Once the others are in all_reduce #4, rank 0 aborts the default group (abort() writes
    its dump): they fail saying rank 0 aborted; every dump loads with pickle, fr_trace
    reports all_reduce #4 missing rank 0."""
    j = ran(broken, "abort", world)
    for r, a in enumerate(j.answers[1:], start=1):
        assert a["type"] == "DistBackendError", f"rank {r}: {a}"
        assert "rank 0 failed" in a["error"] and "aborted" in a["error"], f"rank {r}: {a}"
    for r in range(world):
        with open(j.dir / f"{PREFIX}{r}", "rb") as f:
            d = pickle.load(f)
        assert d["version"] == "2.10" and d["pg_config"]["0"]["desc"] == "default_pg", d
    assert report(j.fr_trace["out"], "missing", "default_pg", 4,
                  "gloo:all_reduce").ranks("missing ranks") == {0}


def test_a_ring_that_wraps_keeps_the_newest(broken: dict[tuple[str, int], Job]) -> None:
    """TORCH_FR_BUFFER_SIZE=8, 20 all_reduces: each rank's dump holds all_reduces #13-#20,
    oldest first, completed; pg_status says #20 was the last completed; fr_trace reads the
    dumps and finds nothing wrong."""
    j = ran(broken, "wrap", 2)
    for r, a in enumerate(j.answers):
        assert a["capacity"] == 8, a
        with open(a["dump"], "rb") as f:
            d = pickle.load(f)
        entries = d["entries"]
        assert [e["collective_seq_id"] for e in entries] == list(range(13, 21)), entries
        assert {(e["profiling_name"], e["state"]) for e in entries} == {
            ("gloo:all_reduce", "completed")}, entries
        assert [s["last_completed_collective"] for s in d["pg_status"].values()] == [20], d
    assert reports(j.fr_trace["out"]) == [], j.fr_trace["out"]


# -- worlds of their own --------------------------------------------------------------------------


def _load(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        return pickle.load(f)


def test_dump_on_signal_while_blocked(short_world: Callable[..., World], tmp_path: Path) -> None:
    """Rank 0 installs dump_on_signal(SIGUSR1) and blocks in all_reduce #2, which rank 1
    enters only after the test has seen the dump: the test sends SIGUSR1 until a dump shows
    all_reduce #2 "started" (a signal that lands before the call dumps without it), then lets
    rank 1 in; rank 0's all_reduce completes normally."""
    w = short_world(2, init=False)
    w.run("fr_cases:setup", prefix=str(tmp_path / PREFIX), group_timeout=60.0, groups={},
          warmup={"default": 1})
    case = "fr_cases:blocked_under_signal"
    w.submit(case, ranks=[0])
    assert w.wait_notes([0], case) == ["ready"]
    dump = tmp_path / f"{PREFIX}0"
    deadline = time.monotonic() + 30
    while True:
        os.kill(w.procs[0].pid, signal.SIGUSR1)
        assert w.wait_notes([0], case, timeout=30) == ["dumped"]
        last = _load(dump)["entries"][-1]
        if last["collective_seq_id"] == 2:
            break
        assert time.monotonic() < deadline, f"no dump showed the blocked all_reduce: {last}"
    assert (last["profiling_name"], last["state"]) == ("gloo:all_reduce", "started"), last
    assert last["time_discovered_completed_ns"] is None, last
    w.run("fr_cases:join", ranks=[1], alongside=True)
    w.collect([0], case)


@pytest.mark.parametrize("world", [3, 4])
def test_dumps_survive_a_shrink(short_world: Callable[..., World], tmp_path: Path,
                                world: int) -> None:
    """The last rank dies while the others are in all_reduce #2: each survivor's dump of
    that failure loads with pickle, and fr_trace (--allow-incomplete-ranks: the dead rank left
    none) says it cannot decide about all_reduce #2 for want of the dead rank's dump. The
    survivors shrink the default group, run an all_reduce on it and dump on demand: those
    dumps load and hold the shrunk group with the survivors' ranks, and still the group that
    failed (a group that ended keeps its recorder for later dumps); fr_trace finds nothing
    wrong in the shrunk group, only the failed group's want of the dead rank's dump."""
    failed, shrunk = tmp_path / "failed", tmp_path / "shrunk"
    failed.mkdir()
    shrunk.mkdir()
    victim = world - 1
    survivors = list(range(victim))
    w = short_world(world, init=False)
    w.run("fr_cases:setup", prefix=str(tmp_path / PREFIX), group_timeout=30.0, groups={},
          warmup={"default": 1})
    case = "fr_cases:blocked_until_death"
    w.submit(case, ranks=survivors, keep=str(failed))
    assert w.wait_notes(survivors, case) == ["entered"] * len(survivors)
    w.exit_rank(victim)
    for r, a in zip(survivors, w.collect(survivors, case, timeout=30)):
        assert a["dumped"] and f"rank {victim}" in a["error"], f"rank {r}: {a}"
    outs = w.run("fr_cases:shrink_and_dump", ranks=survivors, victim=victim,
                 prefix=str(shrunk / PREFIX))
    for r in survivors:
        d = _load(failed / f"{PREFIX}{r}")
        assert d["pg_config"]["0"]["ranks"] == str(list(range(world))), d["pg_config"]
        last = d["entries"][-1]
        assert last["collective_seq_id"] == 2 and last["state"] in ("scheduled", "started"), last
        d = _load(shrunk / f"{PREFIX}{r}")
        ranks = {name: c["ranks"] for name, c in d["pg_config"].items()}
        assert str(survivors) in ranks.values(), ranks
        assert ranks.get("0") == str(list(range(world))), ranks
        assert outs[r]["ranks"] == survivors, outs[r]
    shrunk_name = next(name for name, c in d["pg_config"].items()
                       if c["ranks"] == str(survivors))
    results = analyze([(failed, ["--allow-incomplete-ranks"]),
                       (shrunk, ["--allow-incomplete-ranks"])])
    fr_failed, fr_shrunk = results[str(failed)]["fr_trace"], results[str(shrunk)]["fr_trace"]
    for fr in (fr_failed, fr_shrunk):
        assert fr["rc"] == 0, fr["out"]
        assert f"we missed FR dumps from ranks ({{{victim}}})" in fr["out"], fr["out"]
    on_shrunk = [x for x in reports(fr_shrunk["out"])
                 if f"group info: {shrunk_name}" in x.text]
    assert on_shrunk == [], fr_shrunk["out"]
    for name in ("failed", "shrunk"):
        assert results[str(tmp_path / name)]["timeline"]["rc"] == 0, results
