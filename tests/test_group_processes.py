"""Consumer groups end to end: real nodes, a steady producer, real consumer *processes*.

Each member is a `python -m tests.group_worker` process logging its assignment changes,
processed records and commits (tests/group_history.py reads and checks the logs); the test
process produces (acks=all, values are sequence numbers) and polls the group's committed
offsets throughout. The first test runs the issue's scenario in phases on one cluster:

1. no partition ever has two owners at once (ownership intervals from the members' logs);
2. a SIGKILLed member's partitions are consumed by others within session timeout + 1 s;
3. a joining member gets partitions incrementally; the others only give some up;
4. the coordinator's node is SIGKILLed: consumption goes on, committed offsets never go back;
6. a static member killed and started again within the session timeout gets the same
   partitions, and nobody else's assignment changes;
5. at the end every acknowledged record was processed, and a record processed twice was first
   processed by a member that lost its partition without a handshake, after its last commit.

The second test pauses a member (SIGSTOP) past its session timeout: once resumed it cannot
commit, reads nothing of its old partitions until assigned again, and never moves the group's
committed offsets.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from laminar.client import Admin, Producer, TopicPartition
from laminar.client.cluster import Cluster
from laminar.client.groups import GroupClient
from laminar.client.localcluster import _die_with_parent
from laminar.errors import LaminarError
from tests.cluster_fixture import ClusterHandle, start_cluster
from tests.group_history import (
    History,
    Member,
    build_history,
    committed_went_back,
    ok_commits,
    overlapping_owners,
    owned_now,
    processed_times,
    read_events,
    timeline,
    unjustified_duplicates,
    unprocessed,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SESSION = 3.0
HEARTBEAT = 0.5
NODE_ARGS = [
    "--group-session-timeout",
    str(SESSION),
    "--group-heartbeat-interval",
    str(HEARTBEAT),
]
REPO = Path(__file__).resolve().parents[1]
RATE = 200  # records per second, over all partitions


def say(message: str) -> None:
    """Progress and measurements (shown with -s, and in the captured output of a failure)."""
    print(f"{time.time():.3f} {message}", flush=True)


async def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, explain: Callable[[], str]
) -> float:
    """Poll ``condition`` until true; returns the time waited, AssertionError after timeout."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{explain()}")
        await asyncio.sleep(0.1)
    return time.monotonic() - start


# ----------------------------------------------------------------------------- processes


class Workers:
    """Member processes, each life with its own log; every one is stopped by PID at the end."""

    def __init__(self, root: Path, bootstrap: str, topic: str, group: str) -> None:
        self.root = root
        self.bootstrap = bootstrap
        self.topic = topic
        self.group = group
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.killed_at: dict[str, float] = {}
        self.pauses: dict[str, list[tuple[float, float]]] = {}

    def start(self, name: str, instance: str | None = None, wait_go: bool = False) -> None:
        args = [sys.executable, "-m", "tests.group_worker", self.bootstrap, self.topic]
        args += [self.group, str(self.root / f"{name}.events")]
        if instance is not None:
            args += ["--instance", instance]
        if wait_go:
            args.append("--wait-go")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        with open(self.root / f"{name}.out", "ab") as out:
            self.procs[name] = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
                env=env,
                cwd=REPO,
            )

    def events(self, name: str) -> list[dict]:
        return read_events(self.root / f"{name}.events")

    def member(self, name: str) -> Member:
        return Member(name, self.events(name), self.killed_at.get(name), self.pauses.get(name, []))

    def members(self) -> list[Member]:
        return [self.member(name) for name in self.procs]

    def live(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None and n not in self.killed_at]

    def owned(self) -> dict[str, set[int]]:
        return {name: owned_now(self.events(name)) for name in self.live()}

    def signal(self, name: str, sig: int) -> None:
        os.kill(self.procs[name].pid, sig)

    def kill(self, name: str) -> float:
        """SIGKILL; returns the kill time (its ownership ends there)."""
        at = time.time()
        self.killed_at[name] = at
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait(10)
        return at

    async def terminate(self, timeout: float) -> list[str]:
        """SIGTERM every live member (it commits, runs its revoke listener and leaves);
        returns those that did not exit in time or exited with an error."""
        for name in self.live():
            with contextlib.suppress(ProcessLookupError):
                self.signal(name, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        problems = []
        for name, proc in self.procs.items():
            if name in self.killed_at:
                continue
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                problems.append(f"{name} did not exit within {timeout}s of SIGTERM")
            elif proc.returncode != 0:
                problems.append(f"{name} exited {proc.returncode}: {self.output(name)}")
        return problems

    def output(self, name: str, lines: int = 15) -> str:
        path = self.root / f"{name}.out"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)

    def explain(self, since: float = 0.0) -> str:
        owned = {n: sorted(s) for n, s in self.owned().items()}
        return f"owned now: {owned}\ntimeline:\n{timeline(self.members(), since)}"


