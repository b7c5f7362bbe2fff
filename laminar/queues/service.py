"""Share groups on a node: one ``PartitionQueues`` per partition this node leads and that has
been read as a queue, their timers, and the copies of dead letters.

Queue state lives with the partition (its own Raft log, ``log_codec``), so a share fetch goes to
the partition's leader like a fetch does; nothing here routes or coordinates across nodes. A
partition's queues are loaded on the first share request after its leader took over (a node
leading thousands of partitions never reads queue state it is not asked for).

Each group's settings (lock, ``max_deliveries``, dead-letter topic) are the cluster-wide values
stored in the metadata (``laminar.queues.config``) over the node's defaults; every use of a
group's state applies them first, so a change reaches every partition leader of the group
within a tick (new acquisitions get the new lock, held locks keep theirs).

Dead letters (rejected records, or records whose lock ran out ``max_deliveries`` times) are
copied to the group's dead-letter topic (``<group>.dlq`` unless set; created on first use)
through the node's own client connection, with the original key, value and headers plus
``laminar-dlq-topic``, ``-partition``, ``-offset``, ``-delivery-count`` and ``-reason``; only
once the copy is acknowledged (acks=all) is the record done, so a failover in between copies it
again (at-least-once into the dead-letter topic).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from ssl import SSLContext
from typing import Any

import structlog

from laminar.errors import CorruptBatchError, LaminarError, RequestTimeoutError, TopicExistsError
from laminar.node.replica import Replica
from laminar.node.runtime import MultiRaft
from laminar.queues.config import QueueSettings, Value, resolve
from laminar.queues.driver import PartitionQueues
from laminar.queues.partition import DeadLetter, ShareConfig
from laminar.segment import batch as record_batch

log = structlog.get_logger(__name__)

TICK_SECONDS = 0.05
SETTINGS_WAIT = 5.0
"""How long a partition's queues, loading, wait for this node's copy of the group settings to
catch up (after a restart) before serving with what it has."""
DLQ_HEADER = "laminar-dlq-"
NOTHING_STORED: Mapping[str, Value] = {}


class QueueService:
    def __init__(
        self,
        config: ShareConfig,
        stored: Callable[[], Mapping[str, Mapping[str, Value]]],
        metadata_caught_up: Callable[[float], Awaitable[None]],
        runtime: MultiRaft,
        client_address: Callable[[], str],
        replication: Callable[[], int],
        checkpoint_min_records: int = 10_000,
        client_ssl: SSLContext | None = None,
        login: Callable[[], tuple[str, str] | None] = lambda: None,
    ) -> None:
        self.config = config
        self._stored = stored
        self._metadata_caught_up = metadata_caught_up
        self._settings: dict[str, tuple[Mapping[str, Value], QueueSettings, ShareConfig]] = {}
        self._runtime = runtime
        self._client_address = client_address
        self._client_ssl = client_ssl  # the node's client port may speak TLS
        self._login = login
        """The nodes' internal user once the cluster has users (laminar/auth/state.py)."""
        self._producer_login: tuple[str, str] | None = None
        self._replication = replication
        self.checkpoint_min_records = checkpoint_min_records
        self._drivers: dict[int, PartitionQueues] = {}
        self._any_driver = asyncio.Event()
        """Set once a partition's queues are loaded: without any the tick task waits."""
        self._task: asyncio.Task[None] | None = None
        self._copies: set[asyncio.Task[None]] = set()
        self._producer: Any = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._tick_loop(), name="share-groups")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._copies) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for driver in self._drivers.values():
            driver.end("node stopping")
        if self._producer is not None:
            await self._producer.close()

    def settings(self, group: str) -> QueueSettings:
        """The group's settings: what the metadata stores for it over the node defaults."""
        return self._resolved(group)[1]

    def stored(self, group: str) -> Mapping[str, Value]:
        """What the metadata stores for the group (only the settings set for it)."""
        return self._stored().get(group) or NOTHING_STORED

    def config_for(self, group: str) -> ShareConfig:
        """The group's ``ShareConfig`` (the same object until its settings change)."""
        return self._resolved(group)[2]

    def _resolved(self, group: str) -> tuple[Mapping[str, Value], QueueSettings, ShareConfig]:
        stored = self.stored(group)
        cached = self._settings.get(group)
        if cached is None or cached[0] is not stored:  # a change stores a new dict
            settings = resolve(group, stored, self.config)
            cached = (stored, settings, settings.share_config(self.config))
            self._settings[group] = cached
        return cached

    async def settings_ready(self) -> None:
        """Wait (boundedly) until this node's metadata, which holds the group settings, has
        caught up: a restarted leader must not hand out locks by settings it has not replayed
        yet. Settings are not worth an outage: without a metadata leader it goes on with
        what it has."""
        try:
            await self._metadata_caught_up(SETTINGS_WAIT)
        except RequestTimeoutError:
            log.warning("share group settings may be stale: metadata not caught up")

    def queues(self, replica: Replica) -> PartitionQueues:
        """The share groups of a partition this node leads (loaded on first use)."""
        driver = self._drivers.get(replica.group)
        if driver is None or not driver.current:
            driver = PartitionQueues(
                replica,
                self.config_for,
                self.settings_ready,
                lambda: int(time.time() * 1000),
                self._runtime.wake,
                self._runtime.fail,
                self.checkpoint_min_records,
            )
            self._drivers[replica.group] = driver
            self._any_driver.set()
        return driver

    def leader_changed(self, replica: Replica) -> None:
        driver = self._drivers.get(replica.group)
        if driver is not None and not driver.current:
            driver.end("leadership changed")
            del self._drivers[replica.group]

    async def _tick_loop(self) -> None:
        while True:
            if not self._drivers:  # (a node without share groups: no wake-ups for nothing)
                self._any_driver.clear()
                await self._any_driver.wait()
            await asyncio.sleep(TICK_SECONDS)
            for key, driver in list(self._drivers.items()):
                try:
                    letters = driver.tick()
                except Exception:  # one partition's defect must not stop the others
                    log.exception("share group tick failed", partition=driver.replica.partition)
                    driver.end("tick failed")
                    letters = []
                if driver.ended and self._drivers.get(key) is driver:
                    del self._drivers[key]
                for group, taken in letters:
                    task = asyncio.create_task(self._copy(driver, group, taken))
                    self._copies.add(task)
                    task.add_done_callback(self._copies.discard)

    async def _copy(self, driver: PartitionQueues, group: str, letters: list[DeadLetter]) -> None:
        offsets = [letter.offset for letter in letters]
        try:
            await self._produce_dead_letters(driver, group, letters)
        except (LaminarError, ConnectionError, OSError) as exc:
            log.warning("dead letters not copied yet", group=group, error=str(exc))
            driver.dead_letters_done(group, offsets, copied=False)
            return
        driver.dead_letters_done(group, offsets, copied=True)

    async def _produce_dead_letters(
        self, driver: PartitionQueues, group: str, letters: list[DeadLetter]
    ) -> None:
        from laminar.client import Admin, Producer  # the node is its own client here

        replica = driver.replica
        topic = self.settings(group).dead_letter_topic
        bootstrap = self._client_address()
        login = self._login()
        user, password = login or (None, None)
        if self._producer is not None and login != self._producer_login:
            await self._producer.close()  # made before the cluster had users
            self._producer = None
        if self._producer is None:
            self._producer = Producer(
                bootstrap,
                acks="all",
                linger_ms=1,
                ssl=self._client_ssl,
                username=user,
                password=password,
            )
            self._producer_login = login
            await self._producer.start()
        async with Admin(
            bootstrap, ssl=self._client_ssl, username=user, password=password
        ) as admin:
            if topic not in await admin.list_topics():
                with contextlib.suppress(TopicExistsError):
                    await admin.create_topic(topic, 1, self._replication())
        by_offset = {letter.offset: letter for letter in letters}
        sends = []
        for batch in driver.read((letter.offset, letter.offset + 1) for letter in letters):
            for record in _records_or_placeholders(batch, by_offset):
                letter = by_offset.get(record.offset)
                if letter is None:
                    continue
                headers = [
                    *record.headers,
                    (DLQ_HEADER + "topic", replica.topic.encode()),
                    (DLQ_HEADER + "partition", str(replica.partition).encode()),
                    (DLQ_HEADER + "offset", str(record.offset).encode()),
                    (DLQ_HEADER + "delivery-count", str(letter.delivery_count).encode()),
                    (DLQ_HEADER + "reason", letter.reason.encode()),
                ]
                sends.append(
                    await self._producer.send(
                        topic, record.value, key=record.key, headers=headers, partition=0
                    )
                )
        await asyncio.gather(*sends)


def _records_or_placeholders(
    batch: bytes, by_offset: dict[int, DeadLetter]
) -> list[record_batch.Record]:
    """The batch's records; for a (compressed) batch whose records do not decode, one record
    per dead letter in it with no key, no value and the error as a header, so the letter is
    still set aside (copying it again could only fail again)."""
    try:
        return record_batch.decode_records(batch)
    except CorruptBatchError as exc:
        header = record_batch.read_header(batch)
        log.warning(
            "dead letters' batch does not decode", offset=header.base_offset, error=str(exc)
        )
        return [
            record_batch.Record(
                offset,
                header.first_timestamp,
                None,
                None,
                ((DLQ_HEADER + "error", str(exc).encode()),),
            )
            for offset in sorted(by_offset)
            if header.base_offset <= offset <= header.last_offset
        ]
