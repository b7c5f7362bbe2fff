"""Real Kafka clients (confluent-kafka/librdkafka, kafka-python, aiokafka, kcat) against a
real 3-node laminar cluster's Kafka listeners: produce and consume back byte for byte, offsets
by timestamp, admin, and records crossing between the Kafka and the native protocol."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import random
import shutil
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from laminar.client import Consumer, Producer
from laminar.client.admin import Admin
from laminar.kafka import codec, errors
from laminar.kafka.apis import SERVED
from tests.cluster_fixture import ClusterHandle, run_sync, start_cluster

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")
ck_admin = pytest.importorskip("confluent_kafka.admin")
kafka_admin = pytest.importorskip("kafka.admin")

pytestmark = pytest.mark.timeout(300)

PARTITIONS = 3
COUNT = 600


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    handle = start_cluster(tmp_path_factory.mktemp("kafka"), 3, kafka=True, metrics=True)
    try:
        yield handle
    finally:
        handle.stop()


def new_topic(cluster: ClusterHandle, partitions: int = PARTITIONS) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"

    async def create() -> None:
        async with Admin(cluster.bootstrap) as admin:
            await admin.create_topic(name, partitions=partitions, replication_factor=3)

    run_sync(create())
    wait_leaders(cluster, name, partitions)
    return name


def wait_leaders(cluster: ClusterHandle, topic: str, partitions: int) -> None:
    """Until Kafka Metadata names a leader for every partition (clients would retry too, but
    a test's timeouts are tighter)."""
    admin = ck_admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(topic, timeout=5).topics.get(topic)
        if (
            md is not None
            and md.error is None
            and len(md.partitions) == partitions
            and all(p.leader > 0 and p.error is None for p in md.partitions.values())
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"no leaders for {topic}")


def expected_records(count: int = COUNT) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    return [
        (
            f"key-{i}".encode(),
            bytes([i % 256]) * (i % 50) + f"value-{i}".encode(),
            [("n", str(i).encode()), ("bin", bytes(range(i % 7)))],
        )
        for i in range(count)
    ]


def by_partition(
    got: list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes]]]],
) -> dict[int, list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]]]]]:
    out: dict[int, list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]]]]] = {}
    for partition, offset, key, value, headers in got:
        out.setdefault(partition, []).append((offset, key, value, list(headers)))
    return out


def check_consumed(
    sent: dict[int, list[tuple[bytes, bytes, list[tuple[str, bytes]]]]],
    got: list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes]]]],
) -> None:
    """Every partition holds exactly what was sent to it, in order, nothing twice."""
    parts = by_partition(got)
    assert sorted(parts) == sorted(p for p in sent if sent[p])
    for partition, records in parts.items():
        offsets = [r[0] for r in records]
        assert offsets == sorted(set(offsets)), "offsets repeat or go back"
        assert [(k, v, h) for _, k, v, h in records] == sent[partition]


# confluent-kafka (librdkafka) ----------------------------------------------------------------


def confluent_produce(
    bootstrap: str, topic: str, records: list[tuple[bytes, bytes, list[tuple[str, bytes]]]]
) -> dict[int, list[tuple[bytes, bytes, list[tuple[str, bytes]]]]]:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    sent: dict[int, list[tuple[bytes, bytes, list[tuple[str, bytes]]]]] = {}
    errors: list[object] = []
    acked: list[tuple[int, int, int]] = []

    def delivered(err: object, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked.append((msg.partition(), msg.offset(), int(msg.key()[4:])))

    for key, value, headers in records:
        producer.produce(topic, key=key, value=value, headers=headers, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors
    acked.sort()
    for partition, _offset, index in acked:
        sent.setdefault(partition, []).append(records[index])
    return sent


def confluent_consume(
    bootstrap: str, topic: str, count: int, partitions: int = PARTITIONS
) -> list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes]]]]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.partition(), msg.offset(), msg.key(), msg.value(), msg.headers() or []))
    finally:
        consumer.close()
    return got


def test_confluent_idempotent_produce_and_consume(cluster: ClusterHandle) -> None:
    topic = new_topic(cluster)
    sent = confluent_produce(cluster.kafka_bootstrap, topic, expected_records())
    got = confluent_consume(cluster.kafka_bootstrap, topic, COUNT)
    check_consumed(sent, got)


