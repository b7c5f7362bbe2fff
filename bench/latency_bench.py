"""End-to-end latency at fixed rates: sent by a producer → received by a following consumer.

Both sides: 3 servers on this machine, one replicated-3 stream, one process producing
100-byte records at fixed rates (5,000 / 20,000 / 100,000 records/s) and consuming them in
the same process; a record's latency is from just before the producer's send call to the
moment the consumer hands it to the application (one clock, ``time.perf_counter``).

* laminar: a 3-node `LocalCluster`, one topic of 3 partitions with replication factor 3,
  the public `Producer` (acks=all, ``--linger-ms``, default 0) and a `Consumer` assigned all
  partitions from their end (``max_wait_ms`` 100), `getmany` in a loop.
* NATS JetStream (Debian's ``nats-server``, three servers clustered with ``-js``): an R3
  file-storage stream, ``nats-py`` publishing with acks (``js.publish`` per record, many in
  flight) and a push consumer acking each message. Skipped with a message if ``nats-server``
  or ``nats-py`` is absent (this bench installs nothing). Mind the durability difference:
  JetStream acknowledges a write once a quorum holds it in memory and flushes to disk on a
  timer (``sync_interval``, 2 minutes by default); laminar's acks=all waits until a majority
  fdatasynced it.

The producer paces itself on a 1 ms timer (each wake-up sends what is due), so records leave
in small bursts as an application's would. Records of a short warm-up at each rate are not
counted. A side that falls a second behind the rate (its client saturates) stops that rate
early and is reported as ``saturated`` with the rate it reached. Before the rates, each side
sends 2,000 records one at a time, each once the one before is acknowledged
(``one_in_flight``): a record's path with nothing queued ahead of it, and the servers' CPU
per record, what one replication round costs. The last line is one JSON object: p50/p99 per
rate and one in flight, for both.

    python bench/latency_bench.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import struct
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nats_cluster import add_r3_stream, nats_available, nats_cluster
from proc_cpu import cpu_seconds

from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.client.localcluster import LocalCluster, free_port_pairs

RATES = (5_000, 20_000, 100_000)
RECORD_BYTES = 100
TOPIC = "latency"
SUBJECT = "latency"
STAMP = struct.Struct("<dIB")  # send time, sequence, 1 = counted (0 = warm-up)
PAD = b"x" * (RECORD_BYTES - STAMP.size)
WARMUP_SECONDS = 0.5
DRAIN_SECONDS = 20.0

Send = Callable[[bytes], Awaitable[Any]]
Flush = Callable[[], Awaitable[Any]]
LONE_RECORDS = 2_000


class Receiver:
    """Collects latencies of counted records as the consumer hands them over."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.acks: list[float] = []
        """Sent → acknowledged to the producer (the write path alone), counted records."""
        self.received = 0
        self.expected = 0
        self.done = asyncio.Event()

    def reset(self, expected: int) -> None:
        """Start counting a new phase of ``expected`` records."""
        self.latencies = []
        self.acks = []
        self.received = 0
        self.expected = expected
        self.done.clear()

    def ack_figures(self) -> dict[str, float]:
        acks = sorted(self.acks)
        return {
            "ack_p50_ms": round(acks[len(acks) // 2] * 1000, 2),
            "ack_p99_ms": round(acks[int(len(acks) * 0.99)] * 1000, 2),
        }

    def got(self, value: bytes | memoryview, now: float) -> None:
        sent, _sequence, counted = STAMP.unpack_from(value)
        if counted:
            self.latencies.append(now - sent)
            self.received += 1
            if self.received >= self.expected:
                self.done.set()


async def paced(send: Send, rate: int, seconds: float, counted: int) -> tuple[int, float]:
    """Send ``rate * seconds`` records at ``rate``; returns (count sent, rate reached).

    Gives up once a second behind the schedule: the client cannot keep this rate, and
    letting its backlog grow would only measure the backlog (and take minutes)."""
    total = int(rate * seconds)
    clock = time.perf_counter
    started = clock()
    sent = 0
    while sent < total:
        scheduled = int((clock() - started) * rate) + 1
        if scheduled - sent > rate:
            break
        due = min(total, scheduled)
        while sent < due:
            await send(STAMP.pack(clock(), sent, counted) + PAD)
            sent += 1
        await asyncio.sleep(0.001)
    return sent, sent / (clock() - started)


async def run_rates(
    send: Send,
    flush: Flush,
    receiver: Receiver,
    rates: list[int],
    seconds: float,
    servers: list[int],
) -> dict[str, Any]:
    """Each rate in turn; besides latencies, the CPU time the servers (``servers``: pids) and
    this client process spent per 1,000 counted records: on a busy machine this is the
    steadier figure (every ms of CPU on the path is a ms a record may wait for a core)."""
    out: dict[str, Any] = {}
    for rate in rates:
        await paced(send, rate, WARMUP_SECONDS, 0)
        receiver.reset(int(rate * seconds))
        server_cpu, client_cpu = cpu_seconds(servers), time.process_time()
        count, reached = await paced(send, rate, seconds, 1)
        receiver.expected = count
        if receiver.received >= count:
            receiver.done.set()
        await flush()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(receiver.done.wait(), DRAIN_SECONDS)
        out[str(rate)] = summary(receiver.latencies, count, reached)
        if count:
            server_cpu = cpu_seconds(servers) - server_cpu
            client_cpu = time.process_time() - client_cpu
            out[str(rate)]["server_cpu_ms_per_1k"] = round(server_cpu * 1e6 / count, 1)
            out[str(rate)]["client_cpu_ms_per_1k"] = round(client_cpu * 1e6 / count, 1)
        if receiver.acks:
            out[str(rate)].update(receiver.ack_figures())
        if count < int(rate * seconds):
            out[str(rate)]["saturated"] = True  # its client fell a second behind: gave up
        print(f"  {rate:>7}/s: {json.dumps(out[str(rate)])}", file=sys.stderr, flush=True)
    return out


async def one_in_flight(
    send_acked: Send, receiver: Receiver, count: int, servers: list[int]
) -> dict[str, Any]:
    """``count`` records, each sent once the one before is acknowledged: a record's whole path
    with nothing queued ahead of it, and the servers' CPU per record is what one replication
    round costs (the figure that sets latency once the CPU is shared)."""
    for sequence in range(50):  # warm-up, not counted
        await send_acked(STAMP.pack(time.perf_counter(), sequence, 0) + PAD)
    receiver.reset(count)
    server_cpu = cpu_seconds(servers)
    clock = time.perf_counter
    for sequence in range(count):
        sent = clock()
        await send_acked(STAMP.pack(sent, sequence, 1) + PAD)
        receiver.acks.append(clock() - sent)
    server_cpu = cpu_seconds(servers) - server_cpu
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(receiver.done.wait(), DRAIN_SECONDS)
    out = summary(receiver.latencies, count, count / sum(receiver.acks))
    out.update(receiver.ack_figures())
    out["server_cpu_ms_per_1k"] = round(server_cpu * 1e6 / count, 1)
    print(f"  one in flight: {json.dumps(out)}", file=sys.stderr, flush=True)
    return out


def summary(latencies: list[float], sent: int, reached: float) -> dict[str, Any]:
    ordered = sorted(latencies)
    if not ordered:
        return {"p50_ms": None, "p99_ms": None, "received": 0, "sent": sent}

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 2)

    return {
        "p50_ms": at(0.50),
        "p99_ms": at(0.99),
        "max_ms": round(ordered[-1] * 1000, 2),
        "received": len(ordered),
        "sent": sent,
        "rate_reached": round(reached),
    }


# --------------------------------------------------------------------------- laminar


async def laminar_side(work: Path, rates: list[int], seconds: float, linger_ms: float) -> Any:
    cluster = LocalCluster(work / "laminar", free_port_pairs(3), log_level="warning")
    cluster.start()
    try:
        await cluster.wait_ready(60)
        bootstrap = cluster.bootstrap
        async with Admin(bootstrap) as admin:
            await admin.create_topic(TOPIC, partitions=3, replication_factor=3)
            while not all(p.leader for p in (await admin.describe_topic(TOPIC)).partitions):
                await asyncio.sleep(0.1)
        receiver = Receiver()
        async with (
            Producer(bootstrap, acks="all", linger_ms=linger_ms) as producer,
            Consumer(bootstrap, max_wait_ms=100, auto_offset_reset="latest") as consumer,
        ):
            await consumer.assign([TopicPartition(TOPIC, p) for p in range(3)])
            failures: list[BaseException] = []

            def acked(sent: float, counted: int, future: Any) -> None:
                if future.exception() is not None:
                    failures.append(future.exception())
                elif counted:
                    receiver.acks.append(time.perf_counter() - sent)

            async def send(value: bytes) -> None:
                sent, _, counted = STAMP.unpack_from(value)
                future = await producer.send(TOPIC, value)
                future.add_done_callback(functools.partial(acked, sent, counted))

            async def send_acked(value: bytes) -> None:
                await (await producer.send(TOPIC, value))

            async def consume() -> None:
                clock = time.perf_counter
                while True:
                    records = await consumer.getmany(timeout_ms=100)
                    now = clock()
                    for record in records:
                        receiver.got(record.value, now)

            reader = asyncio.create_task(consume())
            try:
                pids = [node.pid for node in cluster.nodes.values() if node.pid is not None]
                lone = await one_in_flight(send_acked, receiver, LONE_RECORDS, pids)
                result = await run_rates(send, producer.flush, receiver, rates, seconds, pids)
                result["one_in_flight"] = lone
            finally:
                reader.cancel()
            if failures:
                raise failures[0]
            return result
    finally:
        cluster.stop()


# --------------------------------------------------------------------------- NATS


async def nats_side(work: Path, rates: list[int], seconds: float) -> Any:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    async with nats_cluster(work) as (urls, pids):
        client = await nats.connect(urls)
        js = client.jetstream()
        await add_r3_stream(js, "LATENCY", SUBJECT)
        receiver = Receiver()
        clock = time.perf_counter

        async def on_message(message: Any) -> None:
            receiver.got(message.data, clock())
            await message.ack()

        await js.subscribe(
            SUBJECT,
            cb=on_message,
            manual_ack=True,
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.NEW,
                max_ack_pending=100_000,
            ),
            pending_msgs_limit=1_000_000,
        )
        publishes: set[asyncio.Task[Any]] = set()
        failures: list[BaseException] = []

        def finished(sent: float, counted: int, task: asyncio.Task[Any]) -> None:
            publishes.discard(task)
            if not task.cancelled() and task.exception() is not None:
                failures.append(task.exception())  # type: ignore[arg-type]
            elif counted:
                receiver.acks.append(time.perf_counter() - sent)

        async def send(value: bytes) -> None:
            sent, _, counted = STAMP.unpack_from(value)
            task = asyncio.create_task(js.publish(SUBJECT, value))
            publishes.add(task)
            task.add_done_callback(functools.partial(finished, sent, counted))

        async def flush() -> None:
            if publishes:
                await asyncio.wait(list(publishes), timeout=DRAIN_SECONDS)

        async def send_acked(value: bytes) -> None:
            await js.publish(SUBJECT, value)

        try:
            lone = await one_in_flight(send_acked, receiver, LONE_RECORDS, pids)
            result = await run_rates(send, flush, receiver, rates, seconds, pids)
            result["one_in_flight"] = lone
        finally:
            await client.close()
        if failures:
            print(f"  NATS: {len(failures)} publishes failed: {failures[0]!r}", file=sys.stderr)
        return result