def stopped(pid: int) -> bool:
    """True once the process is in the stopped state (SIGSTOP took effect)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


# ------------------------------------------------------------------------ producer, poller


class Feed:
    """A steady keyed producer (acks=all) whose values are sequence numbers."""

    def __init__(self, bootstrap: str, topic: str, rate: int = RATE) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.rate = rate
        self.futures: list[tuple[int, object]] = []
        self.acked: dict[int, tuple[int, int]] = {}
        self.failed: dict[int, str] = {}
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.producer = Producer(
            bootstrap, acks="all", linger_ms=5, request_timeout_ms=5_000, delivery_timeout_ms=60_000
        )

    async def start(self) -> None:
        await self.producer.start()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        seq = 0
        tick = 0.02
        per_tick = max(1, int(self.rate * tick))
        while not self._stop.is_set():
            for _ in range(per_tick):
                key = f"k{seq % 64}".encode()
                future = await self.producer.send(self.topic, str(seq).encode(), key=key)
                self.futures.append((seq, future))
                seq += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), tick)

    async def stop(self) -> None:
        """Stop sending, wait for every acknowledgement (or failure)."""
        self._stop.set()
        if self._task is not None:
            await self._task
        await asyncio.wait_for(self.producer.flush(), 60)
        await self.producer.close()
        results = await asyncio.gather(*(f for _, f in self.futures), return_exceptions=True)
        for (seq, _), result in zip(self.futures, results, strict=True):
            if isinstance(result, BaseException):
                self.failed[seq] = type(result).__name__
            else:
                self.acked[seq] = (result.partition, result.offset)

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.producer.close(), 10)


class OffsetPoller:
    """Polls the group's committed offsets from the test process, every ``interval``."""

    def __init__(self, bootstrap: str, group: str, interval: float = 0.2) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.interval = interval
        self.samples: list[tuple[float, dict[int, int]]] = []
        self.errors = 0
        self._task: asyncio.Task[None] | None = None
        self.cluster: Cluster | None = None

    async def start(self) -> None:
        self.cluster = await Cluster.connect(self.bootstrap, request_timeout=2.0)
        self.client = GroupClient(self.cluster, timeout=2.0)
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                found = await self.client.fetch_offsets(self.group, timeout=2.0)
                self.samples.append(
                    (time.time(), {tp.partition: c.offset for tp, c in found.items()})
                )
            except (ConnectionError, OSError, LaminarError, TimeoutError):
                self.errors += 1
            await asyncio.sleep(self.interval)

    def latest(self) -> dict[int, int]:
        return self.samples[-1][1] if self.samples else {}

    async def coordinator(self) -> int:
        return (await self.client.describe_group(self.group, timeout=10.0)).coordinator

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.cluster is not None:
            self.cluster.close()


async def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    async with Admin(bootstrap) as admin:
        await admin.create_topic(topic, partitions=partitions, replication_factor=3)
        for _ in range(100):
            description = await admin.describe_topic(topic)
            if all(p.leader for p in description.partitions):
                return
            await asyncio.sleep(0.1)


def balanced(owned: dict[str, set[int]], names: list[str], partitions: int) -> bool:
    """Exactly ``names`` own every partition once, counts differing by at most one (other
    live members, e.g. one waiting to join, own nothing)."""
    if not set(names) <= set(owned) or any(owned[n] for n in owned if n not in names):
        return False
    owned = {n: owned[n] for n in names}
    counts = [len(owned[n]) for n in names]
    union = set().union(*owned.values())
    return len(union) == partitions == sum(counts) and max(counts) - min(counts) <= 1


def drained(workers: Workers, feed: Feed) -> bool:
    """Every acknowledged record has been processed by some member."""
    seen = set()
    for m in workers.members():
        for e in m.events:
            if e["ev"] == "records":
                seen.update((p, o) for p, o, _ in e["recs"])
    return all(tuple(where) in seen for where in feed.acked.values())


