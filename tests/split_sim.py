"""Seeded deterministic simulation of splits and merges: the real metadata state machine and
the sans-I/O ``SplitDriver`` against simulated partition leaders, keyed writers and faults.

Each partition is a log with a committed prefix and an uncommitted tail on its leader. Its
leader refuses a record once its log (tail included) holds a seal, as ``PartitionIO.append``
does with ``LogStorage.seal_offset``; a seal request appends a seal unless there is one and is
answered (end = offset + 1) once the seal is committed. Leader crashes keep a random prefix of
the tail (a new leader had it) and drop the rest, seal included. Writers, one per key, write
one record at a time and route by the range map of the metadata they last fetched (stale
until a sealed partition makes them refresh). The driver's messages (seal requests and
answers, finish proposals and answers) are delayed, lost, or cut off by a driver crash (a new
metadata leader with a fresh driver). Operators begin splits and merges at random.

Invariants, after every event (a violation raises ``SimFailure`` with the seed and the replay):

* the active ranges tile the key-hash space;
* no partition holds a record after its seal, and a sealed partition's ``seal_end`` is its
  committed seal's offset + 1; a partition is active with parents only once they are sealed;
* no acknowledged record is ever lost or moved;
* per key, reading partitions in lineage order (parents before children; partition numbers
  grow along the lineage) gives exactly the acknowledged records in acknowledgement order.

After a quiet phase (no faults, no new operations) every operation has finished.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from laminar.node.metadata import MetadataState
from laminar.splits.driver import Finish, Seal, SplitDriver
from laminar.splits.ranges import RangeMap, check_tiling, key_hash

REPLAY = (
    "LAMINAR_SPLIT_SIM_SEEDS=1 LAMINAR_SPLIT_SIM_SEED_BASE={seed} "
    ".venv/bin/pytest tests/test_split_sim.py -k many_seeds"
)
TOPIC = "t"
SETTINGS = {
    "partitions": 1,
    "replication_factor": 1,
    "segment_bytes": 1 << 20,
    "segment_ms": 1000,
    "retention_ms": None,
    "retention_bytes": None,
    "partitioning": "range",
}


class SimFailure(AssertionError):
    pass


@dataclass
class Log:
    committed: list[tuple] = field(default_factory=list)
    tail: list[tuple] = field(default_factory=list)
    """Uncommitted entries on the leader: ("rec", key, seq) or ("seal", op_id)."""
    seal_waiters: list[str] = field(default_factory=list)
    """Op ids whose seal request waits for the seal to commit."""

    def entries(self) -> list[tuple]:
        return self.committed + self.tail

    def seal_index(self) -> int | None:
        for index, entry in enumerate(self.entries()):
            if entry[0] == "seal":
                return index
        return None


@dataclass
class Writer:
    key: bytes
    seq: int = 0
    routes: RangeMap | None = None
    in_flight: tuple[int, int] | None = None
    """(partition, index) of the record written and not yet committed."""
    acked: list[tuple[int, int, int]] = field(default_factory=list)
    """(seq, partition, index) in acknowledgement order."""


class SplitSim:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.stats: Counter[str] = Counter()
        self.state = MetadataState()
        count = self.rng.randint(1, 3)
        self.state.apply(
            {
                "op": "create_topic",
                "name": TOPIC,
                "settings": {**SETTINGS, "partitions": count},
                "replicas": [[1]] * count,
            }
        )
        self.logs: dict[int, Log] = {p: Log() for p in range(count)}
        self.driver = SplitDriver(retry_after=25)
        self.incarnation = 0
        self.now = 0
        self.messages: list[tuple[int, str, tuple]] = []
        """(deliver at, kind, payload), to or from the driver."""
        self.writers = [Writer(self.rng.randbytes(6)) for _ in range(12)]
        for writer in self.writers:
            writer.routes = self._routes()
        self.faults = True
        self.requests = 0

    # the world ---------------------------------------------------------------------------
    @property
    def topic(self):
        return self.state.topics[TOPIC]

    def _routes(self) -> RangeMap:
        return RangeMap(
            (i, (a.range_start, a.range_end))
            for i, a in enumerate(self.topic.partitions)
            if a.state == "active"
        )

    def _send(self, kind: str, payload: tuple) -> None:
        if self.faults and self.rng.random() < 0.1:
            self.stats["lost"] += 1
            return
        delay = self.rng.randint(1, 8) if self.faults else 1
        self.messages.append((self.now + delay, kind, payload))

    # events ------------------------------------------------------------------------------
    def run(self, steps: int = 500, quiet: int = 400) -> None:
        for _ in range(steps):
            self.now += 1
            self._event()
            self._check()
        self.faults = False
        for _ in range(quiet):
            self.now += 1
            for event in (self._drive, self._deliver, self._commit, self._write):
                event()
            self._check()
            if self.topic.operation is None and not any(w.in_flight for w in self.writers):
                break
        if self.topic.operation is not None:
            self._fail(f"operation {self.topic.operation} never finished")
        self._check_reads()

    def _event(self) -> None:
        roll = self.rng.random()
        if roll < 0.35:
            self._write()
        elif roll < 0.55:
            self._commit()
        elif roll < 0.65:
            self._drive()
        elif roll < 0.8:
            self._deliver()
        elif roll < 0.86:
            self._crash_leader()
        elif roll < 0.89:
            self.driver = SplitDriver(retry_after=25)  # a new metadata leader
            self.incarnation += 1
            self.stats["driver_crashes"] += 1
        elif roll < 0.95:
            self._begin()

    def _write(self) -> None:
        idle = [w for w in self.writers if w.in_flight is None]
        if not idle:
            return
        writer = self.rng.choice(idle)
        assert writer.routes is not None
        partition = writer.routes.owner(key_hash(writer.key))
        log = self.logs[partition]
        assignment = self.topic.partitions[partition]
        if log.seal_index() is not None or assignment.state != "active":
            self.stats["refused_sealed"] += 1
            writer.routes = self._routes()  # refresh (the metadata may still lag: retry later)
            return
        log.tail.append(("rec", writer.key, writer.seq))
        writer.in_flight = (partition, len(log.entries()) - 1)
        self.stats["writes"] += 1

    def _commit(self) -> None:
        pending = [p for p, log in self.logs.items() if log.tail]
        if not pending:
            return
        partition = self.rng.choice(pending)
        log = self.logs[partition]
        count = self.rng.randint(1, len(log.tail)) if self.faults else len(log.tail)
        log.committed += log.tail[:count]
        del log.tail[:count]
        for writer in self.writers:
            if writer.in_flight and writer.in_flight[0] == partition:
                index = writer.in_flight[1]
                if index < len(log.committed):
                    writer.acked.append((writer.seq, partition, index))
                    writer.seq += 1
                    writer.in_flight = None
                    self.stats["acked"] += 1
        seal = log.seal_index()
        if seal is not None and seal < len(log.committed):
            for op_id in log.seal_waiters:
                self._send("sealed", (self.incarnation, op_id, partition, seal + 1))
            log.seal_waiters.clear()

    def _crash_leader(self) -> None:
        partition = self.rng.choice(list(self.logs))
        log = self.logs[partition]
        keep = self.rng.randint(0, len(log.tail))
        del log.tail[keep:]
        self.stats["leader_crashes"] += 1
        for writer in self.writers:
            flying = writer.in_flight
            if flying and flying[0] == partition and flying[1] >= len(log.entries()):
                writer.in_flight = None  # failed: written again (same seq) later
                writer.routes = self._routes()
        if log.seal_index() is None:
            for op_id in log.seal_waiters:
                self._send("seal_failed", (self.incarnation, op_id, partition))
            log.seal_waiters.clear()

    def _drive(self) -> None:
        operations = [(TOPIC, self.topic.operation)] if self.topic.operation else []
        for action in self.driver.step(self.now, operations):
            if isinstance(action, Seal):
                self.stats["seal_requests"] += 1
                self._send("seal", (self.incarnation, action.op_id, action.partition))
            elif isinstance(action, Finish):
                self.stats["finish_proposals"] += 1
                self._send("finish", (self.incarnation, action.op_id, dict(action.ends)))

    def _deliver(self) -> None:
        due = [m for m in self.messages if m[0] <= self.now]
        self.messages = [m for m in self.messages if m[0] > self.now]
        for _at, kind, payload in due:
            incarnation = payload[0]
            if kind == "seal":
                self._serve_seal(incarnation, payload[1], payload[2])
            elif kind == "finish":
                self._serve_finish(incarnation, payload[1], payload[2])
            elif incarnation != self.incarnation:
                self.stats["stale_answers"] += 1  # the driver that asked is gone
            elif kind == "sealed":
                self.driver.sealed(payload[1], payload[2], payload[3])
            elif kind == "seal_failed":
                self.driver.seal_failed(payload[1], payload[2], self.now)
            elif kind == "finish_failed":
                self.driver.finish_failed(payload[1], self.now)

    def _serve_seal(self, incarnation: int, op_id: str, partition: int) -> None:
        log = self.logs[partition]
        seal = log.seal_index()
        if seal is None:
            log.tail.append(("seal", op_id))
            self.stats["seals_written"] += 1
        elif seal < len(log.committed):
            self._send("sealed", (incarnation, op_id, partition, seal + 1))
            return
        log.seal_waiters.append(op_id)

    def _serve_finish(self, incarnation: int, op_id: str, ends: dict[int, int]) -> None:
        command = {
            "op": "finish_op",
            "name": TOPIC,
            "op_id": op_id,
            "ends": {str(p): e for p, e in ends.items()},
            "request_id": f"finish-{op_id}",
        }
        was_open = self.topic.operation is not None
        try:
            self.state.apply_once(command)
        except Exception as exc:
            self.stats["finish_refused"] += 1
            self._send("finish_failed", (incarnation, op_id, str(exc)))
            return
        if was_open and self.topic.operation is None:
            self.stats["finished"] += 1

    def _begin(self) -> None:
        if self.topic.operation is not None or len(self.topic.partitions) > 40:
            return
        partitions = self.topic.partitions
        active = sorted(
            (i for i, a in enumerate(partitions) if a.state == "active"),
            key=lambda i: partitions[i].range_start,
        )
        self.requests += 1
        request_id = f"op-{self.requests}"
        if len(active) > 1 and self.rng.random() < 0.4:
            index = self.rng.randrange(len(active) - 1)
            command = {"op": "begin_merge", "name": TOPIC, "partitions": active[index : index + 2]}
            replicas = [[1]]
            self.stats["merges"] += 1
        else:
            victim = self.rng.choice(active)
            if partitions[victim].range_end - partitions[victim].range_start < 2:
                return
            command = {"op": "begin_split", "name": TOPIC, "partition": victim, "at": None}
            replicas = [[1], [1]]
            self.stats["splits"] += 1
        first = len(partitions)
        self.state.apply_once(
            {**command, "from": first, "replicas": replicas, "request_id": request_id}
        )
        for child in range(first, len(self.topic.partitions)):
            self.logs[child] = Log()

    # invariants --------------------------------------------------------------------------
    def _fail(self, what: str) -> None:
        raise SimFailure(
            f"seed {self.seed} at step {self.now}: {what}\nreplay: " + REPLAY.format(seed=self.seed)
        )

    def _check(self) -> None:
        partitions = self.topic.partitions
        try:
            check_tiling(
                sorted((a.range_start, a.range_end) for a in partitions if a.state == "active")
            )
        except ValueError as exc:
            self._fail(f"active ranges do not tile: {exc}")
        for number, log in self.logs.items():
            entries = log.entries()
            seal = log.seal_index()
            if seal is not None and any(e[0] == "rec" for e in entries[seal:]):
                self._fail(f"partition {number} holds a record after its seal")
            assignment = partitions[number]
            if assignment.state == "sealed":
                committed = seal is not None and seal < len(log.committed)
                if not committed or assignment.seal_end != seal + 1:
                    self._fail(f"partition {number} is sealed without its committed seal")
            if assignment.state == "active":
                for parent in assignment.parents:
                    if partitions[parent].state != "sealed":
                        self._fail(f"partition {number} is active before its parent {parent}")
        for writer in self.writers:
            for seq, partition, index in writer.acked:
                entries = self.logs[partition].committed
                if index >= len(entries) or entries[index] != ("rec", writer.key, seq):
                    self._fail(f"acknowledged record {writer.key!r}:{seq} lost")

    def _check_reads(self) -> None:
        """Read in lineage order (ascending partition numbers, each to its end)."""
        read: dict[bytes, list[int]] = {}
        for number in sorted(self.logs):
            for entry in self.logs[number].committed:
                if entry[0] == "rec":
                    read.setdefault(entry[1], []).append(entry[2])
        for writer in self.writers:
            acked = [seq for seq, _p, _i in writer.acked]
            if read.get(writer.key, []) != acked:
                self._fail(f"key {writer.key!r} reads {read.get(writer.key)} but acked {acked}")
