"""Share groups on a node: one ``PartitionQueues`` per partition this node leads and that has
been read as a queue, their timers, and the copies of dead letters.

Queue state lives with the partition (its own Raft log, ``log_codec``), so a share fetch goes to
the partition's leader like a fetch does; nothing here routes or coordinates across nodes. A
partition's queues are loaded on the first share request after its leader took over (a node
leading thousands of partitions never reads queue state it is not asked for).

Dead letters (rejected records, or records whose lock ran out ``max_deliveries`` times) are
copied to the group's dead-letter topic ``<group>.dlq`` (created on first use) through the
node's own client connection, with the original key, value and headers plus
``laminar-dlq-topic``, ``-partition``, ``-offset``, ``-delivery-count`` and ``-reason``; only
once the copy is acknowledged (acks=all) is the record done, so a failover in between copies it
again (at-least-once into the dead-letter topic).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from ssl import SSLContext
from typing import Any

import structlog

from laminar.errors import LaminarError, TopicExistsError
from laminar.node.replica import Replica
from laminar.node.runtime import MultiRaft
from laminar.queues.driver import PartitionQueues
from laminar.queues.partition import DeadLetter, ShareConfig
from laminar.segment import batch as record_batch

log = structlog.get_logger(__name__)

TICK_SECONDS = 0.05
DLQ_SUFFIX = ".dlq"
DLQ_HEADER = "laminar-dlq-"


def dead_letter_topic(group: str) -> str:
    return f"{group}{DLQ_SUFFIX}"


class QueueService:
    def __init__(
        self,
        config: ShareConfig,
        runtime: MultiRaft,
        client_address: Callable[[], str],
        replication: Callable[[], int],
        checkpoint_min_records: int = 10_000,
        client_ssl: SSLContext | None = None,
    ) -> None:
        self.config = config
        self._runtime = runtime
        self._client_address = client_address
        self._client_ssl = client_ssl  # the node's client port may speak TLS
        self._replication = replication
        self.checkpoint_min_records = checkpoint_min_records
        self._drivers: dict[int, PartitionQueues] = {}
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

    def queues(self, replica: Replica) -> PartitionQueues:
        """The share groups of a partition this node leads (loaded on first use)."""
        driver = self._drivers.get(replica.group)
        if driver is None or not driver.current:
            driver = PartitionQueues(
                replica,
                self.config,
                lambda: int(time.time() * 1000),
                self._runtime.wake,
                self._runtime.fail,
                self.checkpoint_min_records,
            )
            self._drivers[replica.group] = driver
        return driver

    def leader_changed(self, replica: Replica) -> None:
        driver = self._drivers.get(replica.group)
        if driver is not None and not driver.current:
            driver.end("leadership changed")
            del self._drivers[replica.group]

    async def _tick_loop(self) -> None:
        while True:
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
        topic = dead_letter_topic(group)
        bootstrap = self._client_address()
        if self._producer is None:
            self._producer = Producer(bootstrap, acks="all", linger_ms=1, ssl=self._client_ssl)
            await self._producer.start()
        async with Admin(bootstrap, ssl=self._client_ssl) as admin:
            if topic not in await admin.list_topics():
                with contextlib.suppress(TopicExistsError):
                    await admin.create_topic(topic, 1, self._replication())
        by_offset = {letter.offset: letter for letter in letters}
        sends = []
        for batch in driver.read(letters):
            for record in record_batch.decode_records(batch):
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
