"""Consumer-group members driven by real Kafka clients (kafka-python, aiokafka, confluent-kafka)
for the Kafka listener's group tests.

Each ``Member`` runs one client's consumer on its own thread (aiokafka on its own event loop
there): it polls, notes every record it got as (partition, offset, value), and commits
synchronously after each poll unless told to hold its commits; whatever it got without a
successful commit after it is noted as uncommitted (the only records another member may get
again). ``close()`` leaves the group without committing (auto-commit is off).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CLIENTS = ("kafka-python", "aiokafka", "confluent-kafka", "confluent-kafka/consumer")
"""The last is librdkafka with ``group.protocol=consumer`` (KIP-848, ConsumerGroupHeartbeat);
the others speak the classic protocol (JoinGroup/SyncGroup)."""
SESSION_MS = 6000
HEARTBEAT_MS = 500
Record = tuple[int, int, bytes]


@dataclass
class Member:
    client: str
    bootstrap: str
    topic: str
    group: str
    name: str
    instance_id: str | None = None
    """group.instance.id: a static member."""
    got: list[Record] = field(default_factory=list)
    uncommitted: list[Record] = field(default_factory=list)
    assignment: frozenset[int] = frozenset()
    hold_commits: bool = False
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Member:
        target = self._run_aiokafka if self.client == "aiokafka" else self._run_sync
        self._thread = threading.Thread(target=target, name=self.name, daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"{self.name} did not close within {timeout} s")

    def values(self) -> list[bytes]:
        with self._lock:
            return [v for _p, _o, v in self.got]

    def _note(self, records: list[Record], committed: bool) -> None:
        with self._lock:
            self.got += records
            if not committed:
                self.uncommitted += records

    # ------------------------------------------------------------------ sync clients

    def _run_sync(self) -> None:
        try:
            make, poll, assigned, commit, close = _SYNC[self.client]
            consumer = make(self)
            try:
                while not self._stop.is_set():
                    records = poll(consumer)
                    self.assignment = assigned(consumer)
                    if not records:
                        continue
                    ok = False
                    if not self.hold_commits:
                        try:
                            commit(consumer)
                            ok = True
                        except Exception:  # a rebalance under way: the next owner redoes it
                            ok = False
                    self._note(records, ok)
            finally:
                close(consumer)
        except BaseException as exc:  # the test reads it
            self.error = exc

    # ------------------------------------------------------------------ aiokafka

    def _run_aiokafka(self) -> None:
        try:
            asyncio.run(self._aiokafka())
        except BaseException as exc:
            self.error = exc

    async def _aiokafka(self) -> None:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            client_id=self.name,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
            # aiokafka's offset-reset path retries NOT_LEADER_OR_FOLLOWER without refreshing
            # metadata (its fetch path does), so a leader that moved right after the topic was
            # created (leadership going back to a restarted node) was asked for a minute and
            # more; a short metadata age bounds that.
            metadata_max_age_ms=2000,
            **({"group_instance_id": self.instance_id} if self.instance_id else {}),
        )
        await consumer.start()
        try:
            while not self._stop.is_set():
                batches = await consumer.getmany(timeout_ms=200, max_records=50)
                self.assignment = frozenset(tp.partition for tp in consumer.assignment())
                records = [(r.partition, r.offset, r.value) for rs in batches.values() for r in rs]
                if not records:
                    continue
                ok = False
                if not self.hold_commits:
                    try:
                        await consumer.commit()
                        ok = True
                    except Exception:
                        ok = False
                self._note(records, ok)
        finally:
            await consumer.stop()


# ---------------------------------------------------------------------- kafka-python


def _kp_make(m: Member) -> Any:
    from kafka import KafkaConsumer

    return KafkaConsumer(
        m.topic,
        bootstrap_servers=m.bootstrap,
        group_id=m.group,
        client_id=m.name,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
        max_poll_records=50,
        group_instance_id=m.instance_id,
    )


def _kp_poll(c: Any) -> list[Record]:
    batches = c.poll(timeout_ms=200)
    return [(r.partition, r.offset, r.value) for rs in batches.values() for r in rs]


def _kp_close(c: Any) -> None:
    c.close(autocommit=False)


# ---------------------------------------------------------------------- confluent-kafka


def _ck_make(m: Member) -> Any:
    from confluent_kafka import Consumer

    config = {
        "bootstrap.servers": m.bootstrap,
        "group.id": m.group,
        "client.id": m.name,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "topic.metadata.refresh.interval.ms": 1000,
    }
    if m.instance_id:
        config["group.instance.id"] = m.instance_id
    if m.client.endswith("/consumer"):  # timeouts are the coordinator's (node options)
        config["group.protocol"] = "consumer"
    else:
        config["session.timeout.ms"] = SESSION_MS
        config["heartbeat.interval.ms"] = HEARTBEAT_MS
    c = Consumer(config)
    c.subscribe([m.topic])
    return c


def _ck_poll(c: Any) -> list[Record]:
    out = []
    for msg in c.consume(num_messages=50, timeout=0.2):
        if msg.error() is None:
            out.append((msg.partition(), msg.offset(), msg.value()))
    return out


def _ck_assigned(c: Any) -> frozenset[int]:
    with contextlib.suppress(Exception):
        return frozenset(tp.partition for tp in c.assignment())
    return frozenset()


_CONFLUENT = (
    _ck_make,
    _ck_poll,
    _ck_assigned,
    lambda c: c.commit(asynchronous=False),
    lambda c: c.close(),
)
_SYNC: dict[str, tuple[Callable[..., Any], ...]] = {
    "kafka-python": (
        _kp_make,
        _kp_poll,
        lambda c: frozenset(tp.partition for tp in c.assignment()),
        lambda c: c.commit(),
        _kp_close,
    ),
    "confluent-kafka": _CONFLUENT,
    "confluent-kafka/consumer": _CONFLUENT,
}


def produce(bootstrap: str, topic: str, partitions: int, count: int, tag: str) -> list[bytes]:
    """``count`` records spread over the partitions (kafka-python, acks=all); their values."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=20)
    values = [f"{tag}-{i}".encode() for i in range(count)]
    try:
        futures = [
            producer.send(topic, value=v, partition=i % partitions) for i, v in enumerate(values)
        ]
        for f in futures:
            f.get(timeout=30)
    finally:
        producer.close()
    return values


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def leaders_by_node(bootstrap: str, topic: str) -> dict[str, object]:
    """Each node's Kafka Metadata answer for ``topic``: partition -> leader (for failure
    messages: which node tells clients what)."""
    import socket

    from laminar.kafka import codec
    from laminar.kafka.apis import metadata
    from tests.test_kafka_clients import raw_request, read_response

    out: dict[str, object] = {}
    for address in bootstrap.split(","):
        host, port = address.rsplit(":", 1)
        try:
            body = codec.encode(metadata.REQUEST, {"topics": [{"name": topic}]}, 1, False)
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(raw_request(3, 1, 7, bytes(body)))
                reply = codec.decode(
                    metadata.RESPONSE, memoryview(read_response(sock)), 4, 1, False
                )
            out[address] = {
                p["partition_index"]: p["leader_id"]
                for t in reply["topics"]
                for p in t["partitions"]
            }
        except (OSError, ConnectionError, ValueError) as exc:
            out[address] = repr(exc)
    return out
