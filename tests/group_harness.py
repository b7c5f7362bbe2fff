"""The machinery of tests/test_group_processes.py: member processes (tests/group_worker.py)
stopped by PID, a steady producer, a poller of the group's committed offsets, and waits.

Everything that waits is bounded; failures say what was awaited and show the members' recent
assignment events.
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

from laminar.client import Admin, Producer
from laminar.client.cluster import Cluster
from laminar.client.groups import GroupClient
from laminar.client.localcluster import _die_with_parent
from laminar.errors import LaminarError
from tests.group_history import Member, owned_now, read_events, timeline

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
        self.uncommitted: list[tuple[int, int]] = []
        """Records a killed member processed and never committed: someone processes them again."""

    def start(
        self, name: str, instance: str | None = None, rebalance_timeout_ms: int | None = None
    ) -> None:
        args = [sys.executable, "-m", "tests.group_worker", self.bootstrap, self.topic]
        args += [self.group, str(self.root / f"{name}.events")]
        if instance is not None:
            args += ["--instance", instance]
        if rebalance_timeout_ms is not None:
            args += ["--rebalance-timeout-ms", str(rebalance_timeout_ms)]
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
        """Who owns what, recent assignment events, and the output of members that died."""
        owned = {n: sorted(s) for n, s in self.owned().items()}
        died = [
            f"--- {name} exited {proc.returncode}:\n{self.output(name)}"
            for name, proc in self.procs.items()
            if proc.poll() not in (None, 0) and name not in self.killed_at
        ]
        return "\n".join(
            [f"owned now: {owned}", "timeline:", timeline(self.members(), since), *died]
        )


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
        self.dead_node: int | None = None
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
        """The node coordinating the group, as Admin.describe_group reports it."""
        async with Admin(self.bootstrap, request_timeout_ms=10_000) as admin:
            return (await admin.describe_group(self.group)).coordinator

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


async def wait_until_caught_up(bootstrap: str, timeout: float) -> None:
    """Every partition (the group shards included) has a leader and all 3 replicas, none
    more than a moment's traffic behind (the producer keeps going)."""
    async with Admin(bootstrap, request_timeout_ms=5_000) as admin:
        deadline = time.monotonic() + timeout
        while True:
            try:
                status = await admin.cluster_status()
                if all(
                    p.leader and len(p.replicas) == 3 and all(r.lag < 200 for r in p.replicas)
                    for p in status.partitions
                ):
                    return
            except (ConnectionError, OSError, LaminarError):
                status = None
            if time.monotonic() > deadline:
                raise AssertionError(f"replicas not caught up after {timeout}s: {status}")
            await asyncio.sleep(0.2)
