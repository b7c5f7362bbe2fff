"""Spark source read throughput against the ceiling of a trivial in-memory Arrow source.

    python bench/spark_bench.py --quick

Starts a local 3-node laminar cluster (temp dir), produces N 100-byte records into a topic,
then times a batch query `spark.read.format("laminar") ... .write.format("noop")` over all of
them, and the same query over a Python data source that yields pre-built Arrow batches of the
same schema, row count, partition count and batch size (what Spark itself can take from a
Python source on this machine).

Keyless fixed-size records are the decoder's easiest case, so a second topic holds a realistic
mix (MIX below: keys, some null, 0-3 headers, log-normal value sizes), read with
includeHeaders=true, against a ceiling whose pre-built batches come from the same generator.
Last line: one JSON object with rows_per_s, ceiling_rows_per_s, ratio and the mix_* figures.
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
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition  # noqa: E402
from pyspark.sql.types import StructType  # noqa: E402

from laminar.client import Admin, Producer  # noqa: E402
from laminar.client.localcluster import LocalCluster, free_port_pairs  # noqa: E402
from laminar.segment.batch import HEADER_SIZE, build_batch  # noqa: E402
from spark_source.options import DEFAULT_FETCH_BYTES  # noqa: E402
from spark_source.schema import arrow_schema, spark_schema  # noqa: E402

TOPIC = "spark-bench"
VALUE_BYTES = 100
MIX_TOPIC = "spark-bench-mix"
MIX = (
    "keys 8-36 B (10% null), 0-3 headers (trace-id, content-type, source), header values "
    "1-32 B, values log-normal median 200 B sigma 0.9 clipped to 20-2048 B"
)
HEADER_NAMES = ("trace-id", "content-type", "source")
_NAME_ORDERS = ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))

MixRecord = tuple[bytes | None, bytes, list[tuple[str, bytes]]]


def mix_records(seed: int, count: int) -> list[MixRecord]:
    """``count`` (key, value, headers) records of the realistic mix (MIX), the same for the
    same seed: what the mix topic is filled with and what its ceiling's batches hold."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(0x21, 0x7F, 1 << 16, dtype=np.uint8).tobytes()  # printable text
    key_sizes = rng.integers(8, 37, count).tolist()
    null_keys = (rng.random(count) < 0.1).tolist()
    header_counts = rng.integers(0, 4, count).tolist()
    name_orders = rng.integers(0, len(_NAME_ORDERS), count).tolist()
    header_sizes = rng.integers(1, 33, (count, 3)).tolist()
    value_sizes = np.clip(rng.lognormal(np.log(200), 0.9, count), 20, 2048).astype(int).tolist()
    starts = rng.integers(0, len(pool) - 2048, (count, 5)).tolist()
    records: list[MixRecord] = []
    for i in range(count):
        at = starts[i]
        key = None if null_keys[i] else pool[at[0] : at[0] + key_sizes[i]]
        headers = [
            (HEADER_NAMES[name], pool[at[2 + j] : at[2 + j] + header_sizes[i][j]])
            for j, name in enumerate(_NAME_ORDERS[name_orders[i]][: header_counts[i]])
        ]
        records.append((key, pool[at[1] : at[1] + value_sizes[i]], headers))
    return records


def write_mix_ceiling(path: Path, rows: int) -> None:
    """The mix ceiling's key, value and headers columns (``rows`` mix records) as an Arrow
    IPC file, for its readers to memory-map."""
    records = mix_records(2, rows)
    headers = [[{"key": k, "value": v} for k, v in pairs] for _, _, pairs in records]
    schema = arrow_schema(spark_schema(True))
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([key for key, _, _ in records], pa.binary()),
            pa.array([value for _, value, _ in records], pa.binary()),
            pa.array(headers, schema.field("headers").type),
        ],
        names=["key", "value", "headers"],
    )
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)


def mix_record_bytes(records: list[MixRecord]) -> float:
    """Mean payload bytes per record: key, value, header names and values."""
    total = sum(
        len(key or b"") + len(value) + sum(len(name) + len(v) for name, v in headers)
        for key, value, headers in records
    )
    return total / len(records)


def mix_wire_bytes(records: list[MixRecord]) -> float:
    """Mean bytes per record inside a batch (fields, varints), to size the ceiling's batches
    as the source's fetches hold them."""
    batch = build_batch([(key, value, headers, 0) for key, value, headers in records])
    return (len(batch) - HEADER_SIZE) / len(records)


