"""Session-scoped fixtures for the Spark source tests: one local Spark, one laminar cluster.

Spark start-up costs ~5-15 s and the first use of a Python source a few more, so every Spark
test shares one session (import the fixtures into a test module to use them). Workers run this
interpreter (PYSPARK_PYTHON), so ``spark_source`` is importable on executors.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from laminar.client import Admin, Producer, TopicPartition
from tests.cluster_fixture import ClusterHandle, start_cluster

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def make_spark(workdir: Path) -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from spark_source import register

    log4j = workdir / "log4j2.properties"
    log4j.write_text(LOG4J)
    java_options = f"-Dlog4j2.configurationFile=file:{log4j}"
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("laminar-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.executor.extraJavaOptions", java_options)
        .config("spark.sql.warehouse.dir", str(workdir / "warehouse"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


@pytest.fixture(scope="session", name="spark")
def spark_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    session = make_spark(tmp_path_factory.mktemp("spark"))
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session", name="laminar_cluster")
def laminar_cluster_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    # Retention every 2 s, not every minute: the retention test waits for a pass.
    cluster = start_cluster(
        tmp_path_factory.mktemp("spark-cluster"), extra_args=["--retention-check-interval", "2"]
    )
    try:
        yield cluster
    finally:
        cluster.stop()


async def _create(bootstrap: str, topic: str, partitions: int, **config: int) -> None:
    async with Admin(bootstrap) as admin:
        await admin.create_topic(topic, partitions=partitions, replication_factor=3, **config)
        await admin.cluster.wait_for_topic(topic, 30)


def create_topic(bootstrap: str, topic: str, partitions: int, **config: int) -> None:
    asyncio.run(_create(bootstrap, topic, partitions, **config))


async def _produce(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[int, bytes, bytes | None]],
    compression: str | None = None,
) -> list[tuple[int, int]]:
    async with Producer(bootstrap, linger_ms=2, compression=compression) as producer:
        futures = [
            await producer.send(topic, value, key=key, partition=partition, headers=[("n", value)])
            for partition, value, key in records
        ]
        await producer.flush()
        results = [await future for future in futures]
    return [(r.partition, r.offset) for r in results]


def produce(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[int, bytes, bytes | None]],
    compression: str | None = None,
) -> list[tuple[int, int]]:
    """Send (partition, value, key) records, acks=all; returns (partition, offset) of each."""
    return asyncio.run(_produce(bootstrap, topic, records, compression))


async def _offsets(bootstrap: str, topic: str, partitions: int, which: int) -> dict[int, int]:
    async with Admin(bootstrap) as admin:
        found = await admin.list_offsets(
            [TopicPartition(topic, p) for p in range(partitions)], which
        )
    return {tp.partition: offset for tp, offset in found.items()}


def offsets(bootstrap: str, topic: str, partitions: int, which: int) -> dict[int, int]:
    """Earliest (-2) or latest (-1) offset per partition."""
    return asyncio.run(_offsets(bootstrap, topic, partitions, which))


async def _leader(bootstrap: str, topic: str, partition: int) -> int:
    async with Admin(bootstrap) as admin:
        description = await admin.describe_topic(topic)
    return description.partitions[partition].leader