def final_checks(workers: Workers, feed: Feed, poller: OffsetPoller) -> History:
    """Checks 1, 4 and 5 over the whole run; raises with every violation found."""
    history = build_history(workers.members())
    duplicates, count = unjustified_duplicates(history)
    problems = {
        "bookkeeping": history.violations,
        "two owners at once": overlapping_owners(history),
        "committed offset went back": committed_went_back(poller.samples),
        "acknowledged but not processed": unprocessed(history, feed.acked),
        "unjustified duplicates": duplicates,
    }
    say(
        f"{len(feed.acked)} acknowledged, {len(feed.failed)} failed sends, "
        f"{len(history.processed)} distinct records processed, {count} processed more than once, "
        f"{len(poller.samples)} offset samples ({poller.errors} failed polls)"
    )
    found = {k: v for k, v in problems.items() if v}
    if found:
        text = "\n".join(f"{k} ({len(v)}):\n  " + "\n  ".join(v[:15]) for k, v in found.items())
        raise AssertionError(f"{text}\n{workers.explain()}")
    return history


# ---------------------------------------------------------------------------------- test


async def test_group_of_processes_under_kills_joins_and_coordinator_loss(tmp_path: Path) -> None:
    topic, group, partitions = "orders", "g-procs", 12
    cluster = start_cluster(tmp_path, nodes=3, extra_args=NODE_ARGS)
    workers = Workers(tmp_path, cluster.bootstrap, topic, group)
    feed = Feed(cluster.bootstrap, topic)
    poller = OffsetPoller(cluster.bootstrap, group)
    try:
        await create_topic(cluster.bootstrap, topic, partitions)
        await feed.start()
        await poller.start()
        for name, instance in (("static", "static-1"), ("a", None), ("b", None)):
            workers.start(name, instance)
        names = ["static", "a", "b"]
        took = await wait_until(
            lambda: balanced(workers.owned(), names, partitions),
            30,
            "3 balanced members",
            workers.explain,
        )
        say(f"3 members balanced after {took:.2f}s: {workers.owned()}")

        # 2. SIGKILL a member: its partitions are consumed by others within session + 1 s.
        await asyncio.sleep(1.0)
        victim = set(workers.owned()["a"])
        killed = workers.kill("a")
        others = ["static", "b"]

        def resumed_at() -> dict[int, float]:
            firsts: dict[int, float] = {}
            for name in others:
                events = workers.events(name)
                for p in victim:
                    times = processed_times(events, p, killed)
                    if times:
                        firsts[p] = min(firsts.get(p, times[0]), times[0])
            return firsts

        await wait_until(
            lambda: set(resumed_at()) == victim,
            SESSION + 8,
            f"partitions {sorted(victim)} of killed member a to be consumed again",
            lambda: workers.explain(killed),
        )
        delays = {p: round(t - killed, 3) for p, t in sorted(resumed_at().items())}
        say(f"after SIGKILL of a, its partitions were consumed again after {delays}")
        assert max(delays.values()) <= SESSION + 1.0, (
            f"partitions of the killed member took {delays}s (> {SESSION + 1}s)\n"
            f"{workers.explain(killed)}"
        )
        await wait_until(
            lambda: balanced(workers.owned(), others, partitions),
            10,
            "2 balanced members",
            lambda: workers.explain(killed),
        )

        # 3. A new member joins: the others only give partitions up, and keep the rest.
        before = workers.owned()
        joined = time.time()
        workers.start("c")
        names = ["static", "b", "c"]
        took = await wait_until(
            lambda: balanced(workers.owned(), names, partitions),
            20,
            "3 balanced members after c joined",
            lambda: workers.explain(joined),
        )
        settled = time.time()
        after = workers.owned()
        say(f"c joined, balanced after {took:.2f}s: {after}")
        moved = 0
        for name in others:
            events = [e for e in workers.events(name) if e["t"] > joined]
            changes = [e for e in events if e["ev"] in ("assigned", "lost", "revoked")]
            revoked = {p for e in changes if e["ev"] == "revoked" for p in e["tps"]}
            moved += len(revoked)
            assert all(e["ev"] == "revoked" for e in changes), (
                f"{name} got {changes} while c joined (only revocations expected)\n"
                f"{workers.explain(joined)}"
            )
            assert not revoked & after[name], (
                f"{name} had {sorted(revoked & after[name])} revoked yet owns them at the end"
            )
            assert after[name] == before[name] - revoked, (name, before[name], revoked, after[name])
        assert moved == len(after["c"]), f"{moved} partitions revoked for {len(after['c'])} moved"
        gaps = {}
        for name in others:
            events = workers.events(name)
            for p in after[name]:
                times = [joined, *processed_times(events, p, joined - 2.0), settled]
                times = sorted(t for t in times if joined - 2.0 <= t <= settled)
                gaps[p] = round(max(b - a for a, b in zip(times, times[1:], strict=False)), 3)
        say(f"kept partitions' longest gap between processed batches during the join: {gaps}")

        # 4. SIGKILL the coordinator's node: the group carries on, commits never go back.
        await asyncio.sleep(1.0)
        coordinator = await poller.coordinator()
        committed_before = dict(poller.latest())
        node_killed = time.time()
        cluster.kill(coordinator)
        say(f"killed node {coordinator} (the group's coordinator)")

        def consumed_since(t0: float) -> set[int]:
            out = set()
            for name in names:
                for e in workers.events(name):
                    if e["ev"] == "records" and e["t"] > t0:
                        out.update(r[0] for r in e["recs"])
            return out

        took = await wait_until(
            lambda: consumed_since(node_killed + 0.5) == set(range(partitions)),
            30,
            "every partition to be consumed after the coordinator's node died",
            lambda: workers.explain(node_killed),
        )
        say(f"every partition consumed again {took:.2f}s after the node kill")
        took = await wait_until(
            lambda: all(
                poller.latest().get(p, -1) > committed_before.get(p, -1) for p in range(partitions)
            ),
            30,
            "every partition's committed offset to move past its value at the node kill",
            lambda: (
                f"before {committed_before}\nnow {poller.latest()}\n{workers.explain(node_killed)}"
            ),
        )
        say(
            f"commits advanced on every partition {took:.2f}s after the node kill (new coordinator {await poller.coordinator()})"
        )
        await wait_until(
            lambda: balanced(workers.owned(), names, partitions),
            20,
            "3 balanced members after the node kill",
            lambda: workers.explain(node_killed),
        )

        # 6. A static member killed and started again within the session timeout.
        workers.start("static2", "static-1", wait_go=True)
        await asyncio.sleep(2.0)  # let it import and connect; it joins on SIGUSR2
        await wait_until(
            lambda: balanced(workers.owned(), names, partitions),
            20,
            "3 balanced members before the static restart",
            lambda: workers.explain(node_killed),
        )
        static_owned = workers.owned()["static"]
        others_before = {n: workers.owned()[n] for n in ("b", "c")}
        static_killed = workers.kill("static")
        workers.signal("static2", signal.SIGUSR2)

        def static_back() -> bool:
            return owned_now(workers.events("static2")) == static_owned

        took = await wait_until(
            static_back,
            SESSION + 5,
            f"the restarted static member to get {sorted(static_owned)} back",
            lambda: workers.explain(static_killed),
        )
        say(f"static member restarted: its partitions back {took:.2f}s after the kill")
        await asyncio.sleep(SESSION + 1.0)  # past the old incarnation's session: still no change
        changes = [
            (n, e)
            for n in ("b", "c")
            for e in workers.events(n)
            if e["t"] > static_killed and e["ev"] in ("assigned", "revoked", "lost")
        ]
        assert not changes, (
            f"others' assignment changed: {changes}\n{workers.explain(static_killed)}"
        )
        static2 = [
            e for e in workers.events("static2") if e["ev"] in ("assigned", "revoked", "lost")
        ]
        assert [e["ev"] for e in static2] == ["assigned"] and set(
            static2[0]["tps"]
        ) == static_owned, (
            f"restarted static member: {static2}, expected one assignment of {sorted(static_owned)}"
        )
        assert {n: workers.owned()[n] for n in ("b", "c")} == others_before

        # 5. Stop producing, let the members drain, stop them cleanly; then the whole history.
        await feed.stop()
        took = await wait_until(
            lambda: drained(workers, feed),
            30,
            "members to process every acknowledged record",
            workers.explain,
        )
        say(f"drained {took:.2f}s after the producer stopped")
        await asyncio.sleep(0.5)
        problems = await workers.terminate(15)
        assert not problems, problems
        await asyncio.sleep(0.5)  # a last offset sample after the final commits
        history = final_checks(workers, feed, poller)
        final = poller.latest()
        ends = {}
        for p, offset in feed.acked.values():
            ends[p] = max(ends.get(p, 0), offset + 1)
        short = {p: (final.get(p), end) for p, end in ends.items() if final.get(p, -1) < end}
        assert not short, f"final committed offsets short of the last records: {short}"
        lost = sum(1 for spans in history.intervals.values() for i in spans if i.how == "lost")
        say(f"ownership intervals: {sum(len(s) for s in history.intervals.values())}, lost {lost}")
    finally:
        workers.stop_all()
        await feed.close()
        await poller.close()
        cluster.stop()


