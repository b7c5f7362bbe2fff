"""Produce, fetch and list-offsets against the partitions a node hosts, protocol-neutral.

Both client protocols call this: the native one (``client_api.ClientServer``, Cap'n Proto)
and the Kafka listener (``laminar/kafka``). It knows replicas, logs and Raft, nothing about
how a request was encoded; errors are laminar's typed errors, each protocol maps them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import structlog

from laminar.errors import (
    CorruptBatchError,
    CorruptLogError,
    InvalidRequestError,
    NotLeaderError,
    OffsetOutOfRangeError,
    PartitionRetiredError,
    PartitionSealedError,
    RequestTimeoutError,
    UnknownPartitionError,
    UnknownTopicError,
)
from laminar.node import sequences
from laminar.node.admission import Admitted
from laminar.node.replica import Replica, Waiter
from laminar.segment import batch as record_batch
from laminar.segment.batch import BatchHeader
from laminar.splits.ops import ACTIVE, PENDING, RETIRED

if TYPE_CHECKING:
    from laminar.node.node import Node

log = structlog.get_logger(__name__)

ACKS_NONE, ACKS_LEADER, ACKS_ALL = 0, 1, -1


class PartitionIO:
    """The node's partitions as a client protocol needs them."""

    def __init__(self, node: Node) -> None:
        self.node = node

    @property
    def max_batch_bytes(self) -> int:
        return self.node.config.max_batch_bytes

    # finding replicas ------------------------------------------------------------------------
    def any_replica(self, topic_name: str, partition: int) -> Replica:
        """This node's replica of the partition (leader or not); NotLeader if it has none."""
        node = self.node
        topic = node.state.topics.get(topic_name)
        if topic is None:
            raise UnknownTopicError(f"unknown topic {topic_name!r}")
        if not 0 <= partition < len(topic.partitions):
            raise UnknownPartitionError(
                f"topic {topic_name!r} has {len(topic.partitions)} partitions, "
                f"not partition {partition}"
            )
        replica = node.replica_for(topic_name, partition)
        if replica is None and topic.partitions[partition].state == RETIRED:
            raise PartitionRetiredError(
                f"{topic_name}/{partition} was retired: retention removed all its records"
            )
        if replica is None:
            leader = topic.partitions[partition].leader
            raise NotLeaderError(
                f"no replica of {topic_name}/{partition} on this node",
                leader,
                node.address_of(leader) if leader else "",
            )
        return replica

    def leader_replica(self, topic_name: str, partition: int) -> Replica:
        replica = self.any_replica(topic_name, partition)
        if not replica.is_leader:
            raise replica.not_leader(self.node.address_of)
        return replica

    # produce ---------------------------------------------------------------------------------
    def verify(self, data: memoryview | bytes) -> BatchHeader:
        """A client's batch, checked whole (length, magic, crc, limit); control is refused."""
        header = record_batch.verify_batch(data, self.node.config.max_batch_bytes)
        if record_batch.is_control(header):
            raise InvalidRequestError("clients may not produce control batches")
        return header

    def append(
        self, replica: Replica, data: memoryview | bytes, header: BatchHeader
    ) -> tuple[int, int]:
        """Propose a verified batch on the leader; a retry of a batch the log already holds
        (same producer id and sequence) gets the first write's offsets instead, and an
        idempotent batch out of sequence is refused (``laminar.node.sequences``)."""
        producers = replica.storage.producers
        earlier = producers.find(header)
        if earlier is not None:
            return earlier.base_offset, earlier.last_offset
        # After the duplicate check: a retry of a batch written before the seal gets its
        # offsets, not an error that would make the producer write it again elsewhere. Before
        # the sequence check: a sealed partition refuses every new batch as sealed.
        if replica.storage.seal_offset is not None or self._not_active(replica):
            raise self.sealed_error(replica)
        sequences.check(producers, header)  # None here: a remembered batch was found above
        base, last = replica.raft.propose(data, header.record_count)
        replica.storage.producers.record(header, base, last)
        self.node.request_stats.produce(replica.topic, header.record_count, len(data))
        return base, last

    def _not_active(self, replica: Replica) -> bool:
        topic = self.node.state.topics.get(replica.topic)
        if topic is None or replica.partition >= len(topic.partitions):
            return False
        return topic.partitions[replica.partition].state != ACTIVE

    def sealed_error(self, replica: Replica) -> PartitionSealedError:
        """The typed refusal of a write to a sealed (or not yet active) partition."""
        topic = self.node.state.topics.get(replica.topic)
        name, partition = replica.topic, replica.partition
        if topic is not None and partition < len(topic.partitions):
            if topic.partitions[partition].state == PENDING:
                return PartitionSealedError(
                    f"{name}/{partition} is not active yet (its split or merge is finishing)"
                )
            children = [i for i, a in enumerate(topic.partitions) if partition in a.parents]
            if children:
                listed = ", ".join(map(str, children))
                return PartitionSealedError(
                    f"{name}/{partition} is sealed; its range moved to partitions {listed}"
                )
        return PartitionSealedError(f"{name}/{partition} is sealed")

    def admitted(self, batches: int, acks: int, timeout_ms: int) -> Admitted:
        """``async with io.admitted(n, acks, timeout_ms) as proposed:`` waits for room to
        propose ``n`` batches (``admission.py``); the caller appends the commit waiter's future
        of every batch it proposed. With acks=all the caller awaits them all (``await_commits``
        settles each by its deadline); otherwise the room comes back after ``timeout_ms`` at
        the latest."""
        timeout_s = None if acks == ACKS_ALL else timeout_ms / 1000
        return self.node.produce_admission.admit(batches, timeout_s)

    def commit_waiter(self, replica: Replica, last: int) -> Waiter | None:
        """A waiter released once ``last`` is committed (None: it already is)."""
        if last <= replica.raft.commit:
            return None
        waiter = Waiter(last, asyncio.get_running_loop().create_future())
        replica.commit_waiters.append(waiter)
        return waiter

    def appended(self, replicas: Iterable[Replica], acks: int) -> None:
        """After a request's appends: acks=leader writes them to the leader's log before the
        reply leaves; otherwise the runtime picks them up on its next drain."""
        runtime = self.node.runtime
        for replica in replicas:
            if acks == ACKS_LEADER:
                runtime.process_now(replica)
            else:
                runtime.wake(replica)

    @staticmethod
    async def await_commits(waiters: list[Waiter], timeout_ms: int) -> list[BaseException | None]:
        """Wait for every waiter; each one's outcome (None: committed)."""
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await settled(w.future for w in waiters)
        except TimeoutError:
            pass
        except asyncio.CancelledError:  # every waiter settles: its produce admission with it
            for waiter in waiters:
                waiter.future.cancel()
            raise
        out: list[BaseException | None] = []
        for waiter in waiters:
            future = waiter.future
            if not future.done() or future.cancelled():
                future.cancel()
                out.append(RequestTimeoutError("the write did not commit in time; it may still"))
            else:
                out.append(future.exception())
        return out

    # fetch -----------------------------------------------------------------------------------
    def check_fetch_offset(self, replica: Replica, offset: int) -> None:
        if not (replica.log.start_offset <= offset <= replica.high_watermark):
            raise OffsetOutOfRangeError(offset, replica.log.start_offset, replica.high_watermark)

    @staticmethod
    async def wait_for_data(replicas: list[Replica], max_wait_s: float) -> None:
        """Long poll: return once any of ``replicas`` gets new committed data, or at the
        deadline."""
        if max_wait_s <= 0 or not replicas:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for replica in replicas:
            replica.fetch_waiters.append(waiter)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max_wait_s):
                await waiter  # one loop turn after the high watermark moved

    def read(self, replica: Replica, offset: int, limit: int) -> bytes:
        """Whole committed batches from ``offset`` (at least one if any), about ``limit``
        bytes. Damaged bytes are never served: the replica goes offline to be repaired and
        the client is told NotLeader (to go to the new leader meanwhile)."""
        try:
            with replica.log.read(offset, limit, upto=replica.high_watermark) as log_slice:
                data = log_slice.tobytes()
                offsets = log_slice.next_offset - offset
        except CorruptLogError as exc:
            self.node.runtime.fail(replica, exc)
            raise NotLeaderError("replica offline after a storage fault") from None
        self.node.request_stats.fetch(replica.topic, offsets, len(data))
        return data

    # offsets ---------------------------------------------------------------------------------
    @staticmethod
    def offset_for_time(replica: Replica, timestamp: int) -> int | None:
        """The first committed offset whose record timestamp >= ``timestamp``, or None."""
        found = first_record_at(replica, timestamp)
        return found[0] if found is not None else None

    @staticmethod
    def record_at_time(replica: Replica, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first committed record at or after ``timestamp``."""
        return first_record_at(replica, timestamp)


def first_record_at(replica: Replica, timestamp: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the first committed record with a timestamp >= ``timestamp``
    (Kafka's ListOffsets).

    The time index finds the first batch whose newest record reaches the time; the records
    inside that one batch are then checked, since a batch spans a range of timestamps (a
    compressed batch is inflated for that, as Kafka's broker does, unless its first record
    already qualifies; one that does not inflate answers its base offset, and its readers get
    the CorruptBatchError).
    """
    high = replica.high_watermark
    found = replica.log.offset_for_timestamp(timestamp)
    if found is None or found >= high:
        return None
    (batch,) = replica.log.batches(found, found + 1, 1)[:1]
    header = record_batch.read_header(batch)
    if header.first_timestamp >= timestamp:
        return header.base_offset, header.first_timestamp
    try:
        records = record_batch.decode_records(batch)
    except CorruptBatchError as exc:
        log.warning("batch does not decode for a time lookup", offset=found, error=str(exc))
        return found, header.max_timestamp
    for record in records:
        if record.timestamp >= timestamp:
            return (record.offset, record.timestamp) if record.offset < high else None
    return None


async def settled(futures: Iterable[asyncio.Future[Any]]) -> None:
    """Wait until every future is done, successful or not. The task resumes one loop turn
    after the last one is done (``asyncio.wait`` takes two: its callback, then the task), which
    is on the path of every acks=all reply."""
    for future in futures:
        if not future.done():
            with contextlib.suppress(Exception):
                await future
