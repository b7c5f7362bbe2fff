"""Prometheus metrics of one node, collected when ``/metrics`` is scraped.

Hot paths only bump plain integers (``RequestStats``) or ``laminar.stats.Buckets``; everything
else (terms, leaders, offsets, lag, gossip states) is read from the node's own state at scrape
time by ``NodeCollector``, on the event loop, so nothing here runs between scrapes except the
event-loop lag probe. Label sets stay bounded: per topic (and request kind, acks mode, gossip
state, consumer group), per partition only with ``--metrics-per-partition``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from laminar.membership.state import MemberState
from laminar.node.health import out_of_sync
from laminar.node.metadata import METADATA_GROUP, group_id
from laminar.stats import Buckets

if TYPE_CHECKING:
    from laminar.groups.service import GroupService
    from laminar.membership.driver import SwimDriver
    from laminar.node.admission import ProduceAdmission
    from laminar.node.metadata import MetadataState
    from laminar.node.replica import Replica
    from laminar.node.runtime import MultiRaft
    from laminar.segment.descriptors import DescriptorCache

ACKS_NAMES = {-1: "all", 1: "leader", 0: "none"}


class RequestStats:
    """Counters the client server bumps per request and per batch (plain ints, no locks)."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.produce_latency = {acks: Buckets() for acks in ACKS_NAMES}
        self.fetch_latency = Buckets()
        self.produced: dict[str, list[int]] = {}
        """topic -> [records, bytes] accepted by this node as leader."""
        self.fetched: dict[str, list[int]] = {}
        """topic -> [offsets, bytes] served by this node."""
        self.leadership_changes: dict[str, int] = {}

    def served(self, which: str, started: float, acks: int | None = None) -> None:
        """One client request answered (or failed); times produce (by ``acks``) and fetch."""
        requests = self.requests
        requests[which] = requests.get(which, 0) + 1
        if which == "fetch":
            self.fetch_latency.observe(time.perf_counter() - started)
        elif acks is not None:
            latency = self.produce_latency.get(acks)
            if latency is not None:
                latency.observe(time.perf_counter() - started)

    def produce(self, topic: str, records: int, size: int) -> None:
        row = self.produced.get(topic)
        if row is None:
            row = self.produced[topic] = [0, 0]
        row[0] += records
        row[1] += size

    def fetch(self, topic: str, offsets: int, size: int) -> None:
        row = self.fetched.get(topic)
        if row is None:
            row = self.fetched[topic] = [0, 0]
        row[0] += offsets
        row[1] += size

    def leader_changed(self, topic: str) -> None:
        self.leadership_changes[topic] = self.leadership_changes.get(topic, 0) + 1


class LoopLag:
    """How late the event loop wakes a sleeper: the delay every callback suffers right now."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.buckets = Buckets()
        self.last = 0.0

    async def run(self) -> None:
        clock = time.perf_counter  # uvloop's loop.time() ticks in whole milliseconds
        while True:
            due = clock() + self.interval
            await asyncio.sleep(self.interval)
            self.last = max(0.0, clock() - due)
            self.buckets.observe(self.last)


@dataclass(slots=True)
class Sources:
    """What the collector reads: the node's parts, each behind the narrowest handle."""

    node_id: int
    runtime: MultiRaft
    state: MetadataState
    requests: RequestStats
    swim: SwimDriver
    groups: GroupService
    live_nodes: Callable[[], Iterable[int]]
    connected_peers: Callable[[], Iterable[int]]
    client_connections: Callable[[], int]
    offline_replicas: Callable[[], int]
    lost_state_replicas: Callable[[], int]
    loop_lag: LoopLag
    per_partition: bool = False
    metadata_log: Callable[[], list[dict[str, Any]]] = list
    """This node's metadata log row (``status.metadata_log``): start, end, checkpoint."""
    descriptors: DescriptorCache | None = None
    """The node's budget of open log files (``segment/descriptors.py``)."""
    admission: ProduceAdmission | None = None
    """The node's bound on produce batches in flight (``admission.py``)."""


