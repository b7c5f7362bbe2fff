"""Spark source read throughput against the ceiling of a trivial in-memory Arrow source.

    python bench/spark_bench.py --quick

Starts a local 3-node laminar cluster (temp dir), produces N 100-byte records into a topic,
then times a batch query `spark.read.format("laminar") ... .write.format("noop")` over all of
them, and the same query over a Python data source that yields pre-built Arrow batches of the
same schema, row count, partition count and batch size (what Spark itself can take from a
Python source on this machine). Last line: one JSON object with rows_per_s,
ceiling_rows_per_s and ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition  # noqa: E402
from pyspark.sql.types import StructType  # noqa: E402

from laminar.client import Admin, Producer  # noqa: E402
from laminar.client.localcluster import LocalCluster, free_port_pairs  # noqa: E402
from spark_source.options import DEFAULT_FETCH_BYTES  # noqa: E402
from spark_source.schema import arrow_schema, spark_schema  # noqa: E402

TOPIC = "spark-bench"
VALUE_BYTES = 100


class CeilingSource(DataSource):
    """Yields the same pre-built Arrow batch over and over: no I/O, no decoding."""

    @classmethod
    def name(cls) -> str:
        return "laminar_bench_ceiling"

    def schema(self) -> StructType:
        return spark_schema(False)

    def reader(self, schema: StructType) -> DataSourceReader:
        return CeilingReader(
            int(self.options["rows"]), int(self.options["partitions"]), int(self.options["batch"])
        )


class CeilingReader(DataSourceReader):
    def __init__(self, rows: int, partitions: int, batch: int) -> None:
        self.rows, self.parts, self.batch = rows, partitions, batch

    def partitions(self) -> list[InputPartition]:
        share = self.rows // self.parts
        return [
            InputPartition((i, share + (self.rows % self.parts if i == 0 else 0)))
            for i in range(self.parts)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        index, rows = partition.value
        schema = arrow_schema(spark_schema(False))
        n = min(self.batch, rows)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.nulls(n, pa.binary()),
                pa.array([b"v" * VALUE_BYTES] * n, pa.binary()),
                pa.array([TOPIC] * n, pa.string()),
                pa.array([index] * n, pa.int32()),
                pa.array(range(n), pa.int64()),
                pa.array([1_700_000_000_000_000] * n, pa.int64()).view(pa.timestamp("us", "UTC")),
                pa.array([0] * n, pa.int32()),
            ],
            schema=schema,
        )
        left = rows
        while left > 0:
            yield batch if left >= n else batch.slice(0, left)
            left -= n


async def fill_topic(bootstrap: str, records: int, partitions: int) -> bool:
    """Create and fill the topic; False if it already exists (a reused cluster)."""
    async with Admin(bootstrap) as admin:
        if TOPIC in await admin.list_topics():
            return False
        await admin.create_topic(TOPIC, partitions=partitions, replication_factor=3)
        await admin.cluster.wait_for_topic(TOPIC, 30)
    value = b"x" * VALUE_BYTES
    async with Producer(bootstrap, linger_ms=5) as producer:
        last = None
        for i in range(records):
            last = await producer.send(TOPIC, value, partition=i % partitions)
        await producer.flush()
        assert last is not None
        await last
    return True


def make_spark(workdir: Path, cores: int) -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    log4j = workdir / "log4j2.properties"
    log4j.write_text(
        "rootLogger.level = error\nrootLogger.appenderRef.stderr.ref = console\n"
        "appender.console.type = Console\nappender.console.name = console\n"
        "appender.console.target = SYSTEM_ERR\nappender.console.layout.type = PatternLayout\n"
        "appender.console.layout.pattern = %m%n\n"
    )
    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("laminar-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
        .config("spark.sql.warehouse.dir", str(workdir / "warehouse"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    from spark_source import register

    register(spark)
    spark.dataSource.register(CeilingSource)
    return spark


def timed(df: DataFrame) -> float:
    start = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 timed runs of each query")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--cores", type=int, default=2, help="Spark local[N]")
    parser.add_argument("--runs", type=int, default=9, help="timed runs (best counts)")
    parser.add_argument(
        "--bootstrap", help="use this running cluster (topic spark-bench is kept) instead"
    )
    args = parser.parse_args()
    runs = 5 if args.quick else args.runs
    workdir = Path(tempfile.mkdtemp(prefix="laminar-spark-bench-"))
    cluster = None
    if not args.bootstrap:
        cluster = LocalCluster(workdir / "cluster", free_port_pairs(3), log_level="warning")
    produce_s = None
    try:
        if cluster is not None:
            cluster.start()
            asyncio.run(cluster.wait_ready(60))
        bootstrap = args.bootstrap or cluster.bootstrap
        started = time.perf_counter()
        if asyncio.run(fill_topic(bootstrap, args.records, args.partitions)):
            produce_s = time.perf_counter() - started
            print(f"produced {args.records} records in {produce_s:.1f} s", flush=True)
        spark = make_spark(workdir, args.cores)
        source = (
            spark.read.format("laminar")
            .option("bootstrap", bootstrap)
            .option("subscribe", TOPIC)
            .load()
        )
        rows = source.count()
        assert rows == args.records, f"read {rows} rows, produced {args.records}"
        batch_rows = DEFAULT_FETCH_BYTES // (VALUE_BYTES + 12)  # rows per fetch, as the source
        ceiling = (
            spark.read.format("laminar_bench_ceiling")
            .option("rows", str(args.records))
            .option("partitions", str(args.partitions))
            .option("batch", str(batch_rows))
            .load()
        )
        assert ceiling.count() == args.records
        timed(source)  # warm-up: the first write query of each source runs far slower
        timed(ceiling)
        source_times, ceiling_times = [], []
        for _ in range(runs):  # interleaved, so background load hits both alike
            source_times.append(timed(source))
            ceiling_times.append(timed(ceiling))
        source_s, ceiling_s = min(source_times), min(ceiling_times)
        print(f"source runs {source_times}, ceiling runs {ceiling_times}", flush=True)
        spark.stop()
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    result = {
        "bench": "spark_source_batch_read",
        "records": args.records,
        "value_bytes": VALUE_BYTES,
        "partitions": args.partitions,
        "spark": f"local[{args.cores}], noop sink, best of {runs}",
        "seconds": round(source_s, 3),
        "ceiling_seconds": round(ceiling_s, 3),
        "rows_per_s": round(args.records / source_s),
        "ceiling_rows_per_s": round(args.records / ceiling_s),
        "ratio": round(ceiling_s / source_s, 3),
        "produce_rows_per_s": round(args.records / produce_s) if produce_s else None,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