# kafka-python --------------------------------------------------------------------------------


def test_kafka_python_produce_and_consume(cluster: ClusterHandle) -> None:
    topic = new_topic(cluster)
    producer = kafka.KafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap, enable_idempotence=True, acks="all"
    )
    sent: dict[int, list[tuple[bytes, bytes, list[tuple[str, bytes]]]]] = {}
    records = expected_records()
    futures = [
        producer.send(topic, key=k, value=v, headers=h, partition=i % PARTITIONS)
        for i, (k, v, h) in enumerate(records)
    ]
    producer.flush(60)
    metas = [f.get(timeout=30) for f in futures]
    for meta, record in sorted(zip(metas, records, strict=True), key=lambda x: x[0][:3]):
        sent.setdefault(meta.partition, []).append(record)
    producer.close()
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap, enable_auto_commit=False
    )
    tps = [kafka.TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    consumer.seek_to_beginning()
    got = []
    deadline = time.monotonic() + 60
    while len(got) < COUNT and time.monotonic() < deadline:
        for tp, messages in consumer.poll(timeout_ms=500).items():
            for m in messages:
                got.append((tp.partition, m.offset, m.key, m.value, list(m.headers)))
    consumer.close()
    check_consumed(sent, got)


# aiokafka ------------------------------------------------------------------------------------


def test_aiokafka_produce_and_consume(cluster: ClusterHandle) -> None:
    topic = new_topic(cluster)
    records = expected_records()

    async def go() -> None:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap, enable_idempotence=True
        )
        await producer.start()
        sent: dict[int, list[tuple[bytes, bytes, list[tuple[str, bytes]]]]] = {}
        try:
            futures = [
                await producer.send(topic, key=k, value=v, headers=h, partition=i % PARTITIONS)
                for i, (k, v, h) in enumerate(records)
            ]
            metas = await asyncio.gather(*futures)
        finally:
            await producer.stop()
        for meta, record in sorted(
            zip(metas, records, strict=True), key=lambda x: (x[0].partition, x[0].offset)
        ):
            sent.setdefault(meta.partition, []).append(record)
        consumer = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=cluster.kafka_bootstrap, enable_auto_commit=False
        )
        await consumer.start()
        got = []
        try:
            tps = [aiokafka.TopicPartition(topic, p) for p in range(PARTITIONS)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            deadline = time.monotonic() + 60
            while len(got) < COUNT and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                for tp, messages in batches.items():
                    for m in messages:
                        got.append((tp.partition, m.offset, m.key, m.value, list(m.headers)))
        finally:
            await consumer.stop()
        check_consumed(sent, got)

    asyncio.run(go())


# kcat ----------------------------------------------------------------------------------------


def test_kcat_produce_and_consume(cluster: ClusterHandle, tmp_path: Path) -> None:
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed (Debian package kcat)")
    topic = new_topic(cluster)
    lines = [f"k{i}:line {i}" for i in range(300)]
    idempotent = ["-X", "enable.idempotence=true"]
    subprocess.run(
        [kcat, "-b", cluster.kafka_bootstrap, "-t", topic, "-P", "-K:", *idempotent],
        input="\n".join(lines) + "\n",
        text=True,
        check=True,
        timeout=60,
    )
    out = subprocess.run(
        [kcat, "-b", cluster.kafka_bootstrap, "-t", topic, "-C", "-e", "-f", "%p %k:%s\\n"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    by_partition: dict[str, list[str]] = {}
    for line in out.stdout.splitlines():
        partition, record = line.split(" ", 1)
        by_partition.setdefault(partition, []).append(record)
    assert sorted(r for rs in by_partition.values() for r in rs) == sorted(lines)
    assert len(by_partition) > 1  # keys spread over the partitions
    for records in by_partition.values():
        assert records == [line for line in lines if line in set(records)]  # order kept


# offsets by timestamp ------------------------------------------------------------------------


def test_offsets_for_times(cluster: ClusterHandle) -> None:
    topic = new_topic(cluster, partitions=1)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap})
    base = 1_700_000_000_000
    for i in range(50):
        producer.produce(topic, value=b"x%d" % i, partition=0, timestamp=base + 1000 * i)
        if i % 10 == 9:
            producer.flush(30)  # several batches
    assert producer.flush(30) == 0
    # Offsets: where record i landed (laminar's Raft no-ops take offsets too).
    offsets = [m[1] for m in confluent_consume(cluster.kafka_bootstrap, topic, 50, partitions=1)]
    assert len(offsets) == 50
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "unused"}
    )
    try:
        for ts, want in [
            (base - 5, offsets[0]),
            (base, offsets[0]),
            (base + 12_500, offsets[13]),
            (base + 49_000, offsets[49]),
            (base + 99_000, -1),
        ]:
            (found,) = consumer.offsets_for_times(
                [confluent_kafka.TopicPartition(topic, 0, ts)], timeout=10
            )
            assert found.error is None
            assert found.offset == want, (ts, found)
        low, high = consumer.get_watermark_offsets(
            confluent_kafka.TopicPartition(topic, 0), timeout=10
        )
        assert (low, high) == (0, offsets[-1] + 1)
    finally:
        consumer.close()
    kp = kafka.KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        tp = kafka.TopicPartition(topic, 0)
        found = kp.offsets_for_times({tp: base + 20_000})[tp]
        assert (found.offset, found.timestamp) == (offsets[20], base + 20_000)
        assert kp.beginning_offsets([tp])[tp] == 0
        assert kp.end_offsets([tp])[tp] == offsets[-1] + 1
    finally:
        kp.close()


