"""Produce/consume throughput and ack latency of a real local cluster.

Runs a 3-node cluster (topic of 3 partitions, RF 3, acks=all), then a 1-node cluster (RF 1),
with a *lean* producer: pre-built batches of 100-byte records sent as pipelined produce
requests, so the figure measures the nodes, not Python record encoding. It also measures the
full `Producer` API for a few seconds, one ``send`` per record and ``send_many`` of 1,000
records per call (client-bound; both with their ratio to the lean figure and the client's
CPU-µs per record), consumes everything back as raw batches, and in the same run measures
two baselines: raw loopback TCP throughput and the rate of fdatasync'd 1 MiB writes on this
disk. The last line is one JSON object.

With ``--compression none|gzip|snappy|lz4|zstd`` the records are varied ~100-byte JSON-like
events instead of one repeated value (so ``none`` is the baseline for the codecs), the lean
batches and the ``Producer`` use that codec, and the consumer's decoded records/s is measured
too (the reader inflates).

    python bench/produce_bench.py --quick
    python bench/produce_bench.py --quick --compression zstd
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.client.connection import Connection
from laminar.client.localcluster import LocalCluster, free_port_pairs
from laminar.protocol import read_error
from laminar.segment.batch import build_batch, iter_batches
from laminar.segment.compression import codec_of

RECORD = b"x" * 100
TOPIC = "bench"


def event_records(count: int, seed: int = 7) -> list[bytes]:
    """Varied ~100-byte JSON-like events: what compression meets in practice."""
    rng = random.Random(seed)
    pages = ["/", "/cart", "/checkout", "/search", "/products/%d", "/account/orders"]
    out = []
    for i in range(count):
        page = rng.choice(pages)
        page = page % rng.randrange(10_000) if "%d" in page else page
        out.append(
            b'{"user":%d,"event":"%s","page":"%s","ms":%d,"ok":%s}'
            % (
                rng.randrange(1_000_000),
                rng.choice((b"view", b"click", b"scroll", b"buy")),
                page.encode(),
                1_700_000_000_000 + i * 7 + rng.randrange(5),
                rng.choice((b"true", b"false")),
            )
        )
    return out


def records_of(args: argparse.Namespace) -> list[bytes]:
    return [RECORD] if args.compression is None else event_records(1000)


async def lean_produce(
    bootstrap: str,
    partitions: int,
    seconds: float,
    records_per_batch: int,
    in_flight: int,
    args: argparse.Namespace,
) -> dict[str, float]:
    """Pipelined produce requests of one pre-built batch each, per partition leader."""
    payloads = records_of(args)
    now = int(time.time() * 1000)
    batch = build_batch(
        [(None, payloads[i % len(payloads)], (), now) for i in range(records_per_batch)],
        compression=codec_of(args.compression),
    )
    record_bytes = sum(len(payloads[i % len(payloads)]) for i in range(records_per_batch))
    async with Admin(bootstrap) as admin:
        description = await admin.describe_topic(TOPIC)
    leaders = {p.partition: p.leader for p in description.partitions}
    addresses = {n: a for n, a in _addresses(bootstrap).items()}
    latencies: list[float] = []
    acked = 0
    deadline = time.perf_counter() + seconds

    async def worker(partition: int) -> None:
        nonlocal acked
        connection = await Connection.open(addresses[leaders[partition]])

        def fill(body: Any) -> None:
            request = body.init("produce")
            request.acks = -1
            request.timeoutMs = 10_000
            (ref,) = request.init("batches", 1)
            ref.topic = TOPIC
            ref.partition = partition
            ref.payloadLength = len(batch)

        async def one() -> None:
            nonlocal acked
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                reply, _ = await connection.request(fill, [batch])
                (result,) = reply.body.produce.results
                error = read_error(result.error)
                if error is not None:
                    raise error
                latencies.append(time.perf_counter() - started)
                acked += records_per_batch

        try:
            await asyncio.gather(*(one() for _ in range(in_flight)))
        finally:
            connection.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker(p) for p in range(partitions)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "records_per_s": acked / elapsed,
        "mb_s": acked * record_bytes / records_per_batch / elapsed / 1e6,
        "batch_bytes": len(batch),
        "record_bytes": record_bytes,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000,
        "records": acked,
    }


def _addresses(bootstrap: str) -> dict[int, str]:
    return {i + 1: a for i, a in enumerate(bootstrap.split(","))}


async def api_produce(
    bootstrap: str, seconds: float, args: argparse.Namespace, bulk: bool = False
) -> dict[str, float]:
    """The full Producer API (per-record Python encoding, compression if asked): records/s and
    this process's CPU-µs per record; ``bulk``: ``send_many`` of 1,000 records per call
    instead of one ``send`` per record."""
    sent = 0
    payloads = records_of(args)
    chunk = [payloads[i % len(payloads)] for i in range(1000)]
    async with Producer(
        bootstrap,
        acks="all",
        linger_ms=5,
        batch_bytes=args.api_batch_bytes,
        compression=args.compression,
    ) as producer:
        deadline = time.perf_counter() + seconds
        started = time.perf_counter()
        cpu = time.process_time()
        # A sliding window of 50 calls' worth (50,000 records) awaited oldest first, so the
        # pipeline never drains (as the lean path keeps its requests in flight).
        window: collections.deque[Any] = collections.deque()
        while time.perf_counter() < deadline:
            if bulk:
                window.append(await producer.send_many(TOPIC, chunk))
            else:
                futures = [
                    await producer.send(TOPIC, payloads[i % len(payloads)]) for i in range(1000)
                ]
                window.append(asyncio.gather(*futures))
            sent += 1000
            if len(window) > 50:
                await window.popleft()
        for pending in window:
            await pending
        return {
            "records_per_s": sent / (time.perf_counter() - started),
            "client_cpu_us_per_record": (time.process_time() - cpu) / sent * 1e6,
        }


async def consume_all(bootstrap: str, partitions: int) -> tuple[float, int]:
    """Read every partition from offset 0 to its high watermark as raw batches: MB/s."""
    total = 0
    async with Consumer(bootstrap) as consumer:
        started = time.perf_counter()

        async def one(partition: int) -> None:
            nonlocal total
            tp = TopicPartition(TOPIC, partition)
            offset = 0
            while True:
                fetched = await consumer.fetch_batches(tp, offset, 4 << 20)
                if offset >= fetched.high_watermark or not fetched.data:
                    return
                total += len(fetched.data)
                for _, header in iter_batches(fetched.data):
                    offset = header.next_offset

        await asyncio.gather(*(one(p) for p in range(partitions)))
        elapsed = time.perf_counter() - started
    return total / elapsed / 1e6, total


async def decode_all(bootstrap: str, partitions: int) -> float:
    """Every record of every partition through the native Consumer (decoded, inflated if
    compressed): records/s."""
    async with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
        ends = {tp: (await consumer.fetch_batches(tp, 0, 1)).high_watermark for tp in tps}
        await consumer.assign(tps)
        started = time.perf_counter()
        count = 0
        done: set[TopicPartition] = set()
        while len(done) < partitions:
            for record in await consumer.getmany(timeout_ms=1000):
                count += 1
                tp = TopicPartition(record.topic, record.partition)
                if record.offset >= ends[tp] - 1:
                    done.add(tp)
            for tp in tps:
                if tp not in done and consumer.position(tp) >= ends[tp]:
                    done.add(tp)
        return count / (time.perf_counter() - started)


async def loopback_baseline(megabytes: int) -> float:
    """Raw uvloop TCP throughput over loopback (MB/s), the network ceiling."""
    received = 0
    done = asyncio.Event()
    target = megabytes * (1 << 20)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal received
        while received < target:
            chunk = await reader.read(1 << 20)
            if not chunk:
                break
            received += len(chunk)
        done.set()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    block = b"y" * (1 << 20)
    started = time.perf_counter()
    for _ in range(megabytes):
        writer.write(block)
        await writer.drain()
    await done.wait()
    elapsed = time.perf_counter() - started
    writer.close()
    server.close()
    return target / elapsed / 1e6


def fsync_baseline(directory: Path, megabytes: int) -> float:
    """Sequential 1 MiB writes each followed by fdatasync (MB/s), the disk ceiling."""
    path = directory / "raw.bin"
    block = b"z" * (1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    started = time.perf_counter()
    for _ in range(megabytes):
        os.write(fd, block)
        os.fdatasync(fd)
    elapsed = time.perf_counter() - started
    os.close(fd)
    path.unlink()
    return megabytes * 1.048576 / elapsed


async def scrape_every(addresses: list[str], interval: float) -> None:
    """GET /metrics from every node each ``interval`` s, as a Prometheus server would."""
    while True:
        await asyncio.sleep(interval)
        for address in addresses:
            host, port = address.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")
            await reader.read()
            writer.close()


def nodes_cpu_seconds(pids: list[int]) -> float:
    """User + system CPU the node processes used so far (Linux /proc): what they spend per
    record is steadier than throughput on a machine shared with other work."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


