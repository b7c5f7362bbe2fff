"""The laminar Spark source against a real 3-node laminar cluster and a local Spark session.

One Spark session and one cluster serve the whole module (see tests/spark_session.py). Every
test checks records by (partition, offset) against what the producer was acknowledged for:
nothing lost, nothing duplicated, nothing outside the requested range.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.streaming import StreamingQuery

from laminar.client import Admin, Producer
from laminar.errors import CorruptBatchError
from spark_source.cluster_io import read_range, snapshot
from spark_source.options import parse_options
from spark_source.planning import LaminarInputPartition
from spark_source.schema import arrow_schema, spark_schema
from tests.cluster_fixture import ClusterHandle
from tests.spark_session import (  # noqa: F401
    _leader,
    create_topic,
    laminar_cluster_fixture,
    offsets,
    produce,
    spark_fixture,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(240)]

RETAINED = "spark-retained"


def _records(prefix: str, count: int, partitions: int) -> list[tuple[int, bytes, bytes | None]]:
    return [
        (i % partitions, f"{prefix}-{i}".encode(), None if i % 3 else f"k{i}".encode())
        for i in range(count)
    ]


def _acked(
    records: list[tuple[int, bytes, bytes | None]], placed: list[tuple[int, int]]
) -> dict[tuple[int, int], bytes]:
    """(partition, offset) -> value, from the producer's acknowledgements."""
    return {
        (partition, offset): value
        for (_, value, _), (partition, offset) in zip(records, placed, strict=True)
    }


def _produced(
    cluster: ClusterHandle, topic: str, prefix: str, count: int, partitions: int
) -> dict[tuple[int, int], bytes]:
    """Produce ``count`` records over the partitions; (partition, offset) -> value, as acked."""
    records = _records(prefix, count, partitions)
    return _acked(records, produce(cluster.bootstrap, topic, records))