class CeilingSource(DataSource):
    """Yields the same pre-built Arrow batch over and over: no I/O, no decoding."""

    @classmethod
    def name(cls) -> str:
        return "laminar_bench_ceiling"

    def schema(self) -> StructType:
        return spark_schema("mix_file" in self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        return CeilingReader(
            int(self.options["rows"]),
            int(self.options["partitions"]),
            int(self.options["batch"]),
            self.options.get("mix_file"),
        )


class CeilingReader(DataSourceReader):
    def __init__(self, rows: int, partitions: int, batch: int, mix_file: str | None) -> None:
        self.rows, self.parts, self.batch, self.mix_file = rows, partitions, batch, mix_file

    def partitions(self) -> list[InputPartition]:
        share = self.rows // self.parts
        return [
            InputPartition((i, share + (self.rows % self.parts if i == 0 else 0)))
            for i in range(self.parts)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        index, rows = partition.value
        schema = arrow_schema(spark_schema(self.mix_file is not None))
        n = min(self.batch, rows)
        mixed = None
        if self.mix_file is not None:  # memory-mapped: no generating in the timed query
            mixed = pa.ipc.open_file(pa.memory_map(self.mix_file)).get_batch(0).slice(0, n)
            keys, values = mixed.column("key"), mixed.column("value")
            topic = MIX_TOPIC
        else:
            keys = pa.nulls(n, pa.binary())
            values = pa.array([b"v" * VALUE_BYTES] * n, pa.binary())
            topic = TOPIC
        columns = [
            keys,
            values,
            pa.array([topic] * n, pa.string()),
            pa.array([index] * n, pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.array([1_700_000_000_000_000] * n, pa.int64()).view(pa.timestamp("us", "UTC")),
            pa.array([0] * n, pa.int32()),
        ]
        if mixed is not None:
            columns.append(mixed.column("headers"))
        batch = pa.RecordBatch.from_arrays(columns, schema=schema)
        left = rows
        while left > 0:
            yield batch if left >= n else batch.slice(0, left)
            left -= n


async def fill_topic(
    bootstrap: str, topic: str, partitions: int, records: Iterable[MixRecord]
) -> bool:
    """Create ``topic`` and fill it with the public Producer, one ``send`` per record, record
    i to partition i % partitions (so every partition holds as many as the ceiling's); False
    if it already exists (a reused cluster)."""
    async with Admin(bootstrap) as admin:
        if topic in await admin.list_topics():
            return False
        await admin.create_topic(topic, partitions=partitions, replication_factor=3)
        await admin.cluster.wait_for_topic(topic, 30)
    async with Producer(bootstrap, linger_ms=5) as producer:
        last = None
        for i, (key, value, headers) in enumerate(records):
            last = await producer.send(
                topic, value, key=key, headers=headers, partition=i % partitions
            )
        await producer.flush()
        assert last is not None
        await last
    return True


def plain_records(count: int) -> Iterator[MixRecord]:
    """The plain topic's records: keyless, VALUE_BYTES each, no headers."""
    value = b"x" * VALUE_BYTES
    return ((None, value, []) for _ in range(count))


def mix_stream(count: int) -> Iterator[MixRecord]:
    """The mix topic's records, generated 50,000 at a time as the producer takes them."""
    for first in range(0, count, 50_000):
        yield from mix_records(1 + first, min(50_000, count - first))


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
    parser.add_argument("--mix-records", type=int, default=500_000, help="realistic mix topic")
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
    produce_s = mix_produce_s = None
    try:
        if cluster is not None:
            cluster.start()
            asyncio.run(cluster.wait_ready(60))
        bootstrap = args.bootstrap or cluster.bootstrap
        started = time.perf_counter()
        if asyncio.run(fill_topic(bootstrap, TOPIC, args.partitions, plain_records(args.records))):
            produce_s = time.perf_counter() - started
            print(f"produced {args.records} records in {produce_s:.1f} s", flush=True)
        started = time.perf_counter()
        if asyncio.run(
            fill_topic(bootstrap, MIX_TOPIC, args.partitions, mix_stream(args.mix_records))
        ):
            mix_produce_s = time.perf_counter() - started
            print(f"produced {args.mix_records} mix records in {mix_produce_s:.1f} s", flush=True)
        sample = mix_records(0, 20_000)
        record_bytes = mix_record_bytes(sample)
        mix_batch_rows = int(DEFAULT_FETCH_BYTES // mix_wire_bytes(sample))
        mix_file = workdir / "mix-ceiling.arrow"
        write_mix_ceiling(mix_file, mix_batch_rows)
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
        mix_source = (
            spark.read.format("laminar")
            .option("bootstrap", bootstrap)
            .option("subscribe", MIX_TOPIC)
            .option("includeHeaders", "true")
            .load()
        )
        rows = mix_source.count()
        assert rows == args.mix_records, f"read {rows} mix rows, produced {args.mix_records}"
        mix_ceiling = (
            spark.read.format("laminar_bench_ceiling")
            .option("rows", str(args.mix_records))
            .option("partitions", str(args.partitions))
            .option("batch", str(mix_batch_rows))
            .option("mix_file", str(mix_file))
            .load()
        )
        assert mix_ceiling.count() == args.mix_records
        queries = (source, ceiling, mix_source, mix_ceiling)
        for query in queries:  # warm-up: the first write query of each source runs far slower
            timed(query)
        times: list[list[float]] = [[] for _ in queries]
        for _ in range(runs):  # interleaved, so background load hits all alike
            for query, measured in zip(queries, times, strict=True):
                measured.append(timed(query))
        source_s, ceiling_s, mix_s, mix_ceiling_s = (min(measured) for measured in times)
        print(f"source runs {times[0]}, ceiling runs {times[1]}", flush=True)
        print(f"mix source runs {times[2]}, mix ceiling runs {times[3]}", flush=True)
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
        "mix_records": args.mix_records,
        "mix": MIX,
        "mix_record_bytes": round(record_bytes, 1),
        "mix_seconds": round(mix_s, 3),
        "mix_ceiling_seconds": round(mix_ceiling_s, 3),
        "mix_rows_per_s": round(args.mix_records / mix_s),
        "mix_ceiling_rows_per_s": round(args.mix_records / mix_ceiling_s),
        "mix_ratio": round(mix_ceiling_s / mix_s, 3),
        "mix_produce_rows_per_s": (
            round(args.mix_records / mix_produce_s) if mix_produce_s else None
        ),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