# admin ---------------------------------------------------------------------------------------


def test_confluent_admin_create_describe_delete(cluster: ClusterHandle) -> None:
    admin = ck_admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    name = f"adm-{uuid.uuid4().hex[:8]}"
    new = ck_admin.NewTopic(
        name, num_partitions=4, replication_factor=3, config={"retention.ms": "3600000"}
    )
    admin.create_topics([new], operation_timeout=30)[name].result(30)
    again = admin.create_topics([new])[name]
    with pytest.raises(confluent_kafka.KafkaException) as info:
        again.result(30)
    assert info.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS
    resource = ck_admin.ConfigResource("topic", name)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["retention.ms"].value == "3600000"
    assert "segment.bytes" in configs
    wait_leaders(cluster, name, 4)
    ops = [
        ck_admin.ConfigEntry(
            "retention.ms", "7200000", incremental_operation=ck_admin.AlterConfigOpType.SET
        ),
        ck_admin.ConfigEntry(
            "segment.bytes", None, incremental_operation=ck_admin.AlterConfigOpType.DELETE
        ),
    ]
    altered = ck_admin.ConfigResource("topic", name, incremental_configs=ops)
    admin.incremental_alter_configs([altered])[altered].result(30)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["retention.ms"].value == "7200000"
    bad = ck_admin.ConfigResource(
        "topic",
        name,
        incremental_configs=[
            ck_admin.ConfigEntry(
                "cleanup.policy", "compact", incremental_operation=ck_admin.AlterConfigOpType.SET
            )
        ],
    )
    with pytest.raises(confluent_kafka.KafkaException) as info:
        admin.incremental_alter_configs([bad])[bad].result(30)
    assert info.value.args[0].code() == confluent_kafka.KafkaError.INVALID_CONFIG
    grow = admin.create_partitions([ck_admin.NewPartitions(name, 6)], operation_timeout=30)
    grow[name].result(30)
    wait_leaders(cluster, name, 6)
    shrink = admin.create_partitions([ck_admin.NewPartitions(name, 2)])[name]
    with pytest.raises(confluent_kafka.KafkaException) as info:
        shrink.result(30)
    assert info.value.args[0].code() == confluent_kafka.KafkaError.INVALID_PARTITIONS
    admin.delete_topics([name], operation_timeout=30)[name].result(30)
    assert name not in admin.list_topics(timeout=10).topics
    internal = admin.create_topics([ck_admin.NewTopic("__mine", 1, 1)])["__mine"]
    with pytest.raises(confluent_kafka.KafkaException) as info:
        internal.result(30)
    assert info.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_EXCEPTION


