"""Streaming aggregation from a laminar topic to Parquet files with the `laminar` Spark source.

Start the local cluster first (`make run`, which also creates the topic `demo`), then:

    .venv/bin/python examples/spark_stream_to_parquet.py --produce 5000 --available-now

It counts records and value bytes per key in 10-second event-time windows and appends the
closed windows to Parquet under examples/output/ (with its checkpoint beside it). Run it again
with more data and it continues from the checkpoint: every record is counted exactly once.
Without --available-now it keeps running (one micro-batch every --trigger seconds) until
Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

from laminar.client import DEFAULT_BOOTSTRAP, Producer

HERE = Path(__file__).resolve().parent


async def produce(bootstrap: str, topic: str, count: int) -> None:
    """Sample records: keys user-0..user-9, JSON-ish values, timestamps spread over a minute."""
    now = int(time.time() * 1000)
    async with Producer(bootstrap) as producer:
        for i in range(count):
            await producer.send(
                topic,
                f'{{"n": {i}, "payload": "{"x" * (i % 50)}"}}'.encode(),
                key=f"user-{i % 10}".encode(),
                timestamp_ms=now - 60_000 + (i * 60_000) // max(1, count),
            )
        await producer.flush()
    print(f"produced {count} records to {topic}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=DEFAULT_BOOTSTRAP)
    parser.add_argument("--topic", default="demo")
    parser.add_argument("--output", type=Path, default=HERE / "output" / "per_key_counts")
    parser.add_argument("--produce", type=int, default=0, help="first send this many records")
    parser.add_argument("--available-now", action="store_true", help="read what is there, stop")
    parser.add_argument("--trigger", type=float, default=5.0, help="seconds between batches")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=100_000)
    args = parser.parse_args()

    if args.produce:
        asyncio.run(produce(args.bootstrap, args.topic, args.produce))

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from spark_source import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("laminar-example")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    register(spark)

    records = (
        spark.readStream.format("laminar")
        .option("bootstrap", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
        .load()
    )
    per_key = (
        records.withWatermark("timestamp", "10 seconds")
        .groupBy(F.window("timestamp", "10 seconds"), F.col("key").cast("string").alias("key"))
        .agg(F.count("*").alias("records"), F.sum(F.length("value")).alias("value_bytes"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "key",
            "records",
            "value_bytes",
        )
    )
    writer = (
        per_key.writeStream.format("parquet")
        .outputMode("append")
        .option("path", str(args.output))
        .option("checkpointLocation", str(args.output.with_name(args.output.name + "_checkpoint")))
    )
    writer = (
        writer.trigger(availableNow=True)
        if args.available_now
        else writer.trigger(processingTime=f"{args.trigger} seconds")
    )
    query = writer.start()
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    if args.output.exists():
        written = spark.read.parquet(str(args.output))
        print(f"{written.count()} closed windows in {args.output}:")
        written.orderBy("window_start", "key").show(10, truncate=False)
    spark.stop()


if __name__ == "__main__":
    main()
