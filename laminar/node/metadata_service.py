"""Metadata commands: proposed on (or forwarded to) the metadata leader, applied everywhere.

Commands are small JSON documents carried as the single record of a record batch in the
metadata group's log. A node that is not the leader forwards them over the peer connection; a
node that just joined and knows no leader yet asks any peer to forward for it. The caller then
waits until its own node has applied the command, so what it reads next reflects it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import structlog

from laminar.errors import InvalidRequestError, LaminarError, NotLeaderError, RequestTimeoutError
from laminar.node.metadata import (
    TopicSettings,
    decode_command,
    encode_command,
    place_replicas,
    validate_topic_name,
)
from laminar.raft import Entry
from laminar.segment import batch as record_batch

if TYPE_CHECKING:
    from laminar.node.node import Node

log = structlog.get_logger(__name__)


def now_ms() -> int:
    return int(time.time() * 1000)


class MetadataService:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.applied = -1
        """Last metadata offset applied on this node."""
        self._applied_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._waiters: dict[int, asyncio.Future[Any]] = {}

    async def propose(self, command: dict[str, Any], timeout: float = 10.0) -> Any:
        """Commit a metadata command (forwarded to the metadata leader) and wait until applied
        on this node; returns the command's JSON-able result."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.node.metadata is not None
            leader = self.node.metadata.raft.leader_id
            try:
                if self.node.metadata.is_leader:
                    result = await self._propose_local(command)
                else:
                    # A node that just joined knows no leader yet: any peer forwards for it.
                    target = leader if leader and self.node.peers.connected(leader) else 0
                    target = target or next(iter(self.node.peers.connected_peers()), 0)
                    if not target:
                        raise NotLeaderError("no metadata leader known yet")
                    result = await self.node.calls.call(
                        target, "propose", command, max(0.1, deadline - time.monotonic())
                    )
                await self.wait_applied(result["index"], deadline - time.monotonic())
                return result
            except (NotLeaderError, ConnectionError):
                if time.monotonic() > deadline:
                    raise RequestTimeoutError("no metadata leader answered in time") from None
                await asyncio.sleep(0.05)

    async def serve_propose(self, peer: int, command: dict[str, Any]) -> Any:
        """Commit on behalf of a peer, forwarding once to the leader if this node is not it."""
        assert self.node.metadata is not None
        if self.node.metadata.is_leader:
            return await self._propose_local(command)
        leader = self.node.metadata.raft.leader_id
        if leader and leader != peer and self.node.peers.connected(leader):
            return await self.node.calls.call(leader, "propose_here", command)
        raise NotLeaderError("not the metadata leader")

    async def serve_propose_here(self, _peer: int, command: dict[str, Any]) -> Any:
        assert self.node.metadata is not None
        if not self.node.metadata.is_leader:
            raise NotLeaderError("not the metadata leader")
        return await self._propose_local(command)

    async def _propose_local(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.node.metadata is not None
        command = self._prepare(command)
        data = record_batch.build_batch([(None, encode_command(command), (), now_ms())])
        index, _ = self.node.metadata.raft.propose(data, 1)
        future = asyncio.get_running_loop().create_future()
        self._waiters[index] = future
        self.node.runtime.wake(self.node.metadata)
        try:
            result = await asyncio.wait_for(future, 10.0)
        except TimeoutError:
            raise RequestTimeoutError("metadata command did not commit in time") from None
        finally:
            self._waiters.pop(index, None)
        return {"index": index, "result": result}

    def _prepare(self, command: dict[str, Any]) -> dict[str, Any]:
        """On the metadata leader: turn a request into a deterministic command."""
        if command.get("op") != "create_topic" or "replicas" in command:
            return command
        validate_topic_name(command["name"])
        settings = TopicSettings(**command["settings"])
        replicas = place_replicas(
            settings.partitions,
            settings.replication_factor,
            self.node.live_nodes(),
            self.node.state.replica_counts(),
        )
        return {**command, "replicas": replicas}

    async def wait_applied(self, index: int, timeout: float) -> None:
        if self.applied >= index:
            return
        future = asyncio.get_running_loop().create_future()
        self._applied_waiters.append((index, future))
        try:
            await asyncio.wait_for(future, max(timeout, 0.1))
        except TimeoutError:
            raise RequestTimeoutError("metadata change not yet applied on this node") from None

    def apply(self, entry: Entry) -> None:
        """Apply one committed metadata entry (called by the runtime, in log order)."""
        future = self._waiters.pop(entry.index, None)
        try:
            record = record_batch.decode_records(entry.data)[0]
            command = decode_command(record.value or b"{}")
            result = self.node.state.apply(command)
            self.node.reconcile(command, result, entry.index)
            outcome: Any = _jsonable(result)
        except LaminarError as exc:
            outcome = exc
        except Exception as exc:  # a bad command must never stop the metadata group
            log.exception("metadata command failed", index=entry.index)
            outcome = InvalidRequestError(f"metadata command failed: {exc}")
        self.applied = entry.last
        if future is not None and not future.done():
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        if self._applied_waiters:
            still = []
            for index, waiter in self._applied_waiters:
                if index <= self.applied:
                    if not waiter.done():
                        waiter.set_result(None)
                else:
                    still.append((index, waiter))
            self._applied_waiters = still


def _jsonable(result: Any) -> Any:
    if result is None or isinstance(result, int | str):
        return result
    try:
        return asdict(result)
    except TypeError:
        return None