def _reader(session: SparkSession, cluster: ClusterHandle, topic: str, **options: str) -> DataFrame:
    reader = session.read if options.pop("batch", "") else session.readStream
    reader = reader.format("laminar").option("bootstrap", cluster.bootstrap)
    reader = reader.option("subscribe", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def _run_available_now(
    df: DataFrame, checkpoint: Path, *, sink: str, path: Path | None = None
) -> StreamingQuery:
    writer = df.writeStream.trigger(availableNow=True).option("checkpointLocation", str(checkpoint))
    if sink == "memory":
        assert path is None
        writer = writer.format("memory").queryName(checkpoint.name)
    else:
        writer = writer.format("parquet").option("path", str(path))
    query = writer.start()
    assert query.awaitTermination(180), "streaming query did not finish"
    if query.exception() is not None:
        raise AssertionError(f"query failed: {query.exception()}")
    return query


def _pairs(rows: list[Row]) -> list[tuple[int, int]]:
    return [(row["partition"], row["offset"]) for row in rows]


@pytest.fixture(scope="module", autouse=True)
def retained_topic(laminar_cluster: ClusterHandle) -> dict[tuple[int, int], bytes]:
    """Created first: the nodes check retention every 2 s (``laminar_cluster``).

    Small segments and a 1 s retention: every sealed segment expires at the next check.
    """
    create_topic(laminar_cluster.bootstrap, RETAINED, 1, segment_bytes=2048, retention_ms=1000)
    acked: dict[tuple[int, int], bytes] = {}
    for round_ in range(12):
        acked.update(_produced(laminar_cluster, RETAINED, f"r{round_}", 15, 1))
    return acked


def test_batch_read_of_exact_offset_ranges(
    spark: SparkSession, laminar_cluster: ClusterHandle
) -> None:
    topic = "spark-batch"
    create_topic(laminar_cluster.bootstrap, topic, 3)
    acked = _produced(laminar_cluster, topic, "b", 300, 3)
    by_partition = {p: sorted(o for q, o in acked if q == p) for p in range(3)}
    start = {0: by_partition[0][10], 1: -2, 2: by_partition[2][95]}
    end = {0: by_partition[0][20], 1: by_partition[1][5], 2: -1}
    df = _reader(
        spark,
        laminar_cluster,
        topic,
        batch="yes",
        startingOffsets=json.dumps({topic: {"0": start[0], "1": -2, "2": start[2]}}),
        endingOffsets=json.dumps({topic: {"0": end[0], "1": end[1], "2": -1}}),
        includeHeaders="true",
    )
    assert df.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    rows = df.collect()
    expected = (
        {(0, o) for o in by_partition[0][10:20]}
        | {(1, o) for o in by_partition[1][:5]}
        | {(2, o) for o in by_partition[2][95:]}
    )
    assert Counter(_pairs(rows)) == Counter(expected)
    for row in rows:
        value = acked[(row["partition"], row["offset"])]
        assert row["value"] == value
        assert row["topic"] == topic
        assert [(h["key"], h["value"]) for h in row["headers"]] == [("n", value)]
        number = int(value.split(b"-")[1])
        assert row["key"] == (None if number % 3 else f"k{number}".encode())
    # Tiny fetches: many windows per range, follow-up fetches, and fetch-size growth when
    # one batch is larger than the fetch size.
    everything = _reader(spark, laminar_cluster, topic, batch="yes", fetchMaxBytes="1024")
    everything = everything.collect()
    assert Counter(_pairs(everything)) == Counter(list(acked))


def test_batches_compressed_with_every_codec_are_read(
    spark: SparkSession, laminar_cluster: ClusterHandle
) -> None:
    topic = "spark-compressed"
    create_topic(laminar_cluster.bootstrap, topic, 2)
    acked: dict[tuple[int, int], bytes] = {}
    for codec in ("gzip", "snappy", "lz4", "zstd"):
        records = [(p, v * 3, k) for p, v, k in _records(codec, 400, 2)]  # compressible
        acked.update(_acked(records, produce(laminar_cluster.bootstrap, topic, records, codec)))
    rows = _reader(spark, laminar_cluster, topic, batch="yes", includeHeaders="true").collect()
    assert Counter(_pairs(rows)) == Counter(list(acked))
    for row in rows:
        value = acked[(row["partition"], row["offset"])]
        assert row["value"] == value
        assert [(h["key"], h["value"]) for h in row["headers"]] == [("n", value)]


def test_available_now_with_max_offsets_per_trigger_caps_every_batch(
    spark: SparkSession,
    laminar_cluster: ClusterHandle,
    tmp_path: Path,
) -> None:
    topic = "spark-capped"
    create_topic(laminar_cluster.bootstrap, topic, 2)
    acked = _produced(laminar_cluster, topic, "c", 1000, 2)
    df = _reader(
        spark, laminar_cluster, topic, startingOffsets="earliest", maxOffsetsPerTrigger="150"
    )
    query = _run_available_now(df, tmp_path / "capped", sink="memory")
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert len(sizes) >= 7, sizes
    assert max(sizes) <= 150, sizes
    assert sum(sizes) == 1000
    rows = spark.sql("select partition, offset, value from capped").collect()
    assert Counter(_pairs(rows)) == Counter(list(acked))
    assert all(acked[(r["partition"], r["offset"])] == r["value"] for r in rows)


def test_restart_from_checkpoint_reads_every_record_exactly_once(
    spark: SparkSession,
    laminar_cluster: ClusterHandle,
    tmp_path: Path,
) -> None:
    topic = "spark-restart"
    create_topic(laminar_cluster.bootstrap, topic, 3)
    acked = _produced(laminar_cluster, topic, "first", 300, 3)
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "out"
    df = _reader(spark, laminar_cluster, topic, startingOffsets="earliest")
    _run_available_now(df, checkpoint, sink="parquet", path=output)
    assert spark.read.parquet(str(output)).count() == 300
    acked.update(_produced(laminar_cluster, topic, "second", 300, 3))
    # Restarted with the same checkpoint; startingOffsets no longer applies (checkpoint wins).
    again = _reader(spark, laminar_cluster, topic, startingOffsets="earliest")
    _run_available_now(again, checkpoint, sink="parquet", path=output)
    _run_available_now(again, checkpoint, sink="parquet", path=output)  # nothing new: no rows
    rows = spark.read.parquet(str(output)).collect()
    assert Counter(_pairs(rows)) == Counter(list(acked)), "lost or duplicated records"
    assert all(acked[(r["partition"], r["offset"])] == r["value"] for r in rows)


def _wait_for_retention(cluster: ClusterHandle, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        earliest = offsets(cluster.bootstrap, RETAINED, 1, -2)[0]
        if earliest > 0:
            return earliest
        time.sleep(1)
    pytest.fail(f"retention deleted nothing of {RETAINED} within {timeout} s")


def test_retention_of_unread_offsets_fails_or_skips_per_fail_on_data_loss(
    spark: SparkSession,
    laminar_cluster: ClusterHandle,
    retained_topic: dict[tuple[int, int], bytes],
    tmp_path: Path,
) -> None:
    earliest = _wait_for_retention(laminar_cluster, 75)
    latest = offsets(laminar_cluster.bootstrap, RETAINED, 1, -1)[0]
    from_zero = json.dumps({RETAINED: {"0": 0}})
    failing = _reader(spark, laminar_cluster, RETAINED, startingOffsets=from_zero)
    with pytest.raises(Exception) as info:
        _run_available_now(failing, tmp_path / "fails", sink="memory")
    message = str(info.value)
    assert f"data loss in topic '{RETAINED}' partition 0" in message, message
    missing = re.search(r"offsets \[0, (\d+)\) were deleted", message)
    assert missing is not None and int(missing.group(1)) >= earliest, message
    skipping = _reader(
        spark, laminar_cluster, RETAINED, startingOffsets=from_zero, failOnDataLoss="false"
    )
    _run_available_now(skipping, tmp_path / "skips", sink="memory")
    rows = spark.sql("select partition, offset, value from skips").collect()
    now_earliest = offsets(laminar_cluster.bootstrap, RETAINED, 1, -2)[0]
    kept = {k for k in retained_topic if now_earliest <= k[1] < latest}
    got = Counter(_pairs(rows))
    assert max(got.values()) == 1
    assert kept <= set(got) <= set(retained_topic)
    assert min(offset for _, offset in got) >= earliest


def test_query_survives_a_partition_leader_being_killed(
    spark: SparkSession,
    laminar_cluster: ClusterHandle,
    tmp_path: Path,
) -> None:
    topic = "spark-failover"
    create_topic(laminar_cluster.bootstrap, topic, 2)
    acked = _produced(laminar_cluster, topic, "f", 1500, 2)
    df = _reader(
        spark, laminar_cluster, topic, startingOffsets="earliest", maxOffsetsPerTrigger="100"
    )
    query = (
        df.writeStream.trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "failover"))
        .format("memory")
        .queryName("failover")
        .start()
    )
    victim = asyncio.run(_leader(laminar_cluster.bootstrap, topic, 0))
    options = parse_options({"bootstrap": laminar_cluster.bootstrap, "subscribe": topic})
    planned, _ = snapshot(options)  # replicas as planned before the crash: victim first
    assert planned.replicas[(topic, 0)][0].node_id == victim
    try:
        deadline = time.monotonic() + 60
        while len([p for p in query.recentProgress if p["numInputRows"]]) < 2:
            assert query.isActive or query.exception() is None, query.exception()
            assert time.monotonic() < deadline, "query made no progress"
            time.sleep(0.1)
        laminar_cluster.kill(victim)
        assert query.awaitTermination(180), "query did not finish after the leader died"
        assert query.exception() is None, query.exception()
        rows = spark.sql("select partition, offset, value from failover").collect()
        assert Counter(_pairs(rows)) == Counter(list(acked)), "lost or duplicated records"
        assert all(acked[(r["partition"], r["offset"])] == r["value"] for r in rows)
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        assert max(sizes) <= 100 and len(sizes) >= 15
        # A task planned with the dead leader first still reads its range, from a follower.
        tp = (topic, 0)
        stale = LaminarInputPartition(
            0, topic, 0, planned.earliest[tp], planned.latest[tp], planned.replicas[tp]
        )
        schema = arrow_schema(spark_schema(False))
        batches = list(read_range(stale, options, schema))
        got = [(0, o) for b in batches for o in b.column("offset").to_pylist()]
        assert Counter(got) == Counter(k for k in acked if k[0] == 0)
    finally:
        if query.isActive:
            query.stop()
        laminar_cluster.restart(victim)