def listed_soon(list_topics: Callable[[], list[str]], name: str, listed: bool) -> bool:
    """Whether ``name`` is (or is not) listed within a few seconds. A topic change is answered
    once the node that served it applied it; a client then asks any node, which may apply it a
    moment later (Kafka documents the same: brokers learn of it asynchronously)."""
    deadline = time.monotonic() + 10
    while (name in list_topics()) != listed:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_kafka_python_admin(cluster: ClusterHandle) -> None:
    admin = kafka_admin.KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    name = f"adm-{uuid.uuid4().hex[:8]}"
    try:
        admin.create_topics([kafka_admin.NewTopic(name, 2, 3)])
        assert listed_soon(admin.list_topics, name, True)
        admin.create_partitions({name: kafka_admin.NewPartitions(3)})
        wait_leaders(cluster, name, 3)
        admin.delete_topics([name])
        assert listed_soon(admin.list_topics, name, False)
    finally:
        admin.close()


async def listed_soon_async(
    list_topics: Callable[[], Awaitable[list[str]]], name: str, listed: bool
) -> bool:
    """``listed_soon`` for an asyncio client."""
    deadline = time.monotonic() + 10
    while (name in await list_topics()) != listed:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def test_aiokafka_admin(cluster: ClusterHandle) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    name = f"adm-{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, 2, 3)])
            assert await listed_soon_async(admin.list_topics, name, True)
            await admin.delete_topics([name])
            assert await listed_soon_async(admin.list_topics, name, False)
        finally:
            await admin.close()

    asyncio.run(go())


# the two protocols see the same records ------------------------------------------------------


def test_kafka_to_native_and_back(cluster: ClusterHandle) -> None:
    topic = new_topic(cluster, partitions=1)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap})
    ts = 1_700_000_123_456
    for i in range(20):
        producer.produce(
            topic,
            key=None if i == 3 else b"k%d" % i,
            value=None if i == 4 else b"v%d" % i,
            headers=[("h", b"%d" % i), ("empty", b"")],
            partition=0,
            timestamp=ts + i,
        )
    assert producer.flush(30) == 0

    async def native() -> None:
        async with Consumer(cluster.bootstrap) as consumer:
            await consumer.assign([(topic, 0)])
            await consumer.seek_to_beginning()
            got = []
            deadline = time.monotonic() + 30
            while len(got) < 20 and time.monotonic() < deadline:
                got.extend(await consumer.getmany(timeout_ms=500))
        assert len(got) == 20
        for i, r in enumerate(got):
            assert r.key == (None if i == 3 else b"k%d" % i)
            assert r.value == (None if i == 4 else b"v%d" % i)
            assert r.timestamp == ts + i
            assert list(r.headers) == [("h", b"%d" % i), ("empty", b"")]
        async with Producer(cluster.bootstrap) as native_producer:
            for i in range(20, 30):
                await native_producer.send(
                    topic,
                    b"n%d" % i,
                    key=b"k%d" % i,
                    headers=[("h", b"%d" % i)],
                    partition=0,
                    timestamp_ms=ts + i,
                )
            await native_producer.flush()

    run_sync(native())
    got = confluent_consume(cluster.kafka_bootstrap, topic, 30, partitions=1)
    assert len(got) == 30
    assert [m[1] for m in got] == sorted({m[1] for m in got})
    for i, (_p, _o, key, value, headers) in enumerate(got[20:], start=20):
        assert (key, value, headers) == (b"k%d" % i, b"n%d" % i, [("h", b"%d" % i)])


# the listener itself, over raw sockets ---------------------------------------------------------


def raw_request(key: int, version: int, correlation: int, body: bytes = b"") -> bytes:
    header = struct.pack(">hhih", key, version, correlation, 4) + b"test"
    if (
        SERVED.get(key) is not None
        and SERVED[key].serves(version)
        and SERVED[key].flexible(version)
    ):
        header += b"\x00"
    return struct.pack(">i", len(header) + len(body)) + header + body