async def run_cluster(
    root: Path, nodes: int, rf: int, seconds: float, args: argparse.Namespace
) -> dict[str, Any]:
    pairs = free_port_pairs(nodes)
    extra: dict[str, Any] = {}
    if args.metrics:
        extra["metrics_ports"] = [port for port, _ in free_port_pairs(nodes)]
    cluster = LocalCluster(root, pairs, log_level="warning", **extra)
    cluster.start()
    scraper: asyncio.Task[None] | None = None
    try:
        await cluster.wait_ready(60)
        if args.metrics:
            addresses = [node.metrics_address for node in cluster.nodes.values()]
            scraper = asyncio.create_task(scrape_every(addresses, args.scrape_interval))
        async with Admin(cluster.bootstrap) as admin:
            await admin.create_topic(TOPIC, partitions=3, replication_factor=rf)
            for _ in range(100):
                parts = (await admin.describe_topic(TOPIC)).partitions
                if all(p.leader for p in parts):
                    break
                await asyncio.sleep(0.1)
        pids = [node.pid for node in cluster.nodes.values() if node.pid is not None]
        cpu_before = nodes_cpu_seconds(pids)
        lean = await lean_produce(
            cluster.bootstrap,
            3,
            seconds,
            args.records_per_batch,
            args.in_flight if rf == 3 else args.in_flight_r1,
            args,
        )
        lean["node_cpu_us_per_record"] = (
            (nodes_cpu_seconds(pids) - cpu_before) / max(1, lean["records"]) * 1e6
        )
        result: dict[str, Any] = {"lean": lean}
        if rf == 3:
            # back to back with the lean figure above, in the same cluster
            result["api"] = await api_produce(cluster.bootstrap, args.api_seconds, args)
            result["api_many"] = await api_produce(
                cluster.bootstrap, args.api_seconds, args, bulk=True
            )
            result["consume_mb_s"], result["consumed_bytes"] = await consume_all(
                cluster.bootstrap, 3
            )
            if args.compression is not None:
                result["decoded_records_per_s"] = await decode_all(cluster.bootstrap, 3)
        return result
    finally:
        if scraper is not None:
            scraper.cancel()
        cluster.stop()