def _damage(node_dir: Path, topic: str, needle: bytes) -> bool:
    """Flip one byte of a stored record in a replica's segment files (its crc now fails); the
    node serves what it reads, so the damage reaches the reader. False if not stored yet."""
    (directory,) = (node_dir / "partitions").glob(f"{topic}-0.*")
    for path in sorted(directory.rglob("*.log")):
        data = path.read_bytes()
        at = data.find(needle)
        if at >= 0:
            with open(path, "r+b") as file:
                file.seek(at)
                file.write(bytes([data[at] ^ 0xFF]))
            return True
    return False


def test_a_batch_corrupt_on_one_replica_is_read_from_another(
    laminar_cluster: ClusterHandle,
) -> None:
    topic = "spark-corrupt"
    create_topic(laminar_cluster.bootstrap, topic, 1)
    acked = _produced(laminar_cluster, topic, "c", 1500, 1)
    options = parse_options({"bootstrap": laminar_cluster.bootstrap, "subscribe": topic})
    planned, _ = snapshot(options)
    tp = (topic, 0)
    part = LaminarInputPartition(0, topic, 0, 0, planned.latest[tp], planned.replicas[tp])
    schema = arrow_schema(spark_schema(False))
    leader, *followers = [replica.node_id for replica in planned.replicas[tp]]
    assert _damage(laminar_cluster.nodes[leader].data_dir, topic, b"c-1234")

    batches = list(read_range(part, options, schema))

    rows = [
        (offset, value)
        for batch in batches
        for offset, value in zip(
            batch["offset"].to_pylist(), batch["value"].to_pylist(), strict=True
        )
    ]
    assert [offset for offset, _ in rows] == sorted(offset for _, offset in acked)  # each once
    assert {(0, offset): value for offset, value in rows} == acked  # as the followers hold it
    deadline = time.monotonic() + 30  # the third replica may still be catching up
    pending = set(followers)
    while pending:
        pending = {
            n for n in pending if not _damage(laminar_cluster.nodes[n].data_dir, topic, b"c-1234")
        }
        assert time.monotonic() < deadline, f"replicas {pending} never stored the record"
        time.sleep(0.2)
    with pytest.raises(CorruptBatchError, match=r"every replica tried .* sent a corrupt batch"):
        list(read_range(part, options, schema))