def read_response(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", recv_exactly(sock, 4))[0]
    return recv_exactly(sock, size)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def connect(cluster: ClusterHandle) -> socket.socket:
    host, port = cluster.kafka_bootstrap.split(",")[0].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def test_unsupported_versions_and_malformed_requests(cluster: ClusterHandle) -> None:
    with connect(cluster) as sock:
        # ApiVersions at a version too high: its v0 error reply, listing what is served
        sock.sendall(raw_request(18, 99, 1))
        reply = read_response(sock)
        assert struct.unpack_from(">ih", reply) == (1, errors.UNSUPPORTED_VERSION)
        # Metadata at a version not served, and an unknown API: UNSUPPORTED_VERSION, and the
        # connection stays usable
        sock.sendall(raw_request(3, 99, 2) + raw_request(999, 0, 3))
        assert struct.unpack_from(">ih", read_response(sock)) == (2, errors.UNSUPPORTED_VERSION)
        assert struct.unpack_from(">ih", read_response(sock)) == (3, errors.UNSUPPORTED_VERSION)
        sock.sendall(raw_request(18, 0, 4))
        reply = read_response(sock)
        assert struct.unpack_from(">ih", reply) == (4, 0)
    # a body that cannot be decoded closes that connection only
    with connect(cluster) as sock:
        sock.sendall(raw_request(3, 1, 5, b"\x00\x00\x10\x00"))  # 4096 topics, no bytes
        with pytest.raises(ConnectionError):
            read_response(sock)
    with connect(cluster) as sock:
        sock.sendall(struct.pack(">i", -7))  # a negative size
        with pytest.raises(ConnectionError):
            read_response(sock)
    with connect(cluster) as sock:
        sock.sendall(raw_request(18, 0, 6))
        assert struct.unpack_from(">ih", read_response(sock)) == (6, 0)


def test_responses_leave_in_request_order(cluster: ClusterHandle) -> None:
    """A long-poll fetch and a metadata request behind it on one connection: the metadata
    reply is ready first but goes out second."""
    topic = new_topic(cluster, partitions=1)
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "unused"}
    )
    try:
        _low, high = consumer.get_watermark_offsets(
            confluent_kafka.TopicPartition(topic, 0), timeout=10
        )
    finally:
        consumer.close()
    api = SERVED[1]
    fetch = {
        "max_wait_ms": 800,
        "min_bytes": 1,
        "topics": [
            {
                "topic": topic,
                "partitions": [{"partition": 0, "fetch_offset": high, "partition_max_bytes": 1}],
            }
        ],
    }
    body = bytes(codec.encode(api.request, fetch, 4, False))
    with connect(cluster) as sock:
        started = time.monotonic()
        sock.sendall(raw_request(1, 4, 10, body) + raw_request(18, 0, 11))
        first = read_response(sock)
        second = read_response(sock)
        assert struct.unpack_from(">i", first)[0] == 10
        assert struct.unpack_from(">i", second)[0] == 11
        assert 0.7 < time.monotonic() - started < 5  # the fetch did wait


# compressed batches pass through as they are ---------------------------------------------------


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_stored_and_served_as_is(cluster: ClusterHandle, codec: str) -> None:
    if importlib.util.find_spec("laminar.segment.compression") is None:
        pytest.skip("this build's batch format has no compression (the compression branch)")
    topic = new_topic(cluster, partitions=1)
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "compression.type": codec,
            "enable.idempotence": True,
            "linger.ms": 20,
        }
    )
    values = [b"compressible %d " % i * 20 for i in range(300)]
    for i, value in enumerate(values):
        producer.produce(topic, key=b"k%d" % i, value=value, partition=0, headers=[("i", b"1")])
    assert producer.flush(30) == 0
    got = confluent_consume(cluster.kafka_bootstrap, topic, len(values), partitions=1)
    assert [m[3] for m in got] == values
    kp = kafka.KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap, enable_auto_commit=False)
    try:
        tp = kafka.TopicPartition(topic, 0)
        kp.assign([tp])
        kp.seek_to_beginning()
        seen: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(seen) < len(values) and time.monotonic() < deadline:
            for messages in kp.poll(timeout_ms=500).values():
                seen.extend(m.value for m in messages)
        assert seen == values
    finally:
        kp.close()

    async def native() -> list[bytes | None]:
        async with Consumer(cluster.bootstrap) as consumer:
            await consumer.assign([(topic, 0)])
            await consumer.seek_to_beginning()
            out: list[bytes | None] = []
            deadline = time.monotonic() + 30
            while len(out) < len(values) and time.monotonic() < deadline:
                out.extend(r.value for r in await consumer.getmany(timeout_ms=500))
            return out

    assert run_sync(native()) == values


