"""ShareConsumer, Producer delays and Admin.describe_queue against a real in-process node."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections import Counter

import pytest

from laminar.client import (
    DELIVER_AT_HEADER,
    Admin,
    Consumer,
    Producer,
    ShareConsumer,
    ShareMessage,
    TopicPartition,
)
from laminar.errors import ReceiptExpiredError
from laminar.queues import driver
from tests.single_node import TOPIC, bootstrap

__all__ = ["bootstrap"]  # the fixture

pytestmark = pytest.mark.timeout(60)


async def produce(bootstrap: str, values: list[bytes], **options: int) -> None:
    async with Producer(bootstrap, linger_ms=1) as producer:
        futures = [await producer.send(TOPIC, v, partition=0, **options) for v in values]
        await producer.flush()
        await asyncio.gather(*futures)


async def next_messages(
    consumer: ShareConsumer, count: int = 1, timeout: float = 5.0
) -> list[ShareMessage]:
    got: list[ShareMessage] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} messages"
        got += await consumer.fetch(timeout_ms=200, max_records=count - len(got))
    return got


def test_the_client_names_the_delivery_header_as_the_node_does() -> None:
    assert DELIVER_AT_HEADER == driver.DELIVER_AT_HEADER


async def test_members_on_one_partition_share_its_messages_and_each_is_acked_once(
    bootstrap: str,
) -> None:
    members = [ShareConsumer(bootstrap, "workers", TOPIC, max_records=5) for _ in range(4)]
    for member in members:
        await member.start()  # the group starts at the end: before anything is produced
    total = 200
    taken: dict[str, list[bytes]] = {m.member_id: [] for m in members}
    acked: Counter[bytes] = Counter()

    async def work(member: ShareConsumer) -> None:
        while sum(acked.values()) < total:
            for message in await member.fetch(timeout_ms=100):
                assert message.delivery_count == 1
                taken[member.member_id].append(message.value or b"")
                await asyncio.sleep(0.001)  # some work, so the others get a turn
                await message.ack()
                acked[message.value or b""] += 1

    try:
        await produce(bootstrap, [f"m{i}".encode() for i in range(total)])
        await asyncio.wait_for(asyncio.gather(*(work(m) for m in members)), 20)
    finally:
        for member in members:
            await member.close()
    assert sorted(acked) == sorted(f"m{i}".encode() for i in range(total))
    assert set(acked.values()) == {1}
    assert all(taken.values()), "every member got some"
    async with Admin(bootstrap) as admin:
        description = await admin.describe_queue("workers", TOPIC)
    (row,) = description.partitions
    assert (row.available, row.acquired, row.delayed, row.dead_lettering) == (0, 0, 0, 0)
    assert row.start == row.end >= total
    assert description.dead_lettered == 0


async def test_release_with_a_delay_is_not_redelivered_before_the_delay(bootstrap: str) -> None:
    async with ShareConsumer(bootstrap, "g", TOPIC, from_earliest=True) as consumer:
        await produce(bootstrap, [b"again"])
        (message,) = await next_messages(consumer)
        released = time.monotonic()
        await message.release(delay_ms=1000)
        (again,) = await next_messages(consumer)
        assert time.monotonic() - released >= 0.99
        assert (again.value, again.offset, again.delivery_count) == (b"again", message.offset, 2)
        await again.ack()


async def test_extend_keeps_a_message_past_its_original_lock(bootstrap: str) -> None:
    holder = ShareConsumer(bootstrap, "g", TOPIC, lock_ms=500, from_earliest=True)
    other = ShareConsumer(bootstrap, "g", TOPIC, lock_ms=500, from_earliest=True)
    async with holder, other:
        await produce(bootstrap, [b"slow"])
        (message,) = await next_messages(holder)
        await message.extend(2000)
        assert message.lock_remaining_ms > 1500
        assert await other.fetch(timeout_ms=1200) == []  # well past the original 500 ms
        # queued together, not awaited: the extend reaches the node before the ack
        extended, acked = message.extend(1000), message.ack()
        await asyncio.gather(extended, acked)
        assert await other.fetch(timeout_ms=1500) == []  # acked: never again


async def test_an_expired_lock_redelivers_and_a_late_ack_is_refused(bootstrap: str) -> None:
    async with ShareConsumer(bootstrap, "g", TOPIC, lock_ms=300, from_earliest=True) as consumer:
        await produce(bootstrap, [b"late"])
        (message,) = await next_messages(consumer)
        await asyncio.sleep(0.6)
        with pytest.raises(ReceiptExpiredError):
            await message.ack()
        (again,) = await next_messages(consumer)
        # >= 2: the prefetch may have taken (and lost) it once more while this slept
        assert again.offset == message.offset and again.delivery_count >= 2
        await again.ack()
        with pytest.raises(ReceiptExpiredError):  # settled once, locally refused after
            await again.ack()


async def test_a_rejected_message_goes_to_the_dead_letter_topic(bootstrap: str) -> None:
    async with ShareConsumer(bootstrap, "g", TOPIC, from_earliest=True) as consumer:
        await produce(bootstrap, [b"poison", b"fine"])
        first, second = await next_messages(consumer, 2)
        await asyncio.gather(first.reject(), second.ack())
    async with Consumer(bootstrap, auto_offset_reset="earliest") as reader:
        await reader.assign([TopicPartition("g.dlq", 0)])
        letters = []
        deadline = time.monotonic() + 10
        while not letters:
            assert time.monotonic() < deadline, "no dead letter"
            letters = await reader.getmany(timeout_ms=200)
    headers = dict(letters[0].headers)
    assert letters[0].value == b"poison"
    assert headers["laminar-dlq-topic"] == TOPIC.encode()
    assert headers["laminar-dlq-offset"] == str(first.offset).encode()
    assert headers["laminar-dlq-reason"] == b"rejected"
    async with Admin(bootstrap) as admin:
        description = await admin.describe_queue("g", TOPIC)
    assert description.dead_letter_topic == "g.dlq"
    assert description.dead_lettered == 1


async def test_a_delayed_record_reaches_streams_at_once_and_the_queue_when_due(
    bootstrap: str,
) -> None:
    async with ShareConsumer(bootstrap, "g", TOPIC) as consumer:
        sent = time.time()
        await produce(bootstrap, [b"later"], delay_ms=1000)
        await produce(bootstrap, [b"now"])
        async with Consumer(bootstrap, auto_offset_reset="earliest") as reader:
            await reader.assign([TopicPartition(TOPIC, 0)])
            seen: list[bytes | None] = []
            while len(seen) < 2:
                seen += [r.value for r in await reader.getmany(timeout_ms=200)]
        assert seen == [b"later", b"now"]
        assert time.time() - sent < 1.0
        (now,) = await next_messages(consumer)
        assert now.value == b"now"
        await now.ack()
        async with Admin(bootstrap) as admin:
            (row,) = (await admin.describe_queue("g", TOPIC)).partitions
            assert row.delayed == 1
        (later,) = await next_messages(consumer)
        assert later.value == b"later"
        assert time.time() >= sent + 1.0
        assert int(dict(later.headers)[DELIVER_AT_HEADER]) >= int(sent * 1000) + 1000
        await later.ack()


async def test_close_releases_what_the_member_holds_to_the_others(bootstrap: str) -> None:
    await produce(bootstrap, [b"x"])  # the group does not exist yet: from_earliest reads this
    first = ShareConsumer(bootstrap, "g", TOPIC, from_earliest=True, max_records=10)
    await first.start()
    await produce(bootstrap, [b"a", b"b", b"c"])
    held = await next_messages(first, 4)
    assert [m.value for m in held] == [b"x", b"a", b"b", b"c"]
    held[0].ack()  # not awaited: still sent, before the others are released
    await first.close()
    async with ShareConsumer(bootstrap, "g", TOPIC, lock_ms=60_000) as second:
        got = await next_messages(second, 3, timeout=2.0)
        assert [(m.value, m.delivery_count) for m in got] == [(b"a", 2), (b"b", 2), (b"c", 2)]
        for message in got:
            message.ack()


async def test_a_batch_of_delayed_records_reaching_past_the_window_is_read(
    bootstrap: str,
) -> None:
    """A group tracks 10,000 offsets past its start; a batch reaching past that window used
    to fail every fetch of the group (InvalidRequestError from the node) instead of being
    read up to the window's end, here a batch of delayed records across offset 10,000."""
    plain, delayed = 9950, 200
    async with Producer(bootstrap, linger_ms=50) as producer:
        for i in range(plain):
            await producer.send(TOPIC, b"%d" % i, partition=0)
        await producer.flush()
        for _i in range(delayed):
            await producer.send(TOPIC, b"later", partition=0, delay_ms=60_000)
        await producer.flush()
    async with ShareConsumer(bootstrap, "g", TOPIC, from_earliest=True) as consumer:
        seen = 0
        while seen < plain:
            for message in await next_messages(consumer, min(500, plain - seen), timeout=10):
                assert message.value != b"later"
                message.ack()
                seen += 1
        async with Admin(bootstrap) as admin:
            (row,) = (await admin.describe_queue("g", TOPIC)).partitions
        assert row.delayed == delayed and row.available == 0