class NodeCollector(Collector):
    """Builds every metric family from ``Sources`` at scrape time."""

    def __init__(self, sources: Sources) -> None:
        self.s = sources
        self._elections: dict[str, int] = {}
        self._pre_votes: dict[str, int] = {}
        self._seen_elections: dict[int, tuple[object, int, int]] = {}

    def collect(self) -> Iterator[Metric]:
        yield from self._requests()
        yield from self._storage()
        yield from self._raft()
        yield from self._logs()
        yield from self._metadata_log()
        yield from self._group_lag()
        yield from self._gossip()
        yield from self._process()

    # requests ------------------------------------------------------------------------------
    def _requests(self) -> Iterator[Metric]:
        stats = self.s.requests
        requests = CounterMetricFamily(
            "laminar_client_requests", "Client requests served, by kind.", labels=["kind"]
        )
        for kind, count in sorted(stats.requests.items()):
            requests.add_metric([kind], count)
        yield requests
        produce = HistogramMetricFamily(
            "laminar_produce_latency_seconds",
            "Produce request latency on this node (receipt to reply), by acks mode.",
            labels=["acks"],
        )
        for acks, buckets in stats.produce_latency.items():
            if acks == -1 or buckets.sum:  # modes never used cost no series (19 lines each)
                produce.add_metric([ACKS_NAMES[acks]], buckets.cumulative(), buckets.sum)
        yield produce
        yield _histogram(
            "laminar_fetch_latency_seconds",
            "Fetch request latency on this node, long-poll wait included.",
            stats.fetch_latency,
        )
        for direction, rows, unit in (
            ("produced", stats.produced, "records"),
            ("fetched", stats.fetched, "offsets"),
        ):
            what = "accepted as leader" if direction == "produced" else "served to consumers"
            records = CounterMetricFamily(
                f"laminar_{direction}_records",
                f"Records {what} ({unit}), per topic.",
                labels=["topic"],
            )
            size = CounterMetricFamily(
                f"laminar_{direction}_bytes",
                f"Record batch bytes {what}, per topic.",
                labels=["topic"],
            )
            for topic, (count, nbytes) in sorted(rows.items()):
                records.add_metric([topic], count)
                size.add_metric([topic], nbytes)
            yield records
            yield size

    # storage -------------------------------------------------------------------------------
    def _storage(self) -> Iterator[Metric]:
        runtime = self.s.runtime
        yield _histogram(
            "laminar_fdatasync_seconds",
            "Duration of one log's flush (one fdatasync) in the group commit.",
            runtime.fsync_seconds,
        )
        yield _histogram(
            "laminar_group_commit_seconds",
            "Duration of one group-commit pass (every dirty log and hard state made durable).",
            runtime.commit_seconds,
        )
        yield _histogram(
            "laminar_group_commit_logs",
            "Logs made durable by one group-commit pass (its batch size).",
            runtime.commit_logs,
        )
        files = self.s.descriptors
        if files is not None:
            yield GaugeMetricFamily(
                "laminar_log_open_files",
                "Segment data files the hosted logs hold open (the budget is "
                "--max-open-log-files).",
                value=files.open_files,
            )
            yield CounterMetricFamily(
                "laminar_log_file_evictions",
                "Segment data files closed to stay within the node's budget of open files "
                "(each reopened when next used).",
                value=files.evictions,
            )

    # raft ----------------------------------------------------------------------------------
    def _raft(self) -> Iterator[Metric]:
        s = self.s
        node_id = s.node_id
        connected = set(s.connected_peers())
        live = set(s.live_nodes())
        replicas = list(s.runtime.replicas.values())
        self._count_elections(replicas)
        per_part = s.per_partition
        part_labels = ["topic", "partition"] if per_part else ["topic"]
        term = GaugeMetricFamily(
            "laminar_raft_term",
            "Raft term of the hosted replicas (highest per topic unless per partition).",
            labels=part_labels,
        )
        hosted = GaugeMetricFamily(
            "laminar_replicas", "Replicas hosted by this node, per topic.", labels=["topic"]
        )
        leaders = GaugeMetricFamily(
            "laminar_leaders", "Partitions this node leads, per topic.", labels=["topic"]
        )
        under = GaugeMetricFamily(
            "laminar_partitions_under_replicated",
            "Partitions this node leads with a replica not in sync (not connected, not "
            "streaming, not sent every committed entry, or a move's learner); sum over nodes.",
            labels=["topic"],
        )
        terms: dict[tuple[str, ...], int] = {}
        counts: dict[str, list[int]] = {}
        for replica in replicas:
            topic = replica.topic
            row = counts.setdefault(topic, [0, 0, 0])
            row[0] += 1
            key = (topic, str(replica.partition)) if per_part else (topic,)
            terms[key] = max(terms.get(key, 0), replica.raft.term)
            if replica.is_leader and not replica.closed:
                row[1] += 1
                if replica.group != METADATA_GROUP and out_of_sync(replica, node_id, connected):
                    row[2] += 1
        for key, value in sorted(terms.items()):
            term.add_metric(list(key), value)
        for topic, (count, led, lagging) in sorted(counts.items()):
            hosted.add_metric([topic], count)
            leaders.add_metric([topic], led)
            under.add_metric([topic], lagging)
        yield from (term, hosted, leaders, under)
        yield GaugeMetricFamily(
            "laminar_raft_groups_awake",
            "Raft groups this node ticks now (not quiesced); quiet ones cost nothing.",
            value=s.runtime.awake,
        )
        leaderless = GaugeMetricFamily(
            "laminar_partitions_leaderless",
            "Partitions with no live leader, as this node sees the whole cluster (every node "
            "reports the cluster's count: take max over nodes).",
            labels=["topic"],
        )
        by_group = s.runtime.replicas
        for topic in sorted(s.state.topics.values(), key=lambda t: t.name):
            missing = 0
            for index, assignment in enumerate(topic.partitions):
                if assignment.state == "retired":
                    continue  # a key-range partition retention emptied: it has no group
                replica = by_group.get(group_id(topic.topic_id, index))
                leader = replica.raft.leader_id if replica is not None else assignment.leader
                if leader == 0 or leader not in live:
                    missing += 1
            leaderless.add_metric([topic.name], missing)
        yield leaderless
        elections = CounterMetricFamily(
            "laminar_raft_elections",
            "Elections started by this node's replicas (pre-votes not counted), per topic.",
            labels=["topic"],
        )
        for topic, count in sorted(self._elections.items()):
            elections.add_metric([topic], count)
        yield elections
        pre_votes = CounterMetricFamily(
            "laminar_raft_pre_votes",
            "Pre-vote rounds started by this node's replicas, per topic: a replica that hears "
            "from no leader campaigns with one.",
            labels=["topic"],
        )
        for topic, count in sorted(self._pre_votes.items()):
            pre_votes.add_metric([topic], count)
        yield pre_votes
        changes = CounterMetricFamily(
            "laminar_raft_leadership_changes",
            "Times a replica on this node became or stopped being leader, per topic.",
            labels=["topic"],
        )
        for topic, count in sorted(s.requests.leadership_changes.items()):
            changes.add_metric([topic], count)
        yield changes
        yield GaugeMetricFamily(
            "laminar_replicas_offline",
            "Replicas of this node offline after a storage fault (being repaired).",
            value=s.offline_replicas(),
        )
        yield GaugeMetricFamily(
            "laminar_replicas_lost_state",
            "Replicas of this node that lost state and await re-admission (not voting).",
            value=s.lost_state_replicas(),
        )

    def _count_elections(self, replicas: list[Replica]) -> None:
        """Fold each core's election and pre-vote counters into per-topic totals that never
        go back, even when a replica is closed or reopened (a new core starts from zero)."""
        seen = self._seen_elections
        for replica in replicas:
            raft = replica.raft
            previous = seen.get(replica.group)
            elections, pre_votes = (
                (0, 0) if previous is None or previous[0] is not raft else previous[1:]
            )
            topic = replica.topic
            if raft.elections != elections:
                self._elections[topic] = self._elections.get(topic, 0) + raft.elections - elections
            if raft.pre_votes != pre_votes:
                self._pre_votes[topic] = self._pre_votes.get(topic, 0) + raft.pre_votes - pre_votes
            seen[replica.group] = (raft, raft.elections, raft.pre_votes)
        if len(seen) > len(replicas):
            current = {r.group for r in replicas}
            for group in [g for g in seen if g not in current]:
                del seen[group]

    # logs ----------------------------------------------------------------------------------
    def _logs(self) -> Iterator[Metric]:
        per_part = self.s.per_partition
        labels = ["topic", "partition"] if per_part else ["topic"]
        scope = "per partition" if per_part else "summed over the topic's replicas here"
        start = GaugeMetricFamily(
            "laminar_log_start_offset", f"First offset held, {scope}.", labels=labels
        )
        end = GaugeMetricFamily(
            "laminar_log_end_offset", f"Offset after the last record held, {scope}.", labels=labels
        )
        high = GaugeMetricFamily(
            "laminar_log_high_watermark", f"Committed offsets readable, {scope}.", labels=labels
        )
        size = GaugeMetricFamily("laminar_log_size_bytes", f"Log bytes, {scope}.", labels=labels)
        rows: dict[tuple[str, ...], list[int]] = {}
        for replica in list(self.s.runtime.replicas.values()):
            if replica.closed or replica.group == METADATA_GROUP:
                continue
            key = (replica.topic, str(replica.partition)) if per_part else (replica.topic,)
            row = rows.setdefault(key, [0, 0, 0, 0])
            log = replica.log
            row[0] += log.start_offset
            row[1] += log.end_offset
            row[2] += replica.high_watermark
            row[3] += log.size_bytes
        for key, (first, last, committed, nbytes) in sorted(rows.items()):
            start.add_metric(list(key), first)
            end.add_metric(list(key), last)
            high.add_metric(list(key), committed)
            size.add_metric(list(key), nbytes)
        yield from (start, end, high, size)

    def _metadata_log(self) -> Iterator[Metric]:
        rows = self.s.metadata_log()
        for field_name, name, documentation in (
            ("start_offset", "start_offset", "First offset of this node's metadata log (a "
             "checkpoint once cut)."),
            ("end_offset", "end_offset", "Offset after the last entry of the metadata log."),
            ("checkpoint", "checkpoint_offset", "Offset of the newest metadata checkpoint "
             "applied here (-1: none)."),
            ("size_bytes", "size_bytes", "Bytes of this node's metadata log."),
        ):  # fmt: skip
            yield GaugeMetricFamily(
                f"laminar_metadata_log_{name}",
                documentation,
                value=rows[0][field_name] if rows else 0,
            )

    def _group_lag(self) -> Iterator[Metric]:
        """Committed offset vs high watermark for the groups this node coordinates, over the
        partitions it hosts (a partition hosted elsewhere has no local high watermark)."""
        per_part = self.s.per_partition
        labels = ["group", "topic", "partition"] if per_part else ["group", "topic"]
        lag = GaugeMetricFamily(
            "laminar_consumer_group_lag",
            "Records between a consumer group's committed offset and the high watermark "
            "(groups this node coordinates, partitions it hosts).",
            labels=labels,
        )
        runtime = self.s.runtime
        state = self.s.state
        totals: dict[tuple[str, ...], int] = {}
        for coordinator in self.s.groups.coordinators():
            for name, group in coordinator.state.groups.items():
                for (topic_name, partition), value in group.offsets.items():
                    topic = state.topics.get(topic_name)
                    if topic is None:
                        continue
                    replica = runtime.replicas.get(group_id(topic.topic_id, partition))
                    if replica is None or replica.closed:
                        continue
                    key = (name, topic_name, str(partition)) if per_part else (name, topic_name)
                    behind = max(0, replica.high_watermark - value.offset)
                    totals[key] = totals.get(key, 0) + behind
        for key, value in sorted(totals.items()):
            lag.add_metric(list(key), value)
        yield lag

    # gossip and process --------------------------------------------------------------------
    def _gossip(self) -> Iterator[Metric]:
        swim = self.s.swim
        members = GaugeMetricFamily(
            "laminar_swim_members",
            "Gossip members by state, as this node sees them.",
            labels=["state"],
        )
        counts = dict.fromkeys((str(state) for state in MemberState), 0)
        for member in swim.members:
            counts[str(member.state)] = counts.get(str(member.state), 0) + 1
        for state, count in counts.items():
            members.add_metric([state], count)
        yield members
        yield _histogram(
            "laminar_swim_probe_rtt_seconds",
            "Round trip of gossip pings this node sent (ack received).",
            swim.stats.probe_rtt,
        )
        stats = swim.stats
        datagrams = CounterMetricFamily(
            "laminar_swim_datagrams", "Gossip datagrams, by direction.", labels=["direction"]
        )
        datagrams.add_metric(["received"], stats.datagrams_received)
        datagrams.add_metric(["sent"], stats.datagrams_sent)
        yield datagrams
        yield CounterMetricFamily(
            "laminar_swim_dropped_malformed",
            "Gossip datagrams dropped as malformed.",
            value=stats.dropped_malformed,
        )

    def _process(self) -> Iterator[Metric]:
        s = self.s
        connections = GaugeMetricFamily(
            "laminar_connections", "Open TCP connections, by port.", labels=["port"]
        )
        connections.add_metric(["client"], s.client_connections())
        connections.add_metric(["peer"], len(list(s.connected_peers())))
        yield connections
        yield _histogram(
            "laminar_event_loop_lag_seconds",
            "How late the event loop ran a timer (sampled every 250 ms).",
            s.loop_lag.buckets,
        )
        yield GaugeMetricFamily(
            "laminar_event_loop_lag_last_seconds",
            "The latest event-loop lag sample.",
            value=s.loop_lag.last,
        )
        if s.admission is not None:
            yield GaugeMetricFamily(
                "laminar_produce_batches_in_flight",
                "Record batches produce requests have proposed on this node and not yet "
                "settled (at most --max-produce-batches-in-flight).",
                value=s.admission.in_flight,
            )
            yield CounterMetricFamily(
                "laminar_produce_admission_waits",
                "Produce requests that waited for room under --max-produce-batches-in-flight "
                "(the node was taking writes as fast as it commits them).",
                value=s.admission.waited,
            )


def _histogram(name: str, documentation: str, buckets: Buckets) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation)
    family.add_metric([], buckets.cumulative(), buckets.sum)
    return family


def registry_for(sources: Sources) -> CollectorRegistry:
    """A registry of this node's collector alone (plus nothing global: tests start several
    nodes' worth of metrics in one process only through separate registries)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(sources))
    ProcessCollector(registry=registry)  # CPU, memory, open files of this process
    return registry