# hostile input -----------------------------------------------------------------------------------

FUZZED_APIS = (0, 1, 2, 3, 18, 22, 32)
"""Not CreateTopics/DeleteTopics: a mutated one could really delete another test's topic."""


def test_mutated_requests_never_take_a_node_down(cluster: ClusterHandle) -> None:
    """Requests built by the codec for every served version, then bit-flipped, truncated or
    extended, over real sockets: each is answered or its connection closed, and every node
    still serves Kafka clients afterwards."""
    from tests.test_kafka_codec import sample

    rng = random.Random(int(os.environ.get("LAMINAR_FUZZ_SEED", "1414")))
    cases = [
        (api, version)
        for key in FUZZED_APIS
        for api in [SERVED[key]]
        for version in range(api.min_version, api.max_version + 1)
    ]
    sent = closed = 0
    deadline = time.monotonic() + 60
    for address in cluster.kafka_bootstrap.split(","):
        host, port = address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=5)
        for n in range(300):
            if time.monotonic() > deadline:
                break
            api, version = rng.choice(cases)
            flexible = api.flexible(version)
            body = bytearray(
                codec.encode(
                    api.request, sample(api.request, version, flexible, n), version, flexible
                )
            )
            frame = bytearray(raw_request(api.key, version, n, bytes(body)))
            for _ in range(rng.randint(1, 4)):
                kind = rng.random()
                if kind < 0.6 and len(frame) > 4:
                    frame[rng.randrange(4, len(frame))] ^= 1 << rng.randrange(8)
                elif kind < 0.8:
                    del frame[rng.randrange(4, len(frame) + 1) :]
                else:
                    frame += rng.randbytes(rng.randint(1, 16))
            struct.pack_into(">i", frame, 0, len(frame) - 4)
            try:
                sock.sendall(frame)
                sent += 1
                if api.key == 0 and n % 2:  # a Produce may have acks=0: no reply to wait for
                    continue
                read_response(sock)
            except (ConnectionError, OSError):
                closed += 1
                sock.close()
                sock = socket.create_connection((host, int(port)), timeout=5)
        sock.close()
    assert sent > 300
    for address in cluster.kafka_bootstrap.split(","):
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(raw_request(18, 0, 1))
            assert struct.unpack_from(">ih", read_response(sock)) == (1, 0)
    assert all(node.running for node in cluster.nodes.values())
    # every mutated request was either malformed (connection closed) or handled: no handler
    # failed on a request the codec accepted
    for node in cluster.nodes.values():
        log = node.log_path.read_text(errors="replace")
        assert "kafka request failed" not in log and "not accepted" not in log, node.log_path


@pytest.mark.parametrize("acks", ["0", "1"])
def test_acks_zero_and_one(cluster: ClusterHandle, acks: str) -> None:
    """acks=0 gets no response at all (a reply would break the client's request order);
    acks=1 is answered once the leader wrote the batch."""
    topic = new_topic(cluster, partitions=1)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "acks": acks, "linger.ms": 1}
    )
    for i in range(200):
        producer.produce(topic, value=b"%d" % i, partition=0)
        if i % 50 == 49:
            producer.flush(10)
    assert producer.flush(30) == 0
    got = confluent_consume(cluster.kafka_bootstrap, topic, 200, partitions=1)
    assert [m[3] for m in got] == [b"%d" % i for i in range(200)]


def test_every_kafka_write_gives_its_admission_back(cluster: ClusterHandle) -> None:
    """Last in this module: after every produce above (acks 0, 1 and all, idempotent,
    compressed, malformed and mutated requests), each node's produce admission is empty
    again. Room a Kafka write kept would make the node refuse all writes once it all leaked."""
    held = cluster.produce_batches_held()
    assert all(value == 0 for value in held.values()), held
