"""The node side of splits and merges: sealing on a partition's leader, and the driver that
finishes open operations on the metadata leader.

Every ``DRIVE_INTERVAL`` the metadata leader hands the topics with an open operation
(``Topic.operation``, see ``ops.py``) to the sans-I/O ``SplitDriver`` and carries out its
actions: ask every parent's leader to seal it (idempotent: a sealed parent answers with its
end), then propose ``finish_op`` with the ends. Nothing of it is durable beyond the metadata
and the seals, so a new metadata leader picks up whatever its predecessor left, and a parent
whose leader died is sealed by the next leader of its group. Every ``RETIRE_INTERVAL`` it also
asks every node for the log starts of its sealed replicas and retires the partitions retention
emptied everywhere (``retire.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from laminar.errors import LaminarError, NotLeaderError, RequestTimeoutError, UnknownTopicError
from laminar.node.metadata import MetadataState
from laminar.node.partition_io import PartitionIO
from laminar.node.replica import Replica
from laminar.splits.auto import AutoScaler, PartitionView, Policy, policy_of
from laminar.splits.driver import Action, Seal, SplitDriver
from laminar.splits.retire import retirable, retire_command, sealed_replicas
from laminar.splits.seal import seal_batch

log = structlog.get_logger(__name__)

DRIVE_INTERVAL = 0.1
FOLLOWER_INTERVAL = 0.5
"""Seconds between looks of a node that does not drive splits (not the metadata leader)."""
SAMPLE_INTERVAL = 1.0
"""Seconds between load samples of automatic topics (``auto.py``)."""
SEAL_TIMEOUT = 5.0
RETIRE_INTERVAL = 1.0
"""Seconds between rounds that look for sealed partitions retention emptied (``retire.py``)."""


@dataclass
class SplitService:
    """``call(node, method, body, timeout)`` reaches a peer; ``propose`` commits a metadata
    command; ``is_metadata_leader`` says whether this node drives operations."""

    node_id: int
    state: MetadataState
    io: PartitionIO
    replica_for: Callable[[str, int], Replica | None]
    process_now: Callable[[Replica], None]
    call: Callable[[int, str, Any, float], Awaitable[Any]]
    propose: Callable[[dict[str, Any]], Awaitable[Any]]
    is_metadata_leader: Callable[[], bool]

    def __post_init__(self) -> None:
        self._acting: set[asyncio.Task[None]] = set()
        self._auto = AutoScaler()
        self._task: asyncio.Task[None] | None = None
        self._retiring = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="split-driver")

    async def stop(self) -> None:
        tasks = [t for t in [self._task, *self._acting] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # sealing, on a partition's leader -----------------------------------------------------
    async def serve_seal(self, _peer: int, body: dict[str, Any]) -> dict[str, int]:
        """Seal a partition this node leads (once); answer its end offset once committed."""
        topic, partition, op_id = str(body["topic"]), int(body["partition"]), str(body["op"])
        return {"end": await self.seal(topic, partition, op_id)}

    async def seal(self, topic: str, partition: int, op_id: str) -> int:
        replica = self.replica_for(topic, partition)
        if replica is None or replica.closed:
            raise NotLeaderError(f"no replica of {topic}/{partition} here")
        if not replica.is_leader:
            raise NotLeaderError(f"not the leader of {topic}/{partition}")
        storage = replica.storage
        if storage.seal_offset is None:
            try:
                replica.raft.propose(seal_batch(op_id, int(time.time() * 1000)), 1)
            except LaminarError:
                raise
            except Exception as exc:  # a proposal the core drops (leader transfer under way)
                raise NotLeaderError(f"cannot seal {topic}/{partition} now: {exc}") from None
            self.process_now(replica)  # in the log now: produce is refused from here on
        offset = storage.seal_offset
        if offset is None:
            raise NotLeaderError(f"the seal of {topic}/{partition} was not written")
        waiter = self.io.commit_waiter(replica, offset)
        if waiter is not None:
            (error,) = await self.io.await_commits([waiter], int(SEAL_TIMEOUT * 1000))
            if error is not None:
                raise error
        if storage.seal_offset != offset:
            raise NotLeaderError(f"the seal of {topic}/{partition} was replaced")
        return offset + 1

    # the driver, on the metadata leader ----------------------------------------------------
    async def _loop(self) -> None:
        """Feed the sans-I/O driver (``driver.py``) and carry out its actions."""
        driver: SplitDriver | None = None
        loop = asyncio.get_running_loop()
        next_sample = next_retire = 0.0
        while True:
            # (a node that is not the metadata leader only looks whether it became it)
            await asyncio.sleep(DRIVE_INTERVAL if driver is not None else FOLLOWER_INTERVAL)
            if not self.is_metadata_leader():
                driver = None  # a new leadership starts from what the metadata says
                self._auto = AutoScaler()
                continue
            if driver is None:
                driver = SplitDriver()
            if loop.time() >= next_sample and self._auto_topics():
                next_sample = loop.time() + SAMPLE_INTERVAL
                self._spawn(self._sample_and_decide())
            if loop.time() >= next_retire and not self._retiring:
                next_retire = loop.time() + RETIRE_INTERVAL
                if self._any_sealed():
                    self._retiring = True
                    self._spawn(self._retire_round())
            for action in driver.step(loop.time(), self.in_progress()):
                self._spawn(self._act(driver, action))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._acting.add(task)
        task.add_done_callback(self._acting.discard)

    # retiring sealed partitions retention emptied, on the metadata leader ---------------------
    def _any_sealed(self) -> bool:
        return any(
            a.state == "sealed" and a.replicas
            for t in self.state.topics.values()
            if t.settings.partitioning == "range"
            for a in t.partitions
        )

    async def serve_starts(self, _peer: int, _body: Any) -> list[list[int]]:
        return self.starts()

    def starts(self) -> list[list[int]]:
        """[topic id, partition, log start] of the sealed replicas hosted here."""
        out: list[list[int]] = []
        for name, topic_id, index in sealed_replicas(self.state.topics.values(), self.node_id):
            replica = self.replica_for(name, index)
            if replica is not None and not replica.closed:
                out.append([topic_id, index, replica.log.start_offset])
        return out

    async def _retire_round(self) -> None:
        try:
            nodes = [n for n in self.state.nodes if n != self.node_id]
            answers = await asyncio.gather(
                *(self.call(n, "split_starts", {}, RETIRE_INTERVAL) for n in nodes),
                return_exceptions=True,
            )
            starts: dict[tuple[int, int, int], int] = {}
            for node, answer in zip([self.node_id, *nodes], [self.starts(), *answers], strict=True):
                if isinstance(answer, list):
                    for item in answer:
                        with contextlib.suppress(TypeError, ValueError, IndexError):
                            starts[(int(item[0]), int(item[1]), node)] = int(item[2])
            for topic_id, partition in retirable(self.state.topics.values(), starts):
                try:
                    await self.propose(retire_command(topic_id, partition))
                    log.info("sealed partition retired", topic_id=topic_id, partition=partition)
                except (LaminarError, ConnectionError) as exc:
                    log.info("retirement refused", partition=partition, error=str(exc))
        finally:
            self._retiring = False

    # automatic splits and merges, on the metadata leader -------------------------------------
    def _auto_topics(self) -> dict[str, Policy]:
        found = {}
        for name, topic in self.state.topics.items():
            policy = policy_of(topic.settings)
            if policy is not None:
                found[name] = policy
        return found

    async def serve_load(self, _peer: int, _body: Any) -> list[list[Any]]:
        return self.load()

    def load(self) -> list[list[Any]]:
        """[topic, partition, log bytes] of the active partitions of auto topics led here."""
        out: list[list[Any]] = []
        for name in self._auto_topics():
            topic = self.state.topics[name]
            for index, assignment in enumerate(topic.partitions):
                if assignment.state != "active":
                    continue
                replica = self.replica_for(name, index)
                if replica is not None and replica.is_leader and not replica.closed:
                    out.append([name, index, replica.log.size_bytes])
        return out

    async def _sample_and_decide(self) -> None:
        nodes = [n for n in self.state.nodes if n != self.node_id]
        answers = await asyncio.gather(
            *(self.call(n, "split_load", {}, SAMPLE_INTERVAL) for n in nodes),
            return_exceptions=True,
        )
        now_ms = int(time.monotonic() * 1000)
        auto = self._auto
        for answer in [self.load(), *answers]:
            if isinstance(answer, list):
                for item in answer:
                    with contextlib.suppress(TypeError, ValueError):
                        auto.observe(now_ms, str(item[0]), int(item[1]), int(item[2]))
        policies = self._auto_topics()
        auto.forget(set(policies))
        views = []
        for name, policy in policies.items():
            topic = self.state.topics[name]
            partitions = [
                PartitionView(i, a.state, a.range_start, tuple(a.parents))
                for i, a in enumerate(topic.partitions)
            ]
            views.append((name, policy, partitions, topic.operation is not None))
        for command in auto.decide(now_ms, views):
            log.info("automatic operation", **command)
            try:
                await self.propose(command)
            except (LaminarError, ConnectionError) as exc:
                log.info("automatic operation refused", error=str(exc), **command)

    async def _act(self, driver: SplitDriver, action: Action) -> None:
        now = asyncio.get_running_loop().time
        if isinstance(action, Seal):
            try:
                end = await self._seal_anywhere(action.topic, action.partition, action.op_id)
            except (LaminarError, ConnectionError) as exc:
                log.debug("seal not done yet", partition=action.partition, error=str(exc))
                driver.seal_failed(action.op_id, action.partition, now())
                return
            driver.sealed(action.op_id, action.partition, end)
            return
        command = {
            "op": "finish_op",
            "name": action.topic,
            "op_id": action.op_id,
            "ends": {str(p): e for p, e in action.ends.items()},
            "request_id": f"finish-{action.op_id}",
        }
        try:
            await self.propose(command)
        except (LaminarError, ConnectionError) as exc:
            log.debug("finish not committed yet", topic=action.topic, error=str(exc))
            driver.finish_failed(action.op_id, now())
            return
        log.info("split or merge finished", topic=action.topic, op=action.op_id, ends=action.ends)

    def in_progress(self) -> list[tuple[str, dict[str, Any]]]:
        """(topic, operation) of every open split or merge, for ``cluster status``."""
        return [(t.name, t.operation) for t in self.state.topics.values() if t.operation]

    async def _seal_anywhere(self, name: str, partition: int, op_id: str) -> int:
        """Ask the recorded leader first, then every other replica (one of them leads)."""
        topic = self.state.topics.get(name)
        if topic is None or partition >= len(topic.partitions):
            raise UnknownTopicError(f"{name}/{partition} is gone")  # deleted meanwhile
        assignment = topic.partitions[partition]
        order = [assignment.leader, *assignment.replicas]
        last: BaseException = NotLeaderError(f"{name}/{partition} has no leader yet")
        for node in dict.fromkeys(n for n in order if n):
            try:
                if node == self.node_id:
                    return await self.seal(name, partition, op_id)
                body = {"topic": name, "partition": partition, "op": op_id}
                reply = await self.call(node, "seal_partition", body, SEAL_TIMEOUT + 1)
                return int(reply["end"])
            except (LaminarError, ConnectionError, KeyError, TypeError, ValueError) as exc:
                last = exc
        if isinstance(last, LaminarError | ConnectionError):
            raise last
        raise RequestTimeoutError(f"no replica of {name}/{partition} sealed it: {last}")
