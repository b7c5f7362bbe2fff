"""A topic read as a queue: messages acked per second, beside NATS JetStream in the same run.

Both sides: 3 servers on this machine, one replicated-3 stream of 100-byte messages written
beforehand, then 8 member processes taking messages and acking every one of them individually
(the client batches acks on the wire); the figure is messages acked per second, from the first
message taken to the last ack.

* laminar: a 3-node cluster, one RF 3 partition, `laminar.client.ShareConsumer` members of
  one share group (`msg.ack()` for every message);
* NATS JetStream (Debian's `nats-server`, three servers clustered with `-js`): an R3
  file-storage stream and one durable pull consumer with explicit acks shared by the 8
  members, driven through `nats-py` (`fetch` batches, `msg.ack()` for every message). Skipped
  with a message if `nats-server` or `nats-py` is absent (this bench installs nothing).

Besides throughput, each side's CPU time per 1,000 messages, of its servers and of its
members, over the same first-take-to-last-ack window: on a machine shared with other work,
throughput swings with the neighbours' load while CPU per message stays put (``cpu_ratio``
compares the two sides' totals). ``--batch`` is both sides' fetch size (laminar
``max_records``, the NATS fetch batch).

The last line is one JSON object with both figures and their ratio.

    python bench/queue_bench.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nats_cluster import add_r3_stream, nats_available, nats_cluster
from proc_cpu import cpu_seconds

from laminar.client import Admin, ShareConsumer
from laminar.client.connection import Connection
from laminar.client.localcluster import LocalCluster, free_port_pairs
from laminar.segment.batch import build_batch

MEMBERS = 8
TOPIC = "jobs"
PAYLOAD = b"x" * 100
SUBJECT = "jobs"


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def spawn_members(*args: str) -> list[subprocess.Popen[str]]:
    """``MEMBERS`` workers, started together once every one has imported its client (eight
    interpreters starting on a small machine take longer than a quick run's messages); each
    counts its CPU time from the start signal."""
    procs = [spawn(*args) for _ in range(MEMBERS)]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return procs


def measure(args: list[str], servers: list[int], timeout: float) -> dict[str, Any]:
    """Run the members: messages acked per second over all of them (first take to last ack),
    their count, and the CPU time per 1,000 messages of the servers (``servers``: pids) and of
    the members over that same window (the steadier figures on a busy machine; start-up and
    the idle wait at the end are left out on both sides)."""
    samples: list[tuple[float, float]] = []  # (wall time, servers' CPU seconds)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.time(), cpu_seconds(servers)))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    procs = spawn_members(*args)
    sampler.start()
    results = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        done.set()
        sampler.join()
    busy = [r for r in results if r["acked"]]
    count = sum(r["acked"] for r in busy)
    first = min(r["first"] for r in busy)
    last = max(r["last"] for r in busy)
    before = [cpu for at, cpu in samples if at <= first] or [samples[0][1]]
    after = [cpu for at, cpu in samples if at >= last] or [samples[-1][1]]
    server_cpu = after[0] - before[-1]
    member_cpu = sum(r["cpu_last"] - r["cpu_first"] for r in busy)
    return {
        "acked": count,
        "per_s": count / (last - first),
        "server_cpu_ms_per_1k": round(server_cpu * 1e6 / count, 1),
        "member_cpu_ms_per_1k": round(member_cpu * 1e6 / count, 1),
    }


# --------------------------------------------------------------------------- laminar


async def laminar_worker(bootstrap: str, batch: int) -> None:
    acked = 0
    first = last = cpu_first = cpu_last = 0.0
    chunks: list[tuple[int, Any]] = []  # (count, gathered acks of one fetch), oldest first
    unconfirmed = 0

    def confirmed(_future: Any) -> None:
        # When an ack's confirmation arrived, not when this loop got round to it (it only
        # collects the last ones after 1.5 s without messages).
        nonlocal last, cpu_last
        last, cpu_last = time.time(), time.process_time()

    async with ShareConsumer(
        bootstrap, "bench", TOPIC, from_earliest=True, max_records=batch, max_wait_ms=200
    ) as consumer:
        idle_since = time.monotonic()
        while True:
            messages = await consumer.fetch(timeout_ms=200)
            if not messages:
                if acked + unconfirmed and time.monotonic() - idle_since > 1.5:
                    break
                if not acked + unconfirmed and time.monotonic() - idle_since > 10:
                    break
                continue
            if not first:
                first, cpu_first = time.time(), time.process_time()
            chunk = asyncio.gather(*(message.ack() for message in messages))
            chunk.add_done_callback(confirmed)
            chunks.append((len(messages), chunk))
            unconfirmed += len(messages)
            while unconfirmed >= 500:  # at most ~500 acks awaiting confirmation
                count, oldest = chunks.pop(0)
                await oldest
                unconfirmed -= count
                acked += count
            idle_since = time.monotonic()
        for count, chunk in chunks:
            await chunk
            acked += count
    report_member(acked, first, last, cpu_first, cpu_last)


def report_member(acked: int, first: float, last: float, cpu_first: float, cpu_last: float) -> None:
    """A member's last line: what it acked, over which wall-clock and CPU span (both sides)."""
    report = dict(acked=acked, first=first, last=last, cpu_first=cpu_first, cpu_last=cpu_last)
    print(json.dumps(report), flush=True)


async def laminar_side(work: Path, total: int, batch: int) -> dict[str, Any]:
    cluster = LocalCluster(work / "laminar", free_port_pairs(3), log_level="warning")
    cluster.start()
    try:
        await cluster.wait_ready(60)
        bootstrap = cluster.bootstrap
        async with Admin(bootstrap) as admin:
            await admin.create_topic(TOPIC, partitions=1, replication_factor=3)
            while not (leader := (await admin.describe_topic(TOPIC)).partitions[0].leader):
                await asyncio.sleep(0.1)
            address = (await admin.cluster.refresh_metadata()).brokers[leader]
        await write_laminar(address, total)
        pids = [node.pid for node in cluster.nodes.values() if node.pid is not None]
        figures = measure(["laminar", bootstrap, str(batch)], pids, 600)
        assert figures["acked"] == total, f"laminar acked {figures['acked']} of {total}"
        return figures
    finally:
        cluster.stop()


async def write_laminar(address: str, total: int) -> None:
    """Pre-built batches of 100 records, pipelined (the queue is what is measured)."""
    batch = build_batch([(None, PAYLOAD, (), int(time.time() * 1000))] * 100)
    connection = await Connection.open(address)

    def fill(body: Any) -> None:
        request = body.init("produce")
        request.acks = -1
        request.timeoutMs = 30_000
        ref = request.init("batches", 1)[0]
        ref.topic, ref.partition = TOPIC, 0
        ref.payloadOffset, ref.payloadLength = 0, len(batch)

    for start in range(0, total // 100, 50):
        await asyncio.gather(
            *(connection.request(fill, [batch]) for _ in range(min(50, total // 100 - start)))
        )
    connection.close()


# --------------------------------------------------------------------------- NATS


async def nats_worker(urls: str, batch: int) -> None:
    import nats

    client = await nats.connect(urls.split(","))
    js = client.jetstream()
    sub = await js.pull_subscribe(SUBJECT, durable="bench", stream="JOBS")
    acked = 0
    first = last = cpu_first = cpu_last = 0.0
    idle_since = time.monotonic()
    while True:
        try:
            messages = await sub.fetch(batch, timeout=0.2)
        except (nats.errors.TimeoutError, TimeoutError):
            messages = []
        if not messages:
            if acked and time.monotonic() - idle_since > 1.5:
                break
            if not acked and time.monotonic() - idle_since > 10:
                break
            continue
        if not first:
            first, cpu_first = time.time(), time.process_time()
        for message in messages:
            await message.ack()
        acked += len(messages)
        last, cpu_last = time.time(), time.process_time()
        idle_since = time.monotonic()
    await client.flush()
    await client.close()
    report_member(acked, first, last, cpu_first, cpu_last)


async def nats_side(work: Path, total: int, batch: int) -> dict[str, Any]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    async with nats_cluster(work) as (urls, pids):
        client = await nats.connect(urls)
        js = client.jetstream()
        await add_r3_stream(js, "JOBS", SUBJECT)
        await js.add_consumer(
            "JOBS",
            ConsumerConfig(
                durable_name="bench", ack_policy=AckPolicy.EXPLICIT, max_ack_pending=20_000
            ),
        )
        for start in range(0, total, 2000):
            await asyncio.gather(
                *(js.publish(SUBJECT, PAYLOAD) for _ in range(min(2000, total - start)))
            )
        await client.close()
        figures = measure(["nats", ",".join(urls), str(batch)], pids, 600)
        assert figures["acked"] >= total, f"NATS acked {figures['acked']} of {total}"
        return figures


async def main(args: argparse.Namespace) -> dict[str, Any]:
    total = args.messages or (20_000 if args.quick else 100_000)
    figures: dict[str, Any] = {
        "messages": total,
        "members": MEMBERS,
        "message_bytes": len(PAYLOAD),
        "batch": args.batch,
        "laminar_client": "laminar.client.ShareConsumer, one process per member",
    }
    laminar_runs: list[dict[str, Any]] = []
    nats_runs: list[dict[str, Any]] = []
    missing = nats_available()
    if missing is not None and args.only != "laminar":
        print(f"skipping NATS JetStream: {missing}", file=sys.stderr)
        figures["nats_acked_per_s"] = None
    with tempfile.TemporaryDirectory(prefix="queue-bench-") as tmp:
        # Rounds alternate the sides, so a burst of other work on the machine falls on both.
        for round_ in range(args.rounds):
            work = Path(tmp) / f"round-{round_}"
            work.mkdir()
            if args.only != "nats":
                laminar_runs.append(await laminar_side(work, total, args.batch))
            if args.only != "laminar" and missing is None:
                nats_runs.append(await nats_side(work, total, args.batch))
    laminar = _medians(laminar_runs)
    nats = _medians(nats_runs)
    if laminar is not None:
        figures["laminar_acked_per_s"] = round(laminar["per_s"])
        figures["laminar_node_cpu_ms_per_1k"] = laminar["server_cpu_ms_per_1k"]
        figures["laminar_member_cpu_ms_per_1k"] = laminar["member_cpu_ms_per_1k"]
    if nats is not None:
        figures["nats_client"] = "nats-py pull consumer, one process per member"
        figures["nats_acked_per_s"] = round(nats["per_s"])
        figures["nats_server_cpu_ms_per_1k"] = nats["server_cpu_ms_per_1k"]
        figures["nats_member_cpu_ms_per_1k"] = nats["member_cpu_ms_per_1k"]
    if laminar is not None and nats is not None:
        figures["ratio"] = round(laminar["per_s"] / nats["per_s"], 2)
        # CPU per message, servers and members together: how much work each side does
        # for the same messages, whatever else the machine is running.
        figures["cpu_ratio"] = round(
            (nats["server_cpu_ms_per_1k"] + nats["member_cpu_ms_per_1k"])
            / (laminar["server_cpu_ms_per_1k"] + laminar["member_cpu_ms_per_1k"]),
            2,
        )
        if args.rounds > 1:
            figures["rounds"] = args.rounds
            pairs = zip(laminar_runs, nats_runs, strict=True)
            figures["ratio_per_round"] = [round(a["per_s"] / b["per_s"], 2) for a, b in pairs]
    return figures


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Each figure's median over the rounds (None: the side did not run)."""
    if not runs:
        return None
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def worker(argv: list[str]) -> None:
    kind, address, batch = argv
    if kind == "nats":
        import nats  # noqa: F401 - imported before the start line, like laminar's client
    print("ready", flush=True)
    sys.stdin.readline()
    if kind == "laminar":
        uvloop.run(laminar_worker(address, int(batch)))
    else:
        uvloop.run(nats_worker(address, int(batch)))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2:])
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 messages instead of 100,000")
    parser.add_argument("--messages", type=int, default=0, help="this many messages instead")
    parser.add_argument(
        "--batch",
        type=int,
        default=200,
        help="most messages one fetch takes, both sides (laminar max_records, NATS fetch batch)",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="alternate the sides this often; report medians"
    )
    parser.add_argument("--only", choices=["laminar", "nats"], help="run one side only")
    result = uvloop.run(main(parser.parse_args()))
    print(json.dumps(result))
    os._exit(0)
