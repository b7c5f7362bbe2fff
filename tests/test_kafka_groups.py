"""Consumer groups through the Kafka listener with the real clients (kafka-python, aiokafka,
confluent-kafka), on one 3-node cluster of node processes (classic JoinGroup/SyncGroup groups,
client-side assignors, offsets in ``__consumer_offsets``).

For each client:
* two members share a topic's 6 partitions (disjoint, covering); one stops committing, reads
  some more and closes (LeaveGroup): the other takes all partitions over from the committed
  offsets: no record is skipped, and only what was read without a commit is read twice;
* the node coordinating the group is SIGKILLed while the members consume: they find the new
  coordinator (which loaded the group's generation and members from the log), go on reading
  everything produced afterwards and commit it there; the node comes back; then a third member
  joins and the coordinator is SIGKILLed again during that rebalance: the three end up
  sharing the partitions and read everything produced afterwards.

Besides: the admin APIs through kafka-python and confluent-kafka, every version of every group
API over a raw socket, a static member's restart, and a group id refused to the other kind.
The kill tests run last (restarted nodes take shard leadership back, and admin clients do not
retry NOT_COORDINATOR).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from laminar.cli import app  # noqa: F401 - imports laminar.cli_group in its order
from laminar.cli_group import render_group
from laminar.client.admin import Admin
from laminar.client.localcluster import LocalCluster, free_port_pairs, free_ports
from tests.cluster_fixture import ClusterHandle, run_sync
from tests.group_harness import create_topic, wait_until_caught_up
from tests.kafka_members import CLIENTS, Member, leaders_by_node, produce, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PARTITIONS = 6
ALL = frozenset(range(PARTITIONS))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> ClusterHandle:
    root = Path(tmp_path_factory.mktemp("kafka-groups"))
    local = LocalCluster(
        root / "cluster",
        free_port_pairs(3),
        kafka_ports=free_ports(3),
        python=sys.executable,
        extra_args=[
            *("--group-initial-rebalance-delay", "0.5", "--group-min-session-timeout", "1"),
            *("--group-session-timeout", "6", "--group-heartbeat-interval", "0.5"),
        ],
    )
    handle = ClusterHandle(local)
    local.start()
    try:
        handle.wait_ready(60)
        yield handle
    finally:
        handle.stop()


def kafka_bootstrap(cluster: ClusterHandle) -> str:
    return cluster.local.kafka_bootstrap


def split_evenly(members: list[Member]) -> bool:
    owned = [m.assignment for m in members]
    return sum(len(a) for a in owned) == PARTITIONS and frozenset().union(*owned) == ALL


def check_errors(*members: Member) -> None:
    for m in members:
        assert m.error is None, f"{m.name}: {m.error!r}"


@pytest.mark.parametrize("client", CLIENTS)
def test_two_members_share_then_one_takes_over(cluster: ClusterHandle, client: str) -> None:
    tag = client.replace("/", "-")
    topic, group = f"share-{tag}", f"g-share-{tag}"
    run_sync(create_topic(cluster.bootstrap, topic, PARTITIONS))
    bootstrap = kafka_bootstrap(cluster)
    first = produce(bootstrap, topic, PARTITIONS, 300, "a")
    a = Member(client, bootstrap, topic, group, f"{client}-a").start()
    b = Member(client, bootstrap, topic, group, f"{client}-b").start()
    try:
        wait_for(
            lambda: split_evenly([a, b]) and bool(a.assignment) and bool(b.assignment),
            60,
            "two members sharing the partitions",
        )
        check_errors(a, b)
        assert not a.assignment & b.assignment
        wait_for(lambda: set(first) <= set(a.values() + b.values()), 60, "the first records")
        # The native admin sees the group (classic, or KIP-848 for group.protocol=consumer) with
        # both members and their partitions.
        description = run_sync(_describe(cluster.bootstrap, group))
        protocol = "consumer" if client.endswith("/consumer") else "classic"
        assert description.protocol == protocol
        assert description.state == "stable" and len(description.members) == 2
        assert f"PROTOCOL     {protocol}" in render_group(description)  # laminar group describe
        assert sorted(p.partition for m in description.members for p in m.assigned) == sorted(ALL)
        # b reads more without committing, then leaves; a takes over from b's commits.
        b.hold_commits = True
        second = produce(bootstrap, topic, PARTITIONS, 300, "b")
        wait_for(lambda: len(b.uncommitted) > 0, 60, "b to read without committing")
        b.close()
        wait_for(lambda: a.assignment == ALL, 60, "a to own every partition")
        wait_for(lambda: set(second) <= set(a.values() + b.values()), 60, "the second records")
        check_errors(a, b)
    finally:
        a.close()
        b.close()
    counts = Counter(a.values() + b.values())
    assert set(first) | set(second) <= set(counts), "a record was skipped"
    again = {v for v, n in counts.items() if n > 1}
    allowed = {v for _p, _o, v in a.uncommitted + b.uncommitted}
    assert again <= allowed, f"read twice although committed: {sorted(again - allowed)[:5]}"


async def _describe(bootstrap: str, group: str):
    async with Admin(bootstrap) as admin:
        for _ in range(100):
            try:
                return await admin.describe_group(group)
            except Exception:  # the coordinator is being elected
                await asyncio.sleep(0.2)
        return await admin.describe_group(group)


def _delete_groups(admin: object, groups: list[str]) -> dict[str, str]:
    """kafka-python's delete_groups, retried for groups whose coordinator moved between its
    FindCoordinator and DeleteGroups (leadership going back to a restarted node), as an
    application would on NOT_COORDINATOR."""
    result: dict[str, str] = {}
    todo = list(groups)
    for _ in range(20):
        result.update(admin.delete_groups(todo))  # type: ignore[attr-defined]
        todo = [g for g in todo if result[g] == "NotCoordinatorError"]
        if not todo:
            break
        time.sleep(0.5)
    return result


def _cli(*args: str) -> str:
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run(
        [sys.executable, "-m", "laminar", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    return done.stdout


def _committed(bootstrap: str, group: str) -> dict[int, int]:
    return {o.partition: o.offset for o in run_sync(_describe(bootstrap, group)).offsets}


def _read_up_to(*members: Member) -> dict[int, int]:
    """Per partition, the offset after the last record any member read."""
    out: dict[int, int] = {}
    for m in members:
        for partition, offset, _value in list(m.got):
            out[partition] = max(out.get(partition, 0), offset + 1)
    return out


def _without(bootstrap: str, cluster: ClusterHandle, node_id: int) -> str:
    dead = cluster.nodes[node_id].kafka_address
    return ",".join(a for a in bootstrap.split(",") if a != dead)


def _native_without(cluster: ClusterHandle, node_id: int) -> str:
    return ",".join(n.client_address for i, n in cluster.nodes.items() if i != node_id)


def test_group_admin_apis_through_kafka_python(cluster: ClusterHandle) -> None:
    """ListGroups, DescribeGroups, OffsetFetch (several groups at once), OffsetCommit from
    outside a group, LeaveGroup by static instance id and DeleteGroups, as kafka-python's
    admin client uses them."""
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient, MemberToRemove
    from kafka.structs import OffsetAndMetadata

    topic = "admin-topic"
    run_sync(wait_until_caught_up(cluster.bootstrap, 60))  # earlier tests restarted nodes
    run_sync(create_topic(cluster.bootstrap, topic, PARTITIONS))
    bootstrap = kafka_bootstrap(cluster)
    produce(bootstrap, topic, PARTITIONS, 60, "x")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    member = Member("kafka-python", bootstrap, topic, "admin-live", "admin-m", instance_id="i-1")
    try:
        # Commits from outside a group (generation -1) create it; two groups in one fetch.
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        errors = admin.alter_group_offsets(
            "admin-offline", {tp: OffsetAndMetadata(5, "", -1) for tp in tps}
        )
        assert all(e.__name__ == "NoError" for e in errors.values()), errors
        member.start()
        wait_for(lambda: member.assignment == ALL, 60, "the static member's assignment")
        wait_for(lambda: len(member.got) >= 60, 60, "the records")
        fetched = admin.list_group_offsets({"admin-offline": None, "admin-live": None})
        assert {tp.partition: o.offset for tp, o in fetched["admin-offline"].items()} == {
            p: 5 for p in range(PARTITIONS)
        }
        # (each partition also holds a Raft no-op: a control batch the consumer steps over)
        assert min(o.offset for o in fetched["admin-live"].values()) >= 60 // PARTITIONS
        groups = {g["group_id"]: g for g in admin.list_groups()}
        assert groups["admin-live"]["protocol_type"] == "consumer"
        assert "admin-offline" in groups
        described = admin.describe_groups(["admin-live", "no-such-group"])
        live = described["admin-live"]
        assert live["group_state"] == "Stable" and live["protocol_data"] == "range"
        (m,) = live["members"]
        assert m["group_instance_id"] == "i-1" and m["client_id"] == "admin-m", m
        assigned = m["member_assignment"]["assigned_partitions"]  # decoded by kafka-python
        assert assigned == [{"topic": topic, "partitions": sorted(ALL)}]
        assert described["no-such-group"]["group_state"] == "Dead"
        # A group with members cannot be deleted; removing the static member by its instance
        # id (LeaveGroup v3+) empties it.
        result = _delete_groups(admin, ["admin-live", "admin-offline", "never-was"])
        assert result == {
            "admin-live": "NonEmptyGroupError",
            "admin-offline": "OK",
            "never-was": "GroupIdNotFoundError",
        }, result
        removed = admin.remove_group_members(
            "admin-live", [MemberToRemove(group_instance_id="i-1")]
        )
        assert [e.__name__ for e in removed.values()] == ["NoError"]
        members = admin.describe_groups(["admin-live"])["admin-live"]["members"]
        assert m["member_id"] not in [x["member_id"] for x in members]  # it may join anew
    finally:
        member.close()
        admin.close()


GROUP_APIS = (8, 9, 10, 11, 12, 13, 14, 15, 16, 42, 68, 69)


def test_every_version_of_the_group_apis_is_answered(cluster: ClusterHandle) -> None:
    """A request of every served version of every group API (values the codec's tests draw:
    odd timeouts, unknown members and topics, nulls), over a real socket: each gets a response
    that decodes, the connection stays open and no handler fails."""
    import socket
    import struct

    from laminar.kafka import codec
    from laminar.kafka.apis import SERVED
    from tests.test_kafka_clients import raw_request, read_response
    from tests.test_kafka_codec import sample

    host, port = kafka_bootstrap(cluster).split(",")[0].rsplit(":", 1)
    answered = 0
    for key in GROUP_APIS:
        api = SERVED[key]
        for version in range(api.min_version, api.max_version + 1):
            flexible = api.flexible(version)
            for seed in range(3):
                body = codec.encode(
                    api.request, sample(api.request, version, flexible, seed), version, flexible
                )
                with socket.create_connection((host, int(port)), timeout=20) as sock:
                    sock.sendall(raw_request(key, version, seed, bytes(body)))
                    response = read_response(sock)
                assert struct.unpack_from(">i", response)[0] == seed
                start = 4 + (1 if api.response_header_v1(version) else 0)
                codec.decode(api.response, memoryview(response), start, version, flexible)
                answered += 1
    assert answered > 100
    for node in cluster.nodes.values():
        assert "kafka request failed" not in node.log_path.read_text(errors="replace")


def test_a_static_member_restarts_without_a_rebalance(cluster: ClusterHandle) -> None:
    """kafka-python static members (group.instance.id): the follower closes (a static member
    sends no LeaveGroup) and starts again within its session timeout under a new member id; it
    gets its partitions back, the generation does not change and the leader is not disturbed;
    the old member id is gone."""
    topic, group = "static-topic", "g-static"
    run_sync(create_topic(cluster.bootstrap, topic, PARTITIONS))
    bootstrap = kafka_bootstrap(cluster)
    produce(bootstrap, topic, PARTITIONS, 60, "s")
    a = Member("kafka-python", bootstrap, topic, group, "static-a", instance_id="i-a").start()
    b = Member("kafka-python", bootstrap, topic, group, "static-b", instance_id="i-b")
    again = None
    try:
        # a first, so that a leads (the leader keeps leading): b is the follower that restarts
        wait_for(lambda: a.assignment == ALL, 60, "a alone")
        b.start()
        wait_for(lambda: split_evenly([a, b]) and a.assignment and b.assignment, 60, "sharing")
        before = run_sync(_describe(cluster.bootstrap, group))
        owned_a, owned_b = a.assignment, b.assignment
        b.close()
        again = Member("kafka-python", bootstrap, topic, group, "static-b2", instance_id="i-b")
        again.start()
        wait_for(lambda: again.assignment == owned_b, 30, "the restarted member's partitions")
        after = run_sync(_describe(cluster.bootstrap, group))
        assert after.epoch == before.epoch, "a static restart must not rebalance"
        assert a.assignment == owned_a
        ids_before = {m.instance_id: m.member_id for m in before.members}
        ids_after = {m.instance_id: m.member_id for m in after.members}
        assert ids_after["i-a"] == ids_before["i-a"] and ids_after["i-b"] != ids_before["i-b"]
        check_errors(a, b, again)
        # `laminar group list` / `describe` show the classic group.
        listed = _cli("group", "list", "--bootstrap", cluster.bootstrap)
        row = next(line.split() for line in listed.splitlines() if line.startswith(group))
        assert row[1:3] == ["stable", "2"] and row[-1] == "classic", listed
        described = _cli("group", "describe", group, "--bootstrap", cluster.bootstrap)
        assert "PROTOCOL     classic" in described and "i-b" in described, described
    finally:
        a.close()
        b.close()
        if again is not None:
            again.close()


def test_a_group_id_is_classic_or_consumer_never_both(cluster: ClusterHandle) -> None:
    """While a KIP-848 member (confluent-kafka, group.protocol=consumer) holds the group, a
    classic member (kafka-python) is refused with INCONSISTENT_GROUP_PROTOCOL, as in Kafka 4;
    the KIP-848 member keeps all partitions."""
    topic, group = "mixed-topic", "g-mixed"
    run_sync(create_topic(cluster.bootstrap, topic, PARTITIONS))
    bootstrap = kafka_bootstrap(cluster)
    modern = Member("confluent-kafka/consumer", bootstrap, topic, group, "mixed-new").start()
    classic = Member("kafka-python", bootstrap, topic, group, "mixed-old")
    try:
        wait_for(lambda: modern.assignment == ALL, 60, "the KIP-848 member's partitions")
        classic.start()
        wait_for(lambda: classic.error is not None, 30, "the classic member's refusal")
        assert type(classic.error).__name__ == "InconsistentGroupProtocolError", classic.error
        assert modern.assignment == ALL and modern.error is None
        assert run_sync(_describe(cluster.bootstrap, group)).protocol == "consumer"
    finally:
        modern.close()
        classic.close()


def test_confluent_admin_lists_and_describes_both_kinds(cluster: ClusterHandle) -> None:
    """confluent-kafka's AdminClient: ListGroups (v5: types), DescribeGroups for a classic
    group, ConsumerGroupDescribe for a KIP-848 one, DeleteGroups once they are empty."""
    from confluent_kafka import ConsumerGroupType
    from confluent_kafka.admin import AdminClient

    topic = "both-kinds"
    run_sync(create_topic(cluster.bootstrap, topic, PARTITIONS))
    bootstrap = kafka_bootstrap(cluster)
    old = Member("confluent-kafka", bootstrap, topic, "g-both-classic", "both-old").start()
    new = Member("confluent-kafka/consumer", bootstrap, topic, "g-both-new", "both-new").start()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        wait_for(lambda: old.assignment == ALL and new.assignment == ALL, 60, "both groups")
        listed = admin.list_consumer_groups().result(timeout=30)
        kinds = {g.group_id: g.type for g in listed.valid}
        assert kinds["g-both-classic"] == ConsumerGroupType.CLASSIC
        assert kinds["g-both-new"] == ConsumerGroupType.CONSUMER
        described = admin.describe_consumer_groups(["g-both-classic", "g-both-new"])
        for group, future in described.items():
            d = future.result(timeout=30)
            (member,) = d.members
            assert sorted(tp.partition for tp in member.assignment.topic_partitions) == sorted(
                ALL
            ), group
        assert described["g-both-classic"].result().partition_assignor == "range"
    finally:
        old.close()
        new.close()
    deleted = admin.delete_consumer_groups(["g-both-classic", "g-both-new"])
    for future in deleted.values():
        future.result(timeout=30)


# Last: it SIGKILLs and restarts nodes, and leadership moving back to a restarted node makes
# the admin clients above (which do not retry NOT_COORDINATOR) flaky if they run after it.
@pytest.mark.parametrize("client", CLIENTS)
def test_members_rejoin_after_the_coordinator_is_killed(
    cluster: ClusterHandle, client: str
) -> None:
    tag = client.replace("/", "-")
    topic, group = f"kill-{tag}", f"g-kill-{tag}"
    run_sync(wait_until_caught_up(cluster.bootstrap, 60))  # an earlier test restarted a node
    run_sync(create_topic(cluster.bootstrap, topic, PARTITIONS))
    bootstrap = kafka_bootstrap(cluster)
    first = produce(bootstrap, topic, PARTITIONS, 120, "a")
    a = Member(client, bootstrap, topic, group, f"{client}-ka").start()
    b = Member(client, bootstrap, topic, group, f"{client}-kb").start()
    c = Member(client, bootstrap, topic, group, f"{client}-kc")
    killed = 0
    try:
        wait_for(lambda: split_evenly([a, b]) and a.assignment and b.assignment, 60, "sharing")
        try:
            wait_for(lambda: set(first) <= set(a.values() + b.values()), 60, "the first records")
        except AssertionError as exc:  # say who tells clients which leader (seen: stale ones)
            views = leaders_by_node(bootstrap, topic)
            raise AssertionError(f"{exc}; leaders by node: {views}") from exc
        killed = run_sync(_describe(cluster.bootstrap, group)).coordinator
        cluster.kill(killed)
        second = produce(_without(bootstrap, cluster, killed), topic, PARTITIONS, 120, "b")
        wait_for(lambda: set(second) <= set(a.values() + b.values()), 90, "records after the kill")
        wait_for(lambda: split_evenly([a, b]), 60, "the group to settle again")
        check_errors(a, b)
        native = _native_without(cluster, killed)
        after = run_sync(_describe(native, group))
        assert after.coordinator != killed and len(after.members) == 2
        # Commits reach the new coordinator: in the end, everything read is committed.
        wait_for(
            lambda: _committed(native, group) == _read_up_to(a, b), 60, "commits after the kill"
        )
        cluster.restart(killed)
        run_sync(wait_until_caught_up(cluster.bootstrap, 60))
        # A third member joins, and the coordinator dies while the group rebalances (held
        # joins fail with NOT_COORDINATOR; the new coordinator has the last generation).
        killed = run_sync(_describe(cluster.bootstrap, group)).coordinator
        c.start()
        time.sleep(1.0)
        cluster.kill(killed)
        third = produce(_without(bootstrap, cluster, killed), topic, PARTITIONS, 120, "c")
        wait_for(
            lambda: split_evenly([a, b, c]) and all(m.assignment for m in (a, b, c)),
            90,
            "three members",
        )
        wait_for(
            lambda: set(third) <= set(a.values() + b.values() + c.values()), 90, "the third records"
        )
        check_errors(a, b, c)
    finally:
        a.close()
        b.close()
        c.close()
        if killed:
            cluster.restart(killed)
    counts = Counter(a.values() + b.values() + c.values())
    assert set(first) | set(second) | set(third) <= set(counts), "a record was skipped"