def test_group_id_stores_each_micro_batch_end_as_the_groups_committed_offsets(
    spark: SparkSession,
    laminar_cluster: ClusterHandle,
    tmp_path: Path,
) -> None:
    topic, group = "spark-group", "spark-pipeline"
    create_topic(laminar_cluster.bootstrap, topic, 3)
    acked = _produced(laminar_cluster, topic, "g", 90, 3)

    def ends_of(records: dict[tuple[int, int], bytes]) -> dict[int, int]:
        return {p: max(o for q, o in records if q == p) + 1 for p in range(3)}

    async def described() -> dict[int, tuple[int | None, int | None]]:
        async with Admin(laminar_cluster.bootstrap) as admin:
            description = await admin.describe_group(group)
        return {row.partition: (row.committed, row.lag) for row in description.partitions}

    def wait_rows(count: int) -> None:
        deadline = time.monotonic() + 60
        while spark.sql("select count(*) from spark_group").collect()[0][0] < count:
            assert time.monotonic() < deadline, f"the query never read {count} records"
            time.sleep(0.2)

    df = _reader(spark, laminar_cluster, topic, startingOffsets="earliest", groupId=group)
    query = (
        df.writeStream.trigger(processingTime="200 milliseconds")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .format("memory")
        .queryName("spark_group")
        .start()
    )
    try:
        wait_rows(90)
        # Spark hands a micro-batch's end to commit() when it plans the next batch, which
        # needs new data: the group's offsets trail the query by one micro-batch.
        first = ends_of(acked)
        acked.update(_produced(laminar_cluster, topic, "h", 30, 3))
        wait_rows(120)
        deadline = time.monotonic() + 30
        while not all((rows := asyncio.run(described())).get(p, (0,))[0] for p in range(3)):
            assert time.monotonic() < deadline, f"no group offsets stored: {rows}"
            time.sleep(0.5)
    finally:
        query.stop()
    latest = ends_of(acked)
    for p in range(3):
        committed, lag = rows[p]
        assert committed is not None and first[p] <= committed <= latest[p], (p, rows)
        assert lag == latest[p] - committed, (p, rows)


