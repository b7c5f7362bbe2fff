"""Metadata commands: proposed on (or forwarded to) the metadata leader, applied everywhere.

Commands are small JSON documents carried as the single record of a record batch in the
metadata group's log. A node that is not the leader forwards them over the peer connection; a
node that just joined and knows no leader yet asks any peer to forward for it. The caller then
waits until its own node has applied the command, so what it reads next reflects it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import structlog

from laminar.errors import (
    InvalidRequestError,
    LaminarError,
    NotLeaderError,
    ProtocolError,
    RequestTimeoutError,
    UnknownTopicError,
)
from laminar.node import metadata_checkpoint as checkpoints
from laminar.node.metadata import (
    MAX_PARTITIONS,
    METADATA_GROUP,
    TopicSettings,
    decode_command,
    encode_command,
    place_replicas,
    validate_topic_name,
)
from laminar.node.metadata_resync import resync
from laminar.raft import Entry
from laminar.segment import batch as record_batch
from laminar.splits import ops as split_ops

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
        self._waiters: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        """Offset proposed at -> (request id, caller): an offset alone does not identify a
        command, since after a leader change another command may be committed there."""
        self.checkpoint_index = -1
        """Offset of the newest checkpoint applied on this node (-1: none)."""
        self.checkpoint_bytes = 0
        """Size of that checkpoint's batch."""
        self.since_checkpoint = [0, 0]
        """Commands and their bytes applied since that checkpoint (or the log's start)."""
        self.partial = False
        """The entries handed out lately follow a gap (a log starting above 0, or reset by the
        leader): the history before them was never applied here, so every command is skipped
        until a checkpoint restates the whole state."""
        self.skipped = 0
        self._check_soon = False
        """Commands skipped while ``partial`` (a log must start at a checkpoint: never > 0)."""

    async def propose(self, command: dict[str, Any], timeout: float = 10.0) -> Any:
        """Commit a metadata command (forwarded to the metadata leader) and wait until applied
        on this node; returns the command's JSON-able result.

        The command gets a request id once, here: a retry after a lost or replaced proposal
        carries the same id, so the state machine applies it at most once and a retried
        ``create_topic`` answers with the topic it created rather than TopicExistsError.
        """
        command = with_request_id(command)
        deadline = time.monotonic() + timeout
        while True:
            assert self.node.metadata is not None
            leader = self.node.metadata.raft.leader_id
            try:
                if self.node.metadata.is_leader:
                    result = await self._propose_local(command)
                else:
                    # A node that just joined knows no leader yet: any peer forwards for it
                    # (a registered one, once it knows them: the peer port admits strangers).
                    target = leader if leader and self.node.peers.connected(leader) else 0
                    target = target or self._forwarder()
                    if not target:
                        raise NotLeaderError("no metadata leader known yet")
                    result = _checked_reply(
                        await self.node.calls.call(
                            target, "propose", command, max(0.1, deadline - time.monotonic())
                        )
                    )
                await self.wait_applied(result["index"], deadline - time.monotonic())
                return result
            except (NotLeaderError, RequestTimeoutError, ConnectionError, ProtocolError):
                # Safe to retry: the request id makes a second copy a no-op.
                if time.monotonic() > deadline:
                    raise RequestTimeoutError("no metadata leader answered in time") from None
                await asyncio.sleep(0.05)

    def caught_up(self) -> bool:
        """This node knows a metadata leader and has applied every entry it knows committed
        (as the leader: once it has committed an entry of its own term, which commits all
        before it). False right after a restart and while no leader is known; readers of
        settings that must not answer from a stale copy wait."""
        replica = self.node.metadata
        if replica is None or replica.raft.leader_id == 0:
            return False
        raft = replica.raft
        if replica.is_leader and not (raft.commit >= 0 and raft.log.term(raft.commit) == raft.term):
            return False  # a new leader knows its predecessors' entries committed only then
        return replica.applied_through >= raft.commit

    async def wait_caught_up(self, timeout: float) -> None:
        """Wait until ``caught_up``; RequestTimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.caught_up():
            if time.monotonic() > deadline:
                raise RequestTimeoutError("this node's metadata is not caught up yet")
            await asyncio.sleep(0.02)

    def _forwarder(self) -> int:
        """A connected peer to forward a proposal through when no leader is known."""
        connected = list(self.node.peers.connected_peers())
        registered = self.node.state.nodes
        if registered:
            connected = [peer for peer in connected if peer in registered]
        return connected[0] if connected else 0

    async def serve_propose(self, peer: int, command: dict[str, Any]) -> Any:
        """Commit on behalf of a peer, forwarding once to the leader if this node is not it."""
        if self.node.metadata is None:
            raise NotLeaderError("metadata not open yet")
        if self.node.metadata.is_leader:
            return await self._propose_local(command)
        leader = self.node.metadata.raft.leader_id
        if leader and leader != peer and self.node.peers.connected(leader):
            return await self.node.calls.call(leader, "propose_here", command)
        raise NotLeaderError("not the metadata leader")

    async def serve_propose_here(self, _peer: int, command: dict[str, Any]) -> Any:
        if self.node.metadata is None or not self.node.metadata.is_leader:
            raise NotLeaderError("not the metadata leader")
        return await self._propose_local(command)

    async def _propose_local(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.node.metadata is not None
        command = self._prepare(with_request_id(command))
        data = record_batch.build_batch([(None, encode_command(command), (), now_ms())])
        index, _ = self.node.metadata.raft.propose(data, 1)
        future = asyncio.get_running_loop().create_future()
        self._waiters[index] = (command["request_id"], future)
        self.node.runtime.wake(self.node.metadata)
        try:
            async with asyncio.timeout(10.0):
                result = await future
        except TimeoutError:
            raise RequestTimeoutError("metadata command did not commit in time") from None
        finally:
            waiter = self._waiters.get(index)
            if waiter is not None and waiter[1] is future:
                del self._waiters[index]
        return {"index": index, "result": result}

    def leadership_lost(self) -> None:
        """This node stopped leading the metadata group: what it proposed may be replaced.

        Waiters fail with NotLeaderError and ``propose`` retries with the same request id: if
        the first copy commits after all, the retry is answered with its outcome.
        """
        self._fail_waiters(lambda _index: True, "metadata leadership lost")

    def _fail_waiters(self, which: Any, reason: str) -> None:
        for index in [i for i in self._waiters if which(i)]:
            _request_id, future = self._waiters.pop(index)
            if not future.done():
                future.set_exception(NotLeaderError(reason))

    def _prepare(self, command: dict[str, Any]) -> dict[str, Any]:
        """On the metadata leader: turn a request into a deterministic command."""
        if command.get("op") == "replica_lost" and command.get("group") == METADATA_GROUP:
            # Only the metadata group's leader knows its voters: is the replica to vote again?
            assert self.node.metadata is not None
            conf = self.node.metadata.raft.conf
            return {**command, "voter": command["node"] not in conf.learners}
        if command.get("op") in ("begin_split", "begin_merge") and "replicas" not in command:
            return self._place_children(command)
        if command.get("op") == "create_user":
            return self.node.state.auth.prepare(command)
        if command.get("op") not in ("create_topic", "add_partitions") or "replicas" in command:
            return command
        if command["op"] == "add_partitions":
            return self._place_added_partitions(command)
        validate_topic_name(command["name"])
        settings = TopicSettings(**command["settings"])
        replicas = place_replicas(
            settings.partitions,
            settings.replication_factor,
            self.node.live_nodes(),
            self.node.state.replica_counts(),
        )
        return {**command, "replicas": replicas}

    def _place_added_partitions(self, command: dict[str, Any]) -> dict[str, Any]:
        """Place the replicas of the partitions a topic grows by, like a new topic's."""
        topic = self.node.state.topics.get(command["name"])
        if topic is None:
            raise UnknownTopicError(f"unknown topic {command['name']!r}")
        current, total = len(topic.partitions), command["total"]
        if total <= current:
            raise InvalidRequestError(
                f"topic {topic.name!r} has {current} partitions; partitions can only be added"
            )
        if total >= MAX_PARTITIONS:
            raise InvalidRequestError(f"a topic has at most {MAX_PARTITIONS - 1} partitions")
        replicas = place_replicas(
            total - current,
            topic.settings.replication_factor,
            self.node.live_nodes(),
            self.node.state.replica_counts(),
            first=current,
        )
        return {**command, "from": current, "replicas": replicas}

    def _place_children(self, command: dict[str, Any]) -> dict[str, Any]:
        """Place the partitions a split or merge creates (checked against the state now; the
        state machine checks again in log order)."""
        topic = self.node.state.topics.get(command["name"])
        if topic is None:
            raise UnknownTopicError(f"unknown topic {command['name']!r}")
        _parents, ranges = split_ops.plan_children(topic, command)
        current = len(topic.partitions)
        if current + len(ranges) >= MAX_PARTITIONS:
            raise InvalidRequestError(f"a topic has at most {MAX_PARTITIONS - 1} partitions")
        replicas = place_replicas(
            len(ranges),
            topic.settings.replication_factor,
            self.node.live_nodes(),
            self.node.state.replica_counts(),
            first=current,
        )
        return {**command, "from": current, "replicas": replicas}

    async def wait_applied(self, index: int, timeout: float) -> None:
        if self.applied >= index:
            return
        future = asyncio.get_running_loop().create_future()
        self._applied_waiters.append((index, future))
        try:
            async with asyncio.timeout(max(timeout, 0.1)):
                await future
        except TimeoutError:
            raise RequestTimeoutError("metadata change not yet applied on this node") from None

    def apply_gap(self, index: int) -> None:
        """The runtime hands out entries from ``index`` on, and never applied those before."""
        if index > 0:
            self.partial = True
            log.info("metadata log resumes after a gap: rebuilding from a checkpoint", index=index)

    def apply(self, entry: Entry) -> None:
        """Apply one committed metadata entry (called by the runtime, in log order)."""
        if self._waiters:  # offsets below this one hold entries that were not our commands
            self._fail_waiters(lambda i: i < entry.index, "metadata entry replaced")
        waiter = self._waiters.pop(entry.index, None)
        command: dict[str, Any] = {}
        outcome: Any = None
        applied_now = False
        if checkpoints.is_checkpoint(entry.data):
            self._apply_checkpoint(entry)
        elif self.partial:
            self.skipped += 1  # covered by no checkpoint this node has: never applied alone
            log.error("metadata command skipped: no checkpoint before it", index=entry.index)
        else:
            self.since_checkpoint[0] += 1
            self.since_checkpoint[1] += len(entry.data)
            if self._leading and not self._check_soon and self.checkpoint_due():
                # Right after this pass (not inside it: the core is mid-Ready), while the log
                # may be fully applied; the checkpoint loop retries otherwise.
                self._check_soon = True
                asyncio.get_running_loop().call_soon(self._checkpoint_soon)
            try:
                record = record_batch.decode_records(entry.data)[0]
                command = decode_command(record.value or b"{}")
                result, applied_now = self.node.state.apply_once(command, entry.index)
                if waiter is not None:  # (a 10,000-partition topic takes 0.1 s to convert)
                    outcome = _jsonable(result)
            except LaminarError as exc:
                outcome, applied_now = exc, False
            except Exception as exc:  # a bad command must never stop the metadata group
                log.exception("metadata command failed", index=entry.index)
                outcome = InvalidRequestError(f"metadata command failed: {exc}")
                applied_now = False
        if applied_now:
            try:
                self.node.reconcile(command, result, entry.index)
            except Exception:  # this node's side effects failed; the command stands everywhere
                log.exception("acting on a metadata command failed", index=entry.index)
        self.applied = entry.last
        if waiter is not None and not waiter[1].done():
            request_id, future = waiter
            if command.get("request_id") != request_id:
                # Another leader's command took the offset ours was proposed at.
                future.set_exception(NotLeaderError("metadata entry replaced by another command"))
            elif isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        if self._applied_waiters:
            still = []
            for index, applied_waiter in self._applied_waiters:
                if index <= self.applied:
                    if not applied_waiter.done():
                        applied_waiter.set_result(None)
                else:
                    still.append((index, applied_waiter))
            self._applied_waiters = still

    def _apply_checkpoint(self, entry: Entry) -> None:
        """A checkpoint: a no-op where the state already equals it; else (after a gap, or if
        this node's state diverged) the state is rebuilt from it and this node's side effects
        (replicas hosted, moves, peers) reconciled with the result."""
        try:
            data = checkpoints.checkpoint_data(entry.data)
            assert data is not None
            state = self.node.state
            if self.partial or checkpoints.encode(state) != data:
                if not self.partial:
                    log.error("metadata state differs from the checkpoint", index=entry.index)
                known_nodes = dict(state.nodes)
                checkpoints.restore(state, data)
                self.partial = False
                log.info("metadata state rebuilt from a checkpoint", index=entry.index)
                try:
                    resync(self.node, known_nodes, entry.index)
                except Exception:
                    log.exception("acting on a metadata checkpoint failed", index=entry.index)
        except LaminarError:
            log.exception("metadata checkpoint unreadable", index=entry.index)
            return
        self.checkpoint_index = entry.index
        self.checkpoint_bytes = len(entry.data)
        self.since_checkpoint = [0, 0]

    @property
    def _leading(self) -> bool:
        replica = self.node.metadata
        return replica is not None and replica.is_leader

    def _checkpoint_soon(self) -> None:
        self._check_soon = False
        try:
            self.maybe_checkpoint()
        except Exception:
            log.exception("metadata checkpoint failed")

    def checkpoint_due(self) -> bool:
        """Whether the commands (or bytes) since the last checkpoint call for a new one."""
        commands, size = self.since_checkpoint
        config = self.node.config
        return commands >= config.metadata_checkpoint_commands or size >= max(
            config.metadata_checkpoint_bytes, 2 * self.checkpoint_bytes
        )

    def maybe_checkpoint(self) -> int:
        """On the metadata leader: propose a checkpoint if one is due and the state is exactly
        that of the whole log (every entry in it applied, nothing in flight: the checkpoint
        entry goes right after). Returns its offset, or -1."""
        replica = self.node.metadata
        if replica is None or replica.closed or not replica.is_leader or self.partial:
            return -1
        raft = replica.raft
        if not self.caught_up() or replica.applied_through != raft.last_index:
            return -1
        if not self.checkpoint_due():
            return -1
        data = checkpoints.checkpoint_batch(self.node.state, now_ms())
        if len(data) > replica.log.config.max_batch_bytes:
            log.error("metadata checkpoint exceeds the batch limit", size=len(data))
            return -1
        try:
            index, _ = raft.propose(data, 1)
        except LaminarError as exc:  # leadership being transferred, backlog full
            log.debug("metadata checkpoint not proposed", error=str(exc))
            return -1
        self.node.runtime.wake(replica)
        log.info("metadata checkpoint proposed", index=index, size=len(data))
        return index

    def compact(self) -> int:
        """Delete the metadata log's segments below the newest checkpoint this node applied
        and holds durably (never anything a checkpoint does not cover; the checkpoint stays).
        Returns how many segments went."""
        replica = self.node.metadata
        at = self.checkpoint_index
        if replica is None or replica.closed or at <= replica.log.start_offset:
            return 0
        if replica.log.durable_offset <= at:
            return 0
        return replica.log.discard_before(at)

    async def checkpoint_loop(self, interval: float = 0.2) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                self.maybe_checkpoint()
                self.compact()
            except Exception:  # a storage fault here must not end the loop
                log.exception("metadata checkpoint or compaction failed")


def with_request_id(command: dict[str, Any]) -> dict[str, Any]:
    """The command with a unique ``request_id`` (kept if it has one already)."""
    if isinstance(command.get("request_id"), str):
        return command
    return {**command, "request_id": uuid.uuid4().hex}


def _jsonable(result: Any) -> Any:
    if result is None or isinstance(result, int | str | dict):
        return result
    try:
        return asdict(result)
    except TypeError:
        return None


def _checked_reply(reply: Any) -> dict[str, Any]:
    """A forwarded proposal's answer, as a peer sent it: ``{"index": offset, "result": ...}``.

    Anything else (a garbled or forged reply) is a ProtocolError, which ``propose`` retries
    like a lost connection instead of letting it end the proposer."""
    index = reply.get("index") if isinstance(reply, dict) else None
    if type(index) is not int or index < 0:
        raise ProtocolError(f"malformed answer to a forwarded metadata proposal: {reply!r:.200}")
    return reply
