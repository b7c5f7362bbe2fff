"""Share groups (queues) on a real node, spoken in the raw client protocol: acquire, settle,
redelivery, dead letters, delayed records, and state that survives a restart because it is
written to the partition's own log."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.client.connection import Connection
from laminar.client.share_wire import AckRun, ack_errors, share_fetch
from laminar.errors import LaminarError, ReceiptExpiredError
from laminar.node.node import Node
from laminar.protocol import read_error
from laminar.queues.driver import DELIVER_AT_HEADER
from laminar.segment.batch import decode_records, iter_batches
from tests.single_node import SingleNode, create_topic

TOPIC = "jobs"
ACK, RELEASE, REJECT, EXTEND = range(4)


class Member:
    """One share-group member over one raw connection to the (single) node."""

    def __init__(self, connection: Connection, group: str, member_id: str) -> None:
        self.connection = connection
        self.group = group
        self.member_id = member_id

    async def fetch(
        self,
        max_records: int,
        acks: list[tuple[int, int, int, int]] = (),  # (offset, delivery, action, ms)
        *,
        lock_ms: int = 0,
        wait_ms: int = 0,
    ) -> tuple[list[tuple[int, int, bytes]], list[LaminarError | None]]:
        """[(offset, delivery count, value)] acquired, and one result per ack."""

        def fill(body: Any) -> None:
            request = body.init("shareFetch")
            request.group, request.memberId = self.group, self.member_id
            request.init("partitions", 1)[0].topic = TOPIC
            request.maxRecords = max_records
            request.lockMs = lock_ms
            request.maxWaitMs = wait_ms
            request.fromEarliest = True
            slots = request.init("acks", len(acks))
            for slot, (offset, delivery, action, ms) in zip(slots, acks, strict=True):
                slot.topic, slot.partition, slot.offset = TOPIC, 0, offset
                slot.deliveryCount, slot.action, slot.ms = delivery, action, ms

        reply, payload = await self.connection.request(fill, timeout=30)
        out = reply.body.shareFetch
        got: list[tuple[int, int, bytes]] = []
        for result in out.results:
            error = read_error(result.error)
            if error is not None:
                raise error
            counts = {a.offset: a.deliveryCount for a in result.acquired}
            data = payload[result.payloadOffset : result.payloadOffset + result.payloadLength]
            for pos, header in iter_batches(data):
                for record in decode_records(data[pos : pos + header.batch_length]):
                    if record.offset in counts:
                        got.append((record.offset, counts[record.offset], record.value or b""))
        return got, [read_error(r.error) for r in out.ackResults]


async def test_a_queue_delivers_settles_redelivers_dead_letters_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    single = SingleNode(tmp_path)
    bootstrap = single.bootstrap
    node = await single.start()
    try:
        await create_topic(bootstrap, TOPIC, 1)
        async with Producer(bootstrap) as producer:
            for i in range(10):
                await producer.send_and_wait(TOPIC, f"v{i}".encode(), partition=0)
        connection = await Connection.open(bootstrap)
        a, b = Member(connection, "q", "a"), Member(connection, "q", "b")
        got_a, _ = await a.fetch(4)
        got_b, _ = await b.fetch(4)
        assert [v for _o, _c, v in got_a] == [b"v0", b"v1", b"v2", b"v3"]
        assert [v for _o, _c, v in got_b] == [b"v4", b"v5", b"v6", b"v7"]
        assert all(c == 1 for _o, c, _v in got_a + got_b)
        # a acks two, releases one, rejects one; b's receipt is no good for a's record
        (o0, _, _), (o1, _, _), (o2, _, _), (o3, _, _) = got_a
        _, results = await b.fetch(0, [(o0, 1, ACK, 0)])
        assert type(results[0]).__name__ == "ReceiptExpiredError"
        _, results = await a.fetch(
            0, [(o0, 1, ACK, 0), (o1, 1, ACK, 0), (o2, 1, RELEASE, 0), (o3, 1, REJECT, 0)]
        )
        assert results == [None, None, None, None]
        again, _ = await b.fetch(10)
        assert [(v, c) for _o, c, v in again] == [(b"v2", 2), (b"v8", 1), (b"v9", 1)]
        # the rejected record lands in the dead-letter topic with where it came from
        async with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
            await consumer.assign([TopicPartition("q.dlq", 0)])
            deadline = time.monotonic() + 10
            letters = []
            while not letters:
                assert time.monotonic() < deadline, "no dead letter"
                letters = await consumer.getmany(timeout_ms=200)
        headers = dict(letters[0].headers)
        assert letters[0].value == b"v3"
        assert headers["laminar-dlq-offset"] == str(o3).encode()
        assert headers["laminar-dlq-reason"] == b"rejected"
        connection.close()
    finally:
        await node.stop()
    node = await single.start()  # state comes back from the log
    try:
        connection = await Connection.open(bootstrap)
        c = Member(connection, "q", "c")
        deadline = time.monotonic() + 10
        while True:
            try:
                got_c, _ = await c.fetch(20, lock_ms=60_000)
                break
            except LaminarError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
        # acked v0, v1 and dead-lettered v3 never come back; b's held ones are still locked
        assert [v for _o, _c, v in got_c] == []
        connection.close()
    finally:
        await node.stop()


async def test_a_delayed_record_is_not_delivered_before_its_time(tmp_path: Path) -> None:
    single = SingleNode(tmp_path)
    bootstrap = single.bootstrap
    node = await single.start()
    try:
        await create_topic(bootstrap, TOPIC, 1)
        due = int(time.time() * 1000) + 1500
        async with Producer(bootstrap) as producer:
            await producer.send_and_wait(
                TOPIC, b"later", partition=0, headers=[(DELIVER_AT_HEADER, str(due).encode())]
            )
            await producer.send_and_wait(TOPIC, b"now", partition=0)
        connection = await Connection.open(bootstrap)
        member = Member(connection, "d", "m")
        got, _ = await member.fetch(10)
        assert [v for _o, _c, v in got] == [b"now"]
        got, _ = await member.fetch(10, wait_ms=5000)
        assert [v for _o, _c, v in got] == [b"later"]
        assert time.time() * 1000 >= due
        connection.close()
    finally:
        await node.stop()


async def _node_with_records(tmp_path: Path, count: int) -> tuple[Node, str]:
    single = SingleNode(tmp_path)
    bootstrap = single.bootstrap
    node = await single.start()
    await create_topic(bootstrap, TOPIC, 1)
    async with Producer(bootstrap) as producer:
        for i in range(count):
            await producer.send_and_wait(TOPIC, f"v{i}".encode(), partition=0)
    return node, bootstrap


async def test_a_long_poll_on_an_idle_queue_writes_nothing(tmp_path: Path) -> None:
    """The queue's own control batches are offsets to skip; skipping them must not be what
    makes the next control batch (a waiting member once kept an idle partition writing one
    per millisecond)."""
    node, bootstrap = await _node_with_records(tmp_path, 3)
    try:
        connection = await Connection.open(bootstrap)
        member = Member(connection, "idle", "m")
        got, _ = await member.fetch(10)
        await member.fetch(0, [(o, c, ACK, 0) for o, c, _v in got])
        tp = TopicPartition(TOPIC, 0)
        async with Admin(bootstrap) as admin:
            ends = []
            for _ in range(3):  # the first poll may still see a checkpoint written
                got, _ = await member.fetch(10, wait_ms=700)
                assert got == []
                ends.append((await admin.list_offsets([tp], -1))[tp])
        assert ends[2] == ends[1], f"an idle long poll wrote at {ends}"
        connection.close()
    finally:
        await node.stop()


async def test_settlements_and_acquisitions_travel_as_runs(tmp_path: Path) -> None:
    """ackRuns settle in order with one result per offset (a run may partly fail), and
    acquiredRuns name the same deliveries as the per-offset list."""
    node, bootstrap = await _node_with_records(tmp_path, 6)
    try:
        connection = await Connection.open(bootstrap)
        tp = TopicPartition(TOPIC, 0)

        async def fetch(max_records: int, acks: list[AckRun]) -> tuple[Any, Any]:
            reply, _payload = await share_fetch(
                connection, "runs", "m", [tp], max_records=max_records, lock_ms=0,
                max_wait_ms=0, acks=acks, from_earliest=True, timeout=30,
            )  # fmt: skip
            return reply.body.shareFetch, acks

        body, _ = await fetch(6, [])
        (result,) = body.results
        runs = [(r.offset, r.count, r.deliveryCount) for r in result.acquiredRuns]
        assert len(result.acquired) == 0 and sum(n for _o, n, _c in runs) == 6
        first = runs[0][0]
        offsets = [o + i for o, n, _c in runs for i in range(n)]
        assert offsets == list(range(first, first + 6)) and all(c == 1 for *_x, c in runs)

        def acks(lo: int, hi: int, action: int = ACK) -> list[AckRun]:
            return [AckRun(TOPIC, 0, lo, hi - lo, 1, action, 0)]

        body, sent = await fetch(0, acks(first + 1, first + 2))
        assert ack_errors(body, sent) == [None]  # the whole run settled
        # one run over six offsets, the second of them already acked: only it fails
        body, sent = await fetch(0, acks(first, first + 6))
        (errors,) = ack_errors(body, sent)
        assert [type(e).__name__ if e else None for e in errors] == [
            None, "ReceiptExpiredError", None, None, None, None,
        ]  # fmt: skip
        # two runs with stale receipts: one result each, every offset refused
        body, sent = await fetch(0, acks(first, first + 3) + acks(first + 4, first + 5))
        outcomes = ack_errors(body, sent)
        assert [len(o or []) for o in outcomes] == [3, 1]
        assert all(isinstance(e, ReceiptExpiredError) for o in outcomes for e in o or [None])
        connection.close()
    finally:
        await node.stop()