async def main(args: argparse.Namespace) -> dict[str, Any]:
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    rates = list(args.rates or RATES)
    figures: dict[str, Any] = {
        "record_bytes": RECORD_BYTES,
        "seconds_per_rate": seconds,
        "laminar_client": f"Producer acks=all linger_ms={args.linger_ms:g} + Consumer, one process",
    }
    with tempfile.TemporaryDirectory(prefix="latency-bench-") as tmp:
        work = Path(tmp)
        if not args.skip_laminar:
            print("laminar:", file=sys.stderr, flush=True)
            figures["laminar"] = await laminar_side(work, rates, seconds, args.linger_ms)
        missing = nats_available()
        if missing is not None or args.skip_nats:
            print(f"skipping NATS JetStream: {missing or '--skip-nats'}", file=sys.stderr)
            figures["nats"] = None
        else:
            print("NATS JetStream:", file=sys.stderr, flush=True)
            figures["nats_client"] = "nats-py js.publish with acks + push consumer acking each"
            figures["nats"] = await nats_side(work, rates, seconds)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 s per rate instead of 10 s")
    parser.add_argument("--seconds", type=float, default=None, help="measured seconds per rate")
    parser.add_argument("--rates", type=int, nargs="*", default=None)
    parser.add_argument("--linger-ms", type=float, default=0.0)
    parser.add_argument("--skip-nats", action="store_true")
    parser.add_argument("--skip-laminar", action="store_true")
    result = uvloop.run(main(parser.parse_args()))
    print(json.dumps(result))
    os._exit(0)