MEMBER_SCRIPT = """
import asyncio, sys
from laminar.client import ShareConsumer

async def main():
    async with ShareConsumer(sys.argv[1], "g", "jobs", lock_ms=2000, from_earliest=True,
                             max_records=3, prefetch=False) as consumer:
        got = []
        while len(got) < 3:
            got += await consumer.fetch(max_records=3 - len(got))
        print(" ".join(m.value.decode() for m in got), flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_a_killed_members_messages_come_back_after_its_lock_not_before(
    bootstrap: str,
) -> None:
    await produce(bootstrap, [b"a", b"b", b"c"])
    member = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        MEMBER_SCRIPT,
        bootstrap,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert member.stdout is not None
        line = await asyncio.wait_for(member.stdout.readline(), 20)
        held_at = time.monotonic()
        assert line.split() == [b"a", b"b", b"c"]
        member.send_signal(signal.SIGKILL)
        await member.wait()
    finally:
        if member.returncode is None:
            member.kill()
            await member.wait()
    async with ShareConsumer(bootstrap, "g", TOPIC, lock_ms=60_000) as other:
        assert await other.fetch(timeout_ms=1000) == []  # locked for 2 s from the fetch
        got = await next_messages(other, 3)
        assert time.monotonic() - held_at >= 1.8  # (the lock started a little before)
        assert [(m.value, m.delivery_count) for m in got] == [(b"a", 2), (b"b", 2), (b"c", 2)]
        for message in got:
            message.ack()


async def test_a_message_released_at_its_fifth_delivery_is_dead_lettered(bootstrap: str) -> None:
    async with ShareConsumer(bootstrap, "g", TOPIC, from_earliest=True) as consumer:
        await produce(bootstrap, [b"poison", b"next"])
        counts = []
        while True:
            messages = await consumer.fetch(timeout_ms=500)
            if not messages:
                break
            for message in messages:
                if message.value == b"next":
                    await message.ack()
                else:
                    counts.append(message.delivery_count)
                    await message.release()
        assert counts == [1, 2, 3, 4, 5]  # the fifth release dead-letters it
    async with Consumer(bootstrap, auto_offset_reset="earliest") as reader:
        await reader.assign([TopicPartition("g.dlq", 0)])
        letters = []
        deadline = time.monotonic() + 10
        while not letters:
            assert time.monotonic() < deadline, "no dead letter"
            letters = await reader.getmany(timeout_ms=200)
    headers = dict(letters[0].headers)
    assert letters[0].value == b"poison"
    assert headers["laminar-dlq-reason"] == b"max deliveries"
    assert headers["laminar-dlq-delivery-count"] == b"5"


def test_deliver_at_and_delay_become_one_header() -> None:
    from laminar.client.producer import _with_deliver_at

    given = [("a", b"1"), (DELIVER_AT_HEADER, b"5")]
    assert _with_deliver_at(given, 1234, None) == (("a", b"1"), (DELIVER_AT_HEADER, b"1234"))
    before = time.time_ns() // 1_000_000
    ((name, value),) = _with_deliver_at((), None, 500)
    assert name == DELIVER_AT_HEADER and before + 500 <= int(value) <= before + 1500
    for deliver_at, delay_ms in ((1, 1), (-1, None), (None, -5)):
        with pytest.raises(ValueError):
            _with_deliver_at((), deliver_at, delay_ms)