async def _write_across_splits(bootstrap: str, topic: str) -> dict[bytes, list[tuple[int, int]]]:
    """Keyed records written in rounds between a split, a second split and a merge of the
    siblings; per key, (seq, offset) as acknowledged, in order."""
    acked: dict[bytes, list[tuple[int, int]]] = {}
    async with Admin(bootstrap) as admin, Producer(bootstrap, linger_ms=1) as producer:
        await admin.create_topic(topic, 1, 3, partitioning="range")

        async def round_(first: int) -> None:
            handles = []
            for seq in range(first, first + 60):
                key = b"key-%d" % (seq % 10)
                handles.append((key, seq, await producer.send(topic, b"%d" % seq, key=key)))
            for key, seq, handle in handles:
                acked.setdefault(key, []).append((seq, (await handle).offset))

        await round_(0)
        await admin.split_partition(topic, 0)
        await round_(60)
        await admin.split_partition(topic, 1)
        await round_(120)
        await admin.merge_partitions(topic, 3, 4)
        await round_(180)
    return acked


def test_stream_over_splits_keeps_each_keys_order_exactly_once(
    spark: SparkSession,
    laminar_cluster: ClusterHandle,
    tmp_path: Path,
) -> None:
    topic = "spark-splits"
    acked = asyncio.run(_write_across_splits(laminar_cluster.bootstrap, topic))
    seen: list[tuple[int, int, int, bytes, int]] = []

    def collect(batch: DataFrame, batch_id: int) -> None:
        for row in batch.collect():
            seen.append((batch_id, row["partition"], row["offset"], row["key"], int(row["value"])))

    df = _reader(spark, laminar_cluster, topic, startingOffsets="earliest")
    query = (
        df.writeStream.trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .foreachBatch(collect)
        .start()
    )
    assert query.awaitTermination(180), "streaming query did not finish"
    assert query.exception() is None, query.exception()
    values = [v for *_rest, v in seen]
    assert sorted(values) == list(range(240)), "lost or duplicated records"
    for key, written in acked.items():
        in_sink = sorted((b, o, v) for b, _p, o, k, v in seen if k == key)
        assert [v for *_bo, v in in_sink] == [seq for seq, _offset in written], key
    # children were planned in later micro-batches than their parents' last ranges
    last_batch = {p: max(b for b, q, *_ in seen if q == p) for p in {q for _, q, *_ in seen}}
    first_batch = {p: min(b for b, q, *_ in seen if q == p) for p in last_batch}
    for child, parents in ((1, [0]), (2, [0]), (3, [1]), (4, [1]), (5, [3, 4])):
        if child in first_batch:
            assert all(first_batch[child] > last_batch[p] for p in parents if p in last_batch)
