"""The node side of splits and merges: sealing on a partition's leader, and the driver that
finishes open operations on the metadata leader.

The driver holds no state of its own: every ``DRIVE_INTERVAL`` the metadata leader looks at the
topics with an open operation (``Topic.operation``, see ``ops.py``) and, for each, asks every
parent's leader to seal it (idempotent: a sealed parent answers with its end) and then proposes
``finish_op`` with the ends. A new metadata leader therefore picks up whatever its predecessor
left, and a parent whose leader died is sealed by the next leader of its group.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from laminar.errors import LaminarError, NotLeaderError, RequestTimeoutError
from laminar.node.metadata import MetadataState
from laminar.node.partition_io import PartitionIO
from laminar.node.replica import Replica
from laminar.splits.seal import seal_batch

log = structlog.get_logger(__name__)

DRIVE_INTERVAL = 0.1
SEAL_TIMEOUT = 5.0


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
        self._driving: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="split-driver")

    async def stop(self) -> None:
        tasks = [t for t in [self._task, *self._driving.values()] if t is not None]
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
        while True:
            await asyncio.sleep(DRIVE_INTERVAL)
            if not self.is_metadata_leader():
                continue
            for topic in list(self.state.topics.values()):
                operation = topic.operation
                if operation is None or operation["id"] in self._driving:
                    continue
                task = asyncio.create_task(self._drive(topic.name, dict(operation)))
                self._driving[operation["id"]] = task
                task.add_done_callback(lambda _t, key=operation["id"]: self._driving.pop(key))

    def in_progress(self) -> list[tuple[str, dict[str, Any]]]:
        """(topic, operation) of every open split or merge, for ``cluster status``."""
        return [(t.name, t.operation) for t in self.state.topics.values() if t.operation]

    async def _drive(self, name: str, operation: dict[str, Any]) -> None:
        """Seal every parent, then finish; retried until done or no longer ours to drive."""
        ends: dict[int, int] = {}
        while self.is_metadata_leader() and self._open(name, operation["id"]):
            try:
                for parent in operation["parents"]:
                    if parent not in ends:
                        ends[parent] = await self._seal_anywhere(name, parent, operation["id"])
                await self.propose(
                    {
                        "op": "finish_op",
                        "name": name,
                        "op_id": operation["id"],
                        "ends": {str(p): e for p, e in ends.items()},
                        "request_id": f"finish-{operation['id']}",
                    }
                )
                log.info("split finished", topic=name, **operation)
            except (LaminarError, ConnectionError) as exc:
                log.debug("split step failed; retrying", topic=name, error=str(exc))
                await asyncio.sleep(0.2)

    def _open(self, name: str, op_id: str) -> bool:
        topic = self.state.topics.get(name)
        return topic is not None and topic.operation is not None and topic.operation["id"] == op_id

    async def _seal_anywhere(self, name: str, partition: int, op_id: str) -> int:
        """Ask the recorded leader first, then every other replica (one of them leads)."""
        topic = self.state.topics[name]
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