async def test_a_paused_member_is_fenced(tmp_path: Path) -> None:
    topic, group, partitions = "zevents", "g-zombie", 6
    cluster = start_cluster(tmp_path, nodes=3, extra_args=NODE_ARGS)
    workers = Workers(tmp_path, cluster.bootstrap, topic, group)
    feed = Feed(cluster.bootstrap, topic, rate=100)
    poller = OffsetPoller(cluster.bootstrap, group, interval=0.1)
    try:
        await create_topic(cluster.bootstrap, topic, partitions)
        await feed.start()
        await poller.start()
        workers.start("zombie")
        workers.start("b")
        names = ["zombie", "b"]
        await wait_until(
            lambda: balanced(workers.owned(), names, partitions), 30, "2 members", workers.explain
        )
        pid = workers.procs["zombie"].pid
        for round_ in ("self-stop with a processed batch in hand", "external SIGSTOP"):
            await asyncio.sleep(1.0)
            old = workers.owned()["zombie"]
            if round_.startswith("self"):
                workers.signal("zombie", signal.SIGUSR1)  # it stops itself after its next batch
            else:
                workers.signal("zombie", signal.SIGSTOP)
            await wait_until(lambda: stopped(pid), 10, "the member to stop", workers.explain)
            paused = time.time()
            if round_.startswith("self"):
                pausing = [e for e in workers.events("zombie") if e["ev"] == "pausing"]
                paused = pausing[-1]["t"]
            took = await wait_until(
                lambda: (
                    owned_now(workers.events("b")) == set(range(partitions))
                    and all(processed_times(workers.events("b"), p, paused) for p in old)
                ),
                SESSION + 8,
                "b to own and consume every partition",
                lambda: workers.explain(paused),
            )
            say(f"{round_}: b consumed the paused member's partitions {took:.2f}s after the pause")
            await asyncio.sleep(max(0.0, paused + SESSION + 1.0 - time.time()))
            resumed = time.time()
            workers.signal("zombie", signal.SIGCONT)
            workers.pauses.setdefault("zombie", []).append((paused, resumed))
            took = await wait_until(
                lambda: balanced(workers.owned(), names, partitions),
                20,
                "the resumed member to be assigned again",
                lambda: workers.explain(paused),
            )
            events = [e for e in workers.events("zombie") if e["t"] >= resumed]
            say(f"{round_}: resumed member balanced again {took:.2f}s later: {workers.owned()}")
            # It reads nothing of its old partitions until assigned again.
            reassigned: set[int] = set()
            for e in events:
                if e["ev"] == "assigned":
                    reassigned |= set(e["tps"])
                if e["ev"] == "records":
                    early = {r[0] for r in e["recs"] if r[0] in old and r[0] not in reassigned}
                    assert not early, f"resumed member processed {early} before re-assignment: {e}"
            # Its commits fail (typed) until it is assigned again; or it noticed the loss first.
            first_assigned = next((e["t"] for e in events if e["ev"] == "assigned"), float("inf"))
            commits = [e for e in events if e["ev"] == "commit" and e["t"] < first_assigned]
            lost = [e for e in events if e["ev"] == "lost"]
            assert lost or commits, (
                f"resumed member neither lost its partitions nor committed: {events}"
            )
            bad = [e for e in commits if e["ok"]]
            assert not bad, f"the resumed zombie committed: {bad}"
            errors = {e["error"] for e in commits}
            assert errors <= {"FencedMemberEpochError", "UnknownMemberIdError"}, errors
            say(
                f"{round_}: zombie commits after resume: {[(e['error'], e['offsets']) for e in commits]}, lost events {[e['tps'] for e in lost]}"
            )
            # The group's committed offsets moved only by commits the owners made.
            allowed = ok_commits(workers.events("b"))
            for p, offs in ok_commits(workers.events("zombie"), after=first_assigned).items():
                allowed[p] |= offs
            for t, offsets in poller.samples:
                if t <= resumed:
                    continue
                stray = {p: o for p, o in offsets.items() if p in old and o not in allowed[p]}
                before = [s for s in poller.samples if s[0] <= resumed]
                prior = before[-1][1] if before else {}
                stray = {p: o for p, o in stray.items() if prior.get(p) != o}
                assert not stray, (
                    f"committed offsets {stray} at {t:.3f} were not committed by an owner"
                )
        await feed.stop()
        await wait_until(lambda: drained(workers, feed), 30, "members to drain", workers.explain)
        problems = await workers.terminate(15)
        assert not problems, problems
        await asyncio.sleep(0.3)
        final_checks(workers, feed, poller)
    finally:
        workers.stop_all()
        await feed.close()
        await poller.close()
        cluster.stop()
