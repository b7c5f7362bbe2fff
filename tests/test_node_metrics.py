"""Metrics and health over HTTP (``--metrics-listen``) on real node processes, plus the
health summary at the top of `laminar cluster status`.

One 3-node cluster: /readyz refuses while node 1 runs alone (no metadata leader), /healthz
answers all along; once all three run, every node is ready; records produced and consumed show
up per topic, with bytes and latency histograms; no partition is leaderless or
under-replicated; killing a follower of the RF-3 topic makes its leader report the partition
under-replicated. Every scrape is parsed with prometheus_client's own parser.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from laminar.cli import render_status
from laminar.cli_health import leaderless, under_replicated
from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.client.descriptions import (
    ClusterStatus,
    MemberStatus,
    PartitionDescription,
    PartitionStatus,
    ReplicaStatus,
    TopicDescription,
)
from laminar.client.localcluster import LocalCluster, free_port_pairs
from laminar.stats import Buckets
from tests.single_node import SingleNode, create_topic, free_port

TOPIC = "metered"
RECORDS = 300
WAIT_S = 30.0

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def http_get(address: str, path: str, method: str = "GET") -> tuple[int, str]:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


async def scrape(address: str) -> Samples:
    """Every sample of /metrics, parsed by prometheus_client (which rejects bad text)."""
    status, text = await http_get(address, "/metrics")
    assert status == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def dashboard_metrics() -> set[str]:
    path = Path(__file__).resolve().parent.parent / "examples" / "grafana-dashboard.json"
    exprs = [t["expr"] for p in json.loads(path.read_text())["panels"] for t in p["targets"]]
    return {name for expr in exprs for name in re.findall(r"laminar_[a-z_]+", expr)}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting until {what}")


async def test_metrics_and_health_of_a_cluster(tmp_path: Path) -> None:
    metrics_ports = [client for client, _ in free_port_pairs(3)]
    cluster = LocalCluster(tmp_path, free_port_pairs(3), metrics_ports=metrics_ports)
    http = {n: node.metrics_address for n, node in cluster.nodes.items()}
    try:
        cluster.start_node(1)

        async def answers_health() -> bool:
            try:
                return (await http_get(http[1], "/healthz"))[0] == 200
            except OSError:
                return False

        await eventually(answers_health, "node 1 answers /healthz")
        code, body = await http_get(http[1], "/readyz")
        assert code == 503 and "metadata" in body, body  # alone: no metadata leader
        assert (await http_get(http[1], "/nowhere"))[0] == 404

        cluster.start_node(2)
        cluster.start_node(3)
        await cluster.wait_ready(60)

        async def all_ready() -> bool:
            return all([(await http_get(a, "/readyz"))[0] == 200 for a in http.values()])

        await eventually(all_ready, "every node is ready")

        async with Admin(cluster.bootstrap) as admin:
            await admin.create_topic(TOPIC, partitions=1, replication_factor=3)
            for _ in range(100):
                (part,) = (await admin.describe_topic(TOPIC)).partitions
                if part.leader:
                    break
                await asyncio.sleep(0.1)
        async with Producer(cluster.bootstrap, acks="all", linger_ms=5) as producer:
            sent = [producer.send(TOPIC, b"v%05d" % i) for i in range(RECORDS)]
            await asyncio.gather(*[await future for future in sent])
        consumed = 0
        async with Consumer(cluster.bootstrap) as consumer:
            await consumer.assign([TopicPartition(TOPIC, 0)])
            await consumer.seek_to_beginning()
            while consumed < RECORDS:
                consumed += len(await consumer.getmany(timeout_ms=1000))
        assert consumed == RECORDS

        async with Admin(cluster.bootstrap) as admin:
            (part,) = (await admin.describe_topic(TOPIC)).partitions
        leader = part.leader
        scraped = {n: await scrape(a) for n, a in http.items()}
        produced = sum(
            value(s, "laminar_produced_records_total", topic=TOPIC) for s in scraped.values()
        )
        assert produced == RECORDS
        assert value(scraped[leader], "laminar_produced_bytes_total", topic=TOPIC) > RECORDS * 6
        fetched = sum(
            value(s, "laminar_fetched_records_total", topic=TOPIC) for s in scraped.values()
        )
        assert fetched >= RECORDS
        assert sum(value(s, "laminar_fetched_bytes_total", topic=TOPIC) for s in scraped.values())
        lead = scraped[leader]
        assert value(lead, "laminar_produce_latency_seconds_count", acks="all") >= 1
        assert value(lead, "laminar_produce_latency_seconds_bucket", acks="all", le="+Inf") >= 1
        assert value(lead, "laminar_leaders", topic=TOPIC) == 1
        assert value(lead, "laminar_log_end_offset", topic=TOPIC) >= RECORDS
        assert value(lead, "laminar_metadata_log_end_offset") > 0  # the topic's creation at least
        assert value(lead, "laminar_metadata_log_checkpoint_offset") == -1  # none due yet
        assert value(lead, "laminar_fdatasync_seconds_count") > 0
        assert value(lead, "laminar_group_commit_logs_count") > 0
        assert value(lead, "laminar_log_open_files") >= 2  # the metadata log's, the topic's
        assert value(lead, "laminar_log_file_evictions_total") == 0  # far below the budget
        assert value(lead, "laminar_raft_term", topic=TOPIC) >= 1
        assert value(lead, "laminar_swim_members", state="alive") == 3
        assert value(lead, "laminar_connections", port="peer") == 2
        assert value(lead, "laminar_event_loop_lag_seconds_count") > 0
        assert lead[("laminar_produce_batches_in_flight", ())] == 0  # every write settled
        _, text = await http_get(http[leader], "/metrics")
        families = list(text_string_to_metric_families(text))
        known = {f.name for f in families} | {s.name for f in families for s in f.samples}
        for suffix in ("_bucket", "_count", "_sum", "_total"):
            known |= {f"{f.name}{suffix}" for f in families}
        assert dashboard_metrics() <= known, dashboard_metrics() - known
        for samples in scraped.values():
            assert value(samples, "laminar_partitions_leaderless", topic=TOPIC) == 0
            assert ("laminar_partitions_leaderless", (("topic", TOPIC),)) in samples
            assert value(samples, "laminar_replicas", topic=TOPIC) == 1

        async with Admin(cluster.bootstrap) as admin:
            await admin.commit_offsets("readers", {TopicPartition(TOPIC, 0): 100})

        async def lag_reported() -> bool:
            lags = []
            for address in http.values():
                samples = await scrape(address)
                lag = value(samples, "laminar_consumer_group_lag", group="readers", topic=TOPIC)
                if lag:  # high watermark: the records, plus a leader's no-op entry or two
                    high = value(samples, "laminar_log_high_watermark", topic=TOPIC)
                    assert lag == high - 100 and high >= RECORDS
                lags.append(lag)
            return len([lag for lag in lags if lag]) == 1  # by the group's coordinator alone

        await eventually(lag_reported, "the group's coordinator reports its lag")

        async def fully_replicated() -> bool:
            samples = await scrape(http[leader])
            return value(samples, "laminar_partitions_under_replicated", topic=TOPIC) == 0

        await eventually(fully_replicated, "the partition is fully replicated")

        async def all_quiet() -> bool:  # idle groups quiesce: no node ticks any
            scraped = [await scrape(address) for address in http.values()]
            assert all(("laminar_raft_groups_awake", ()) in samples for samples in scraped)
            return [value(samples, "laminar_raft_groups_awake") for samples in scraped] == [0] * 3

        await eventually(all_quiet, "every idle Raft group goes quiet")

        follower = next(n for n in (1, 2, 3) if n != leader)
        cluster.kill_node(follower)

        async def under_replicated_reported() -> bool:
            samples = await scrape(http[leader])
            return value(samples, "laminar_partitions_under_replicated", topic=TOPIC) == 1

        await eventually(under_replicated_reported, "the leader reports it under-replicated")
        samples = await scrape(http[leader])
        assert value(samples, "laminar_partitions_leaderless", topic=TOPIC) == 0
        assert value(samples, "laminar_connections", port="peer") == 1
    finally:
        cluster.stop()


# `laminar cluster status`: what needs attention comes first -------------------------------


def _status() -> tuple[ClusterStatus, list[TopicDescription]]:
    members = tuple(
        MemberStatus(n, f"127.0.0.1:{9000 + n}", state, 1, True, 2, 1)
        for n, state in ((1, "alive"), (2, "alive"), (3, "dead"))
    )
    healthy = PartitionStatus(
        "a", 0, 1, 2, 0, 10, 10, tuple(ReplicaStatus(n, 9, 0) for n in (1, 2))
    )
    lagging = PartitionStatus(
        "b", 0, 2, 3, 0, 10, 10, tuple(ReplicaStatus(n, 9, 0) for n in (2, 3))
    )
    status = ClusterStatus(members, (healthy, lagging), metadata_leader=1)
    topics = [
        TopicDescription("a", 1, (PartitionDescription(0, 1, (1, 2)),), 2, None, None, None, None),
        TopicDescription(
            "b",
            2,
            (PartitionDescription(0, 2, (2, 3)), PartitionDescription(1, 3, (3, 1))),
            2,
            None,
            None,
            None,
            None,
        ),
    ]
    return status, topics


def test_status_lists_under_replicated_and_leaderless_first() -> None:
    status, topics = _status()
    (under,) = under_replicated(status, topics)
    assert (under.topic, under.partition, under.out_of_sync) == ("b", 0, ((3, "dead"),))
    (orphan,) = leaderless(status, topics)
    assert (orphan.topic, orphan.partition, orphan.recorded_leader) == ("b", 1, 3)
    shown = render_status(status, topics)
    assert shown.startswith("under-replicated partitions: 1, leaderless partitions: 1")
    assert shown.index("leaderless partitions (1)") < shown.index("members (3")
    assert shown.index("under-replicated partitions (1)") < shown.index("members (3")
    assert "partitions (2)" in shown  # the full list is still there
    plain = render_status(status)  # without topic descriptions: no leaderless count
    assert plain.startswith("under-replicated partitions: 1\n")


def test_buckets_are_cumulative_like_prometheus() -> None:
    buckets = Buckets((0.001, 0.01))
    for seconds in (0.0005, 0.001, 0.005, 2.0):
        buckets.observe(seconds)
    assert buckets.cumulative() == [("0.001", 2), ("0.01", 3), ("+Inf", 4)]
    assert buckets.count == 4
    assert abs(buckets.sum - 2.0065) < 1e-9


async def test_readyz_while_a_replica_is_repaired(tmp_path: Path) -> None:
    """A replica taken offline by a storage fault makes the node unready until it is
    reopened (in-process node: the fault is injected where the runtime reports one). With
    --metrics-per-partition the log metrics carry the partition."""
    address = f"127.0.0.1:{free_port()}"
    single = SingleNode(tmp_path, metrics_listen=address, metrics_per_partition=True)
    node = await single.start()
    try:
        await create_topic(single.bootstrap, "repaired", 1)

        async def ready() -> bool:
            return (await http_get(address, "/readyz"))[0] == 200

        await eventually(ready, "the node is ready")
        assert await http_get(address, "/healthz", "HEAD") == (200, "")
        assert (await http_get(address, "/metrics", "POST"))[0] == 405
        samples = await scrape(address)
        labels = {"topic": "repaired", "partition": "0"}
        assert ("laminar_log_end_offset", tuple(sorted(labels.items()))) in samples
        assert value(samples, "laminar_raft_term", **labels) >= 1
        assert ("laminar_log_end_offset", (("topic", "repaired"),)) not in samples
        replica = node.replica_for("repaired", 0)
        assert replica is not None
        node.runtime.fail(replica, OSError("injected fault"))
        code, body = await http_get(address, "/readyz")
        assert code == 503 and "repaired/0 under repair" in body, body
        assert value(await scrape(address), "laminar_replicas_offline") == 1
        await eventually(ready, "the replica is reopened and the node ready again")
        assert value(await scrape(address), "laminar_replicas_offline") == 0
    finally:
        await node.stop()