async def main(args: argparse.Namespace) -> dict[str, Any]:
    if args.r1_only:
        return await r1_only(args)
    with tempfile.TemporaryDirectory(prefix="laminar-bench-") as tmp:
        root = Path(tmp)
        loopback = await loopback_baseline(512 if args.quick else 2048)
        disk = fsync_baseline(root, 256 if args.quick else 1024)
        r3 = await run_cluster(root / "r3", 3, 3, args.seconds, args)
        r1 = await run_cluster(root / "r1", 1, 1, args.seconds, args)
    extra: dict[str, Any] = {}
    if args.compression is not None:
        extra = {
            "compression": args.compression,
            "lean_batch_bytes": r3["lean"]["batch_bytes"],
            "lean_record_bytes": r3["lean"]["record_bytes"],
            "decoded_records_per_s": round(r3["decoded_records_per_s"]),
        }
    return {
        **extra,
        "r3_records_per_s": round(r3["lean"]["records_per_s"]),
        "r3_mb_s": round(r3["lean"]["mb_s"], 1),
        "r3_p50_ms": round(r3["lean"]["p50_ms"], 2),
        "r3_p99_ms": round(r3["lean"]["p99_ms"], 2),
        "r3_node_cpu_us_per_record": round(r3["lean"]["node_cpu_us_per_record"], 3),
        "r1_records_per_s": round(r1["lean"]["records_per_s"]),
        "r1_mb_s": round(r1["lean"]["mb_s"], 1),
        "r1_p50_ms": round(r1["lean"]["p50_ms"], 2),
        "r1_p99_ms": round(r1["lean"]["p99_ms"], 2),
        "r1_node_cpu_us_per_record": round(r1["lean"]["node_cpu_us_per_record"], 3),
        "api_producer_records_per_s": round(r3["api"]["records_per_s"]),
        "api_producer_client_cpu_us_per_record": round(r3["api"]["client_cpu_us_per_record"], 2),
        "api_send_many_records_per_s": round(r3["api_many"]["records_per_s"]),
        "api_send_many_client_cpu_us_per_record": round(
            r3["api_many"]["client_cpu_us_per_record"], 2
        ),
        "api_producer_vs_lean_ratio": round(
            r3["api"]["records_per_s"] / r3["lean"]["records_per_s"], 3
        ),
        "api_send_many_vs_lean_ratio": round(
            r3["api_many"]["records_per_s"] / r3["lean"]["records_per_s"], 3
        ),
        "consume_mb_s": round(r3["consume_mb_s"], 1),
        "loopback_tcp_mb_s": round(loopback, 1),
        "raw_fsync_write_mb_s": round(disk, 1),
        "r3_vs_disk_ratio": round(r3["lean"]["mb_s"] / disk, 3),
        "consume_vs_loopback_ratio": round(r3["consume_mb_s"] / loopback, 3),
        "metrics": f"on, scraped every {args.scrape_interval} s" if args.metrics else "off",
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "client": (
            f"lean: pre-built {args.records_per_batch}-record batches, {args.in_flight} (R3) / "
            f"{args.in_flight_r1} (R1) requests in flight per partition, one uvloop process"
        ),
    }


