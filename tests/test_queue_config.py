"""A share group's own settings (lock, max deliveries, dead-letter topic): validated, stored in
the metadata, applied by the partition's leader, kept across a restart, and reset."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from laminar.client import Admin, Consumer, ConsumerRecord, Producer, ShareConsumer, TopicPartition
from laminar.client.share_wire import alter_queue_config
from laminar.errors import InvalidConfigError
from laminar.node.metadata import MetadataState
from laminar.queues import config
from laminar.queues.partition import Receipt, ShareConfig, SharePartition
from tests.single_node import TOPIC, SingleNode, bootstrap, create_topic

__all__ = ["bootstrap"]  # the fixture

pytestmark = pytest.mark.timeout(60)


async def produce(address: str, values: list[bytes]) -> None:
    async with Producer(address, linger_ms=1) as producer:
        futures = [await producer.send(TOPIC, v, partition=0) for v in values]
        await producer.flush()
        await asyncio.gather(*futures)


async def read_topic(address: str, topic: str, count: int) -> list[ConsumerRecord]:
    async with Consumer(address, auto_offset_reset="earliest") as reader:
        await reader.assign([TopicPartition(topic, 0)])
        got: list[ConsumerRecord] = []
        deadline = time.monotonic() + 10
        while len(got) < count:
            assert time.monotonic() < deadline, f"{topic}: {len(got)} of {count} records"
            got += await reader.getmany(timeout_ms=200)
        return got


# ---------------------------------------------------------------------------- pure parts


def test_settings_are_checked_before_anything_changes() -> None:
    stored = config.altered({}, {"lock_ms": "500", "max_deliveries": 2}, [])
    assert stored == {"lock_ms": 500, "max_deliveries": 2}
    bad: list[tuple[dict[str, Any], list[str]]] = [
        ({"lock_ms": 0}, []),
        ({"lock_ms": -1}, []),
        ({"lock_ms": "1.5"}, []),
        ({"lock_ms": True}, []),
        ({"lock_ms": config.MAX_LOCK_MS + 1}, []),
        ({"max_deliveries": 0}, []),
        ({"max_deliveries": config.MAX_DELIVERIES_LIMIT + 1}, []),
        ({"dead_letter_topic": ""}, []),
        ({"dead_letter_topic": "no spaces"}, []),
        ({"dead_letter_topic": "__consumer_offsets"}, []),
        ({"dead_letter_topic": 7}, []),
        ({"colour": "blue"}, []),
        ({}, ["colour"]),
        ({"lock_ms": 100, "max_deliveries": 0}, []),  # one bad entry spoils the change
        ({"lock_ms": 100}, ["lock_ms"]),  # set and reset at once
    ]
    for changes, reset in bad:
        with pytest.raises(InvalidConfigError):
            config.altered(stored, changes, reset)
    assert config.altered(stored, {}, ["lock_ms"]) == {"max_deliveries": 2}
    settings = config.resolve("g", {"max_deliveries": 2}, ShareConfig())
    assert (settings.lock_ms, settings.max_deliveries, settings.dead_letter_topic) == (
        30_000,
        2,
        "g.dlq",
    )
    assert settings.overridden == {"max_deliveries"}


def test_the_metadata_state_machine_stores_nothing_from_a_bad_command() -> None:
    state = MetadataState()
    state.apply({"op": "alter_queue_config", "group": "g", "set": {"lock_ms": 500}})
    stored = state.queue_configs["g"]
    for command in (
        {"set": {"lock_ms": 0}},
        {"set": {"lock_ms": 100, "dead_letter_topic": "__x"}},
        {"reset": ["nope"]},
        {"set": ["lock_ms"]},
    ):
        with pytest.raises(InvalidConfigError):
            state.apply({"op": "alter_queue_config", "group": "g", **command})
        assert state.queue_configs["g"] is stored
    state.apply({"op": "alter_queue_config", "group": "g", "reset": ["lock_ms"]})
    assert "g" not in state.queue_configs  # nothing left set: no entry at all


def test_a_new_lock_applies_to_new_acquisitions_and_a_lower_limit_archives_at_once() -> None:
    base = ShareConfig()
    partition = SharePartition(base, 0, start=0)
    partition.end_offset(3)
    (held,) = partition.acquire("a", 1, 0).value
    assert held.lock_until_ms == 30_000
    partition.configure(ShareConfig(lock_ms=1000))
    (second,) = partition.acquire("b", 1, 0).value
    assert second.lock_until_ms == 1000
    partition.tick(1000)  # the second comes back, the first keeps its 30 s
    assert [d.receipt for d in partition.acquire("b", 5, 1000).value] == [
        Receipt("b", 1, 2),
        Receipt("b", 2, 1),
    ]
    partition.release(Receipt("b", 1, 2), 1000)  # available again after two deliveries
    partition.configure(ShareConfig(lock_ms=1000, max_deliveries=2))
    letters = partition.take_dead_letters()
    assert [(d.offset, d.delivery_count, d.reason) for d in letters] == [(1, 2, "max deliveries")]
    assert partition.acquire("c", 5, 1000).value == []  # offset 1 is not delivered a third time
    partition.tick(30_000)  # offset 0's 30 s lock and offset 2's 1 s one ran out
    assert [d.receipt for d in partition.acquire("c", 5, 30_000).value] == [
        Receipt("c", 0, 2),
        Receipt("c", 2, 2),
    ]


# ---------------------------------------------------------------------------- on a node


async def test_a_group_lock_makes_a_held_message_come_back_after_it(bootstrap: str) -> None:
    async with Admin(bootstrap) as admin:
        settings = await admin.alter_queue_config("short", lock_ms=700)
    assert (settings.lock_ms, settings.overridden) == (700, ("lock_ms",))
    holder = ShareConsumer(bootstrap, "short", TOPIC, from_earliest=True, prefetch=False)
    other = ShareConsumer(bootstrap, "short", TOPIC, from_earliest=True, prefetch=False)
    async with holder, other:
        await produce(bootstrap, [b"job"])
        (message,) = await holder.fetch(timeout_ms=5000)
        taken = time.monotonic()
        assert message.lock_remaining_ms <= 700
        assert await other.fetch(timeout_ms=400) == []  # still locked
        (again,) = await other.fetch(timeout_ms=5000)
        waited = time.monotonic() - taken
        assert 0.6 <= waited < 5, f"came back after {waited:.2f} s"
        assert (again.value, again.delivery_count) == (b"job", 2)
        await again.ack()
        # a lock asked for by the member itself still wins over the group's
    async with ShareConsumer(bootstrap, "short", TOPIC, lock_ms=60_000) as own:
        await produce(bootstrap, [b"own"])
        (message,) = await own.fetch(timeout_ms=5000)
        assert message.lock_remaining_ms > 50_000
        await message.ack()


async def test_max_deliveries_and_the_dead_letter_topic_follow_the_group(bootstrap: str) -> None:
    admin = Admin(bootstrap)  # kept from before the dead-letter topic exists
    await admin.start()
    await admin.alter_queue_config("strict", max_deliveries=2, dead_letter_topic="poison")
    async with ShareConsumer(bootstrap, "strict", TOPIC, from_earliest=True) as consumer:
        await produce(bootstrap, [b"bad", b"good"])
        counts = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            messages = await consumer.fetch(timeout_ms=500)
            if not messages and counts:
                break
            for message in messages:
                if message.value == b"good":
                    await message.ack()
                else:
                    counts.append(message.delivery_count)
                    await message.release()
    assert counts == [1, 2]  # the second release dead-letters it
    (letter,) = await read_topic(bootstrap, "poison", 1)
    headers = dict(letter.headers)
    assert letter.value == b"bad"
    assert headers["laminar-dlq-reason"] == b"max deliveries"
    assert headers["laminar-dlq-delivery-count"] == b"2"
    try:
        description = await admin.describe_queue("strict", TOPIC)
        assert "strict.dlq" not in await admin.list_topics()
    finally:
        await admin.close()
    assert (description.dead_letter_topic, description.dead_lettered) == ("poison", 1)
    assert description.config.max_deliveries == 2
    assert set(description.config.overridden) == {"max_deliveries", "dead_letter_topic"}


async def test_bad_settings_are_typed_errors_and_store_nothing(bootstrap: str) -> None:
    async with Admin(bootstrap) as admin:
        before = await admin.alter_queue_config("g", lock_ms=5000, max_deliveries=3)
        bad: list[dict[str, Any]] = [
            {"lock_ms": 0},
            {"lock_ms": 13 * 3600 * 1000},
            {"max_deliveries": 0},
            {"lock_ms": 1000, "max_deliveries": 100_000},  # nothing of it is applied
            {"dead_letter_topic": "has space"},
            {"dead_letter_topic": "__consumer_offsets"},
        ]
        for changes in bad:
            with pytest.raises(InvalidConfigError):
                await admin.alter_queue_config("g", **changes)
        for changes, reset in (({"colour": "blue"}, []), ({"lock_ms": "1"}, ["lock_ms"])):
            reply = admin._call(
                lambda body, c=changes, r=reset: alter_queue_config(body, "g", c, r)
            )
            with pytest.raises(InvalidConfigError):
                await reply
        with pytest.raises(InvalidConfigError):
            await admin.describe_queue_config("")
        assert await admin.describe_queue_config("g") == before


async def test_settings_survive_a_restart_and_can_be_reset(tmp_path: Path) -> None:
    single = SingleNode(tmp_path)
    node = await single.start()
    try:
        await create_topic(single.bootstrap, TOPIC, 1)
        async with Admin(single.bootstrap) as admin:
            await admin.alter_queue_config("kept", lock_ms=600, dead_letter_topic="kept-dead")
    finally:
        await node.stop()
    node = await single.start()
    try:
        async with Admin(single.bootstrap) as admin:
            kept = await admin.describe_queue_config("kept")
            assert (kept.lock_ms, kept.max_deliveries, kept.dead_letter_topic) == (
                600,
                5,
                "kept-dead",
            )
            # and the restarted leader applies it
            async with ShareConsumer(single.bootstrap, "kept", TOPIC, from_earliest=True) as a:
                await produce(single.bootstrap, [b"x"])
                (message,) = await a.fetch(timeout_ms=5000)
                assert message.lock_remaining_ms <= 600
                (again,) = await a.fetch(timeout_ms=5000)  # its lock ran out: delivered again
                assert again.delivery_count >= 2
                await again.ack()
            await admin.alter_queue_config("kept", lock_ms=None)
            partly = await admin.describe_queue_config("kept")
            assert (partly.lock_ms, partly.dead_letter_topic) == (30_000, "kept-dead")
            reset = await admin.reset_queue_config("kept")
            assert (reset.lock_ms, reset.max_deliveries, reset.dead_letter_topic) == (
                30_000,
                5,
                "kept.dlq",
            )
            assert reset.overridden == ()
    finally:
        await node.stop()