async def r1_only(args: argparse.Namespace) -> dict[str, Any]:
    """The 1-node lean produce alone (no baselines): short runs for interleaved A/B."""
    with tempfile.TemporaryDirectory(prefix="laminar-bench-") as tmp:
        r1 = (await run_cluster(Path(tmp) / "r1", 1, 1, args.seconds, args))["lean"]
    return {
        "r1_records_per_s": round(r1["records_per_s"]),
        "r1_p50_ms": round(r1["p50_ms"], 2),
        "r1_p99_ms": round(r1["p99_ms"], 2),
        "r1_node_cpu_us_per_record": round(r1["node_cpu_us_per_record"], 3),
        "metrics": f"on, scraped every {args.scrape_interval} s" if args.metrics else "off",
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (under 60 s)")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--api-seconds", type=float, default=None)
    parser.add_argument("--records-per-batch", type=int, default=1000)
    parser.add_argument(
        "--compression",
        choices=("none", "gzip", "snappy", "lz4", "zstd"),
        default=None,
        help="varied event records, compressed with this codec (none: their baseline)",
    )
    parser.add_argument(
        "--in-flight", type=int, default=2, help="R3 requests in flight per partition"
    )
    parser.add_argument(
        "--in-flight-r1", type=int, default=4, help="R1 requests in flight per partition"
    )
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="nodes serve /metrics (--metrics-listen), scraped during the run",
    )
    parser.add_argument("--scrape-interval", type=float, default=1.0)
    parser.add_argument("--r1-only", action="store_true", help="only the 1-node lean produce")
    parser.add_argument(
        "--api-batch-bytes",
        type=int,
        default=256 * 1024,
        help="the Producer's batch_bytes (one batch per partition is in flight at a time)",
    )
    arguments = parser.parse_args()
    if arguments.seconds is None:
        arguments.seconds = 8.0 if arguments.quick else 15.0
    if arguments.api_seconds is None:
        arguments.api_seconds = 3.0 if arguments.quick else 8.0
    figures = uvloop.run(main(arguments))
    print(json.dumps(figures))
