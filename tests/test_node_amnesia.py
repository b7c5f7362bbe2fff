"""Replicas that lost their state must not vote until their group has re-admitted them.

In-process tests drive a real (unstarted) node over real files: the test delivers Raft
messages itself, so what a replica answers is deterministic. A Raft-level test plays the whole
story on the sans-I/O core with the node's own message gate and re-admission steps.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.errors import InvalidRequestError, LaminarError
from laminar.node import amnesia as amnesia_module
from laminar.node.amnesia import CREATED_FILE, MARKERS_DIR, Amnesia
from laminar.node.config import NodeConfig
from laminar.node.metadata import MetadataState, Recovery, Topic, group_id
from laminar.node.node import Node
from laminar.node.rebalance import advance_recovery
from laminar.raft import MemoryStorage, Message, MessageType, Role
from laminar.segment.batch import decode_records, is_control, iter_batches
from tests.cluster_fixture import start_cluster
from tests.raft_harness import Net

SETTINGS = {
    "partitions": 1,
    "replication_factor": 3,
    "segment_bytes": 1 << 20,
    "segment_ms": 60_000,
    "retention_ms": None,
    "retention_bytes": None,
}
ORIGIN = 7  # the metadata offset that assigned the replica (names its directory)


def node_with_topic(data_dir: Path, node_id: int, replicas: list[int]) -> tuple[Node, Topic]:
    """A node (not started) whose metadata holds one topic with one partition on ``replicas``."""
    config = NodeConfig(node_id=node_id, data_dir=data_dir, listen="127.0.0.1:1", tick_ms=10)
    node = Node(config)
    settings = {**SETTINGS, "replication_factor": len(replicas)}
    topic = node.state.apply(
        {"op": "create_topic", "name": "t", "settings": settings, "replicas": [replicas]}
    )
    return node, topic


def vote_request(frm: int, to: int, term: int) -> Message:
    return Message(MessageType.VOTE, to, frm, term, log_term=0, index=-1)


async def settle() -> None:
    for _ in range(3):  # the runtime drains marked groups in a call_soon callback
        await asyncio.sleep(0)


def persist(node: Node, group: int) -> None:
    """What the group commit does after a Ready: make the replica's hard state durable, and
    the markers of new replicas (``MultiRaft.before_release``)."""
    replica = node.runtime.replicas[group]
    state = replica.state_to_save()
    assert state is not None
    replica.write_state(state)
    replica.log.flush()
    node.amnesia.sync_markers()


async def test_a_replica_reopened_from_a_wiped_directory_does_not_vote_again(
    tmp_path: Path,
) -> None:
    node, topic = node_with_topic(tmp_path, 2, [1, 2, 3])
    group = group_id(topic.topic_id, 0)
    node._open_partition(topic, 0, ORIGIN)
    node._raft_received(1, [(group, vote_request(1, 2, term=1))])
    await settle()
    replica = node.runtime.replicas[group]
    assert replica.raft.vote == 1, "a healthy replica votes"
    persist(node, group)
    directory = replica.directory
    node.runtime.remove(group)

    shutil.rmtree(directory)  # the operator (or a disk) wipes the partition directory

    node, topic = node_with_topic(tmp_path, 2, [1, 2, 3])  # the node restarts
    node._open_partition(topic, 0, ORIGIN)
    replica = node.runtime.replicas[group]
    node._raft_received(3, [(group, vote_request(3, 2, term=1))])
    await settle()
    # Node 2 voted for node 1 in term 1; a second vote in term 1 could elect two leaders.
    assert replica.raft.vote == 0
    assert not [m for m in replica.after_persist if m.type is MessageType.VOTE_RESP]
    node.runtime.remove(group)


def record_sent(node: Node) -> list[Message]:
    """Spy on what the node hands its peer connections (they are not connected here)."""
    sent: list[Message] = []
    send = node.peers.send_raft

    def recording(peer: int, messages: list) -> None:
        sent.extend(m for _, m in messages)
        send(peer, messages)

    node.peers.send_raft = recording  # type: ignore[method-assign]
    return sent


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_a_new_replica_votes_only_once_a_flush_pass_made_its_marker_durable(
    tmp_path: Path,
) -> None:
    # A big topic's new replicas get their markers synced by the group commit, which every
    # vote and acknowledgement waits for, instead of an fsync on the event loop per slice.
    node, topic = node_with_topic(tmp_path, 2, [1, 2, 3])
    group = group_id(topic.topic_id, 0)
    created = tmp_path / MARKERS_DIR / CREATED_FILE
    marked_when_voting: list[bool] = []
    send = node.peers.send_raft

    def recording(peer: int, messages: list) -> None:
        for _, message in messages:
            if message.type is MessageType.VOTE_RESP and not message.reject:
                marked_when_voting.append(created.exists() and name in created.read_text())
        send(peer, messages)

    node.peers.send_raft = recording  # type: ignore[method-assign]
    node.runtime.start()
    try:
        node._open_partition(topic, 0, ORIGIN)
        name = node.runtime.replicas[group].directory.name
        assert not created.exists(), "the marker waits for the next flush pass"
        node._raft_received(1, [(group, vote_request(1, 2, term=1))])
        await wait_until(lambda: bool(marked_when_voting))
        assert marked_when_voting == [True]
    finally:
        await node.runtime.stop()


async def test_a_wiped_preferred_replica_does_not_campaign(tmp_path: Path) -> None:
    node, topic = node_with_topic(tmp_path, 1, [1, 2, 3])
    sent = record_sent(node)
    group = group_id(topic.topic_id, 0)
    node.runtime.start()  # ticks and group commit for real (peers are not connected)
    try:
        node._open_partition(topic, 0, ORIGIN)  # the preferred replica campaigns at once
        await wait_until(lambda: MessageType.PRE_VOTE in {m.type for m in sent})
        directory = node.runtime.replicas[group].directory
        node.runtime.remove(group)
    finally:
        await node.runtime.stop()
    shutil.rmtree(directory)

    node, topic = node_with_topic(tmp_path, 1, [1, 2, 3])
    sent = record_sent(node)
    node.runtime.start()
    try:
        node._open_partition(topic, 0, ORIGIN)
        replica = node.runtime.replicas[group]
        await wait_until_ticked(node, 3 * node.config.election_ticks)  # three election timeouts
        # No vote request leaves: with an empty log it could win against a peer that lacks
        # acknowledged entries.
        assert not [m for m in sent if m.type in (MessageType.VOTE, MessageType.PRE_VOTE)]
        assert (replica.raft.role, replica.raft.term) == (Role.FOLLOWER, 0)
    finally:
        await node.runtime.stop()


async def wait_until_ticked(node: Node, ticks: int) -> None:
    start = node.runtime.ticks
    await wait_until(lambda: node.runtime.ticks >= start + ticks)


async def test_a_wiped_replica_of_a_group_of_one_does_not_elect_itself(tmp_path: Path) -> None:
    node, topic = node_with_topic(tmp_path, 1, [1])
    group = group_id(topic.topic_id, 0)
    node.runtime.start()
    try:
        node._open_partition(topic, 0, ORIGIN)
        await wait_until(lambda: node.runtime.replicas[group].is_leader)
        directory = node.runtime.replicas[group].directory
    finally:
        await node.runtime.stop()
    shutil.rmtree(directory)

    node, topic = node_with_topic(tmp_path, 1, [1])
    node.runtime.start()
    try:
        node._open_partition(topic, 0, ORIGIN)
        await wait_until_ticked(node, 3 * node.config.election_ticks)
        # It needs no vote from anyone to win, so no message filter can stop it: leading
        # with an empty log would serve a partition without its acknowledged records.
        replica = node.runtime.replicas[group]
        assert (replica.raft.role, replica.raft.term) == (Role.FOLLOWER, 0)
        assert group in node.amnesia.gated
    finally:
        await node.runtime.stop()


async def test_a_readmitted_replica_votes_only_in_later_terms(tmp_path: Path) -> None:
    node, topic = node_with_topic(tmp_path, 2, [1, 2, 3])
    group = group_id(topic.topic_id, 0)
    node._open_partition(topic, 0, ORIGIN)
    node.amnesia.sync_markers()  # (a flush pass ran: the replica may have taken part since)
    directory = node.runtime.replicas[group].directory
    node.runtime.remove(group)
    shutil.rmtree(directory)
    node, topic = node_with_topic(tmp_path, 2, [1, 2, 3])
    node._open_partition(topic, 0, ORIGIN)
    replica = node.runtime.replicas[group]
    incident = node.amnesia.incident(group)
    assert incident
    replica.raft.step(Message(MessageType.HEARTBEAT, 2, 1, 4, commit=-1))  # leader 1, term 4
    await settle()
    # The group re-admitted it (the metadata records it); the gate lifts, with a floor.
    assert node.amnesia.recovered(group, "another-incident", replica.raft.term) is False
    assert node.amnesia.recovered(group, incident, replica.raft.term)
    replica.raft.report_node_down(1)  # leader gone: the replica may vote again ...
    node._raft_received(3, [(group, vote_request(3, 2, term=4))])
    await settle()
    assert replica.raft.vote == 0, "... but not in a term it may have voted in before the loss"
    node._raft_received(3, [(group, vote_request(3, 2, term=5))])
    await settle()
    assert replica.raft.vote == 3
    # The floor is durable: a restart keeps it.
    node.runtime.remove(group)
    node, topic = node_with_topic(tmp_path, 2, [1, 2, 3])
    node._open_partition(topic, 0, ORIGIN)
    assert group not in node.amnesia.gated
    assert not node.amnesia.admits(group, vote_request(3, 2, term=4))
    node.runtime.remove(group)


def test_readmission_keeps_every_committed_entry(tmp_path: Path) -> None:
    """Raft-level story: entries committed by {1, 3} while 2 lags; 3 loses everything.

    Without the gate, isolating 1 lets 2 win with 3's vote and the committed entries are lost.
    With it, no leader is elected until 1 is back; 1 re-admits 3 (remove, learner, promote);
    then 1 may fail and the new leader still holds every committed entry.
    """
    group = 1
    Amnesia(tmp_path).opening(group, "p", tmp_path / "p")  # the replica is created
    net = Net([1, 2, 3], election_tick=10)
    net.elect(1)
    net.isolate(2)
    for i in range(5):
        net[1].propose(b"acked-%d" % i)
        net.deliver()
    committed = net[1].commit
    assert committed >= 5 and net[2].log.last_index() < committed

    # Node 3 restarts with nothing: no log, no term, no vote; its marker says it lost state.
    net.storages[3] = MemoryStorage()
    net.hard_states.pop(3, None)
    net.confs.pop(3, None)
    amnesia = Amnesia(tmp_path)
    assert amnesia.opening(group, "p", tmp_path / "p"), "its directory is gone: lost"
    net.start(3)
    gate_on_3 = gate(amnesia, group, node=3)
    net.drop = gate_on_3

    net.isolate(1)
    reconnect(net, 2, 3)
    for _ in range(200):
        net.tick_all()
        net.deliver()
    assert Role.LEADER not in (net[2].role, net[3].role), "2 lacks committed entries"

    reconnect(net, 1, 2)
    reconnect(net, 1, 3)
    for _ in range(200):
        if any(net[n].role is Role.LEADER for n in (1, 2, 3)):
            break
        net.tick_all()
        net.deliver()
    leader = next(n for n in (1, 2, 3) if net[n].role is Role.LEADER)
    assert leader == 1
    removed = False
    for _ in range(50):
        if advance_recovery(net[1], 3, removed):
            break
        removed = removed or 3 not in net[1].conf.voters
        for _ in range(5):
            net.tick_all()
            net.deliver()
    else:
        raise AssertionError("node 3 was not re-admitted")
    assert amnesia.recovered(group, amnesia.incident(group), net[3].term)
    assert net[3].log.last_index() >= committed

    net.isolate(1)
    reconnect(net, 2, 3)
    for _ in range(300):
        if any(net[n].role is Role.LEADER for n in (2, 3)):
            break
        net.tick_all()
        net.deliver()
    new_leader = next(n for n in (2, 3) if net[n].role is Role.LEADER)
    assert net[new_leader].log.last_index() >= committed
    for offset in range(committed + 1):
        assert net[new_leader].log.term(offset) == net[1].log.term(offset)


def gate(amnesia: Amnesia, group: int, node: int) -> Callable[[Message], bool]:
    def drop(message: Message) -> bool:
        if message.to == node:
            return not amnesia.admits(group, message)
        if message.frm == node:
            return not amnesia.outgoing([(group, message)])
        return False

    return drop


def reconnect(net: Net, a: int, b: int) -> None:
    net.cut.discard((a, b))
    net.cut.discard((b, a))


def test_a_data_directory_of_another_node_is_refused(tmp_path: Path) -> None:
    first = Amnesia(tmp_path)
    assert first.load_identity("c1", 1) is False, "empty: new or lost everything"
    first.node_lost = True  # its peers knew it
    first.save_identity()
    restarted = Amnesia(tmp_path)
    assert restarted.load_identity("c1", 1) is True
    assert restarted.node_lost, "until its new incarnation registers, old replicas are lost"
    restarted.registered()
    final = Amnesia(tmp_path)
    assert final.load_identity("c1", 1) and not final.node_lost
    with pytest.raises(InvalidRequestError, match="belongs to node 1"):
        Amnesia(tmp_path).load_identity("c1", 2)
    with pytest.raises(InvalidRequestError):
        Amnesia(tmp_path).load_identity("c2", 1)


def test_a_log_that_reopens_below_its_durable_watermark_lost_state(tmp_path: Path) -> None:
    amnesia = Amnesia(tmp_path)
    (tmp_path / "p").mkdir()
    assert not amnesia.opening(5, "p", tmp_path / "p")
    amnesia.note_durable(5, 120)
    assert amnesia.save_watermarks() and not amnesia.save_watermarks()  # only what moved

    restarted = Amnesia(tmp_path)
    assert not restarted.opening(5, "p", tmp_path / "p")
    assert not restarted.check_log(5, 120), "a log as long as its watermark is intact"
    assert restarted.check_log(5, 80), "a bit flip cut everything from offset 80 on"
    assert 5 in restarted.gated and restarted.incident(5)
    again = Amnesia(tmp_path)  # the loss is durable: a restart does not forget it
    assert again.opening(5, "p", tmp_path / "p") and 5 in again.gated


def test_watermarks_are_saved_when_they_moved_and_again_after_a_failed_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    amnesia = Amnesia(tmp_path)
    (tmp_path / "p").mkdir()
    amnesia.opening(5, "p", tmp_path / "p")
    amnesia.note_durable(5, 120)
    monkeypatch.setattr(amnesia_module, "write_atomic", full_disk)
    with pytest.raises(OSError):
        amnesia.save_watermarks()
    monkeypatch.undo()
    assert amnesia.save_watermarks(), "the failed save is tried again"
    assert not amnesia.save_watermarks()
    amnesia.note_durable(5, 120)
    assert not amnesia.save_watermarks(), "nothing moved"
    amnesia.note_durable(5, 130)
    assert amnesia.save_watermarks()
    restarted = Amnesia(tmp_path)
    restarted.opening(5, "p", tmp_path / "p")
    assert restarted.check_log(5, 125), "the log ends below the saved 130"


def full_disk(path: Path, data: bytes) -> None:
    raise OSError(28, "No space left on device")


def test_metadata_records_losses_of_assigned_replicas_only() -> None:
    state = MetadataState()
    state.apply({"op": "create_topic", "name": "t", "settings": SETTINGS, "replicas": [[1, 2, 3]]})
    group = group_id(1, 0)
    lost = {"op": "replica_lost", "group": group, "incident": "i1"}
    assert state.apply({**lost, "node": 9}) is None, "node 9 holds no replica of it"
    assert state.apply({**lost, "node": 3}) == Recovery("i1", voter=True)
    recovered = {"op": "replica_recovered", "group": group, "node": 3}
    assert state.apply({**recovered, "incident": "older"}) is None
    assert (group, 3) in state.recovering
    assert state.apply({**recovered, "incident": "i1"}) is not None
    assert not state.recovering
    # A replica that moves away needs no re-admission.
    state.apply({**lost, "node": 3})
    move = {"topic_id": 1, "partition": 0, "from": 3, "to": 4}
    state.apply({"op": "start_move", **move})
    state.apply({"op": "finish_move", **move})
    assert not state.recovering


# ---------------------------------------------------------------------------------------------
# Real node processes: a node loses state, then forms a majority with a node that lags.

TOPIC = "amnesia"
RECORDS = 200


async def partition_leader(bootstrap: str, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    async with Admin(bootstrap) as admin:
        while True:
            leader = (await admin.describe_topic(TOPIC)).partitions[0].leader
            if leader:
                return leader
            assert time.monotonic() < deadline, "the partition has no leader"
            await asyncio.sleep(0.1)


async def read_all(bootstrap: str, timeout: float = 60.0) -> dict[int, bytes]:
    """Every record of the partition below its high watermark, read from its leader."""
    deadline = time.monotonic() + timeout
    tp = TopicPartition(TOPIC, 0)
    async with Consumer(bootstrap) as consumer:
        while True:
            try:
                records: dict[int, bytes] = {}
                offset = 0
                while True:
                    fetched = await consumer.fetch_batches(tp, offset, 1 << 20, max_wait_ms=0)
                    if offset >= fetched.high_watermark:
                        return records
                    for position, header in iter_batches(fetched.data):
                        offset = header.next_offset
                        if not is_control(header):
                            batch = fetched.data[position : position + header.batch_length]
                            records.update(
                                (r.offset, r.value or b"") for r in decode_records(batch)
                            )
            except LaminarError:
                assert time.monotonic() < deadline, "the partition could not be read"
                await asyncio.sleep(0.2)


def partition_dir(node_dir: Path) -> Path:
    (directory,) = (node_dir / "partitions").glob(f"{TOPIC}-0.*")
    return directory


def watermark(node_dir: Path) -> int:
    try:
        data = json.loads((node_dir / MARKERS_DIR / "watermarks.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return -1
    return max((end for name, end in data.items() if name.startswith(f"{TOPIC}-0.")), default=-1)


def readmitted(node_dir: Path) -> bool:
    markers = list((node_dir / MARKERS_DIR).glob(f"{TOPIC}-0.*.json"))
    return bool(markers) and not json.loads(markers[0].read_text())["lost"]


def flip_a_bit_in_the_active_segment(node_dir: Path) -> None:
    segment = max((partition_dir(node_dir) / "log").glob("*.log"))
    with open(segment, "r+b") as file:
        size = os.fstat(file.fileno()).st_size
        file.seek(size // 2)
        byte = file.read(1)[0]
        file.seek(size // 2)
        file.write(bytes([byte ^ 0x10]))


async def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.1)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("damage", ["partition_dir", "data_dir", "bit_flip"])
async def test_a_node_that_lost_state_does_not_help_elect_a_leader_without_acked_data(
    tmp_path: Path, damage: str
) -> None:
    cluster = start_cluster(tmp_path, nodes=3)
    try:
        async with Admin(cluster.bootstrap) as admin:
            await admin.create_topic(TOPIC, partitions=1, replication_factor=3)
        leader = await partition_leader(cluster.bootstrap)
        lagging, wiped = sorted(set(cluster.nodes) - {leader})
        wiped_dir = cluster.nodes[wiped].data_dir

        cluster.stop_node(lagging)  # it will miss every acknowledged record
        acked: dict[int, bytes] = {}
        async with Producer(cluster.bootstrap, acks="all", linger_ms=1) as producer:
            futures = [
                await producer.send(TOPIC, b"r%05d" % i, partition=0) for i in range(RECORDS)
            ]
            for i, future in enumerate(futures):
                acked[(await future).offset] = b"r%05d" % i
        await wait_for(lambda: watermark(wiped_dir) > max(acked), "the watermark is saved")

        cluster.stop_node(wiped)
        if damage == "partition_dir":
            shutil.rmtree(partition_dir(wiped_dir))
        elif damage == "data_dir":
            shutil.rmtree(wiped_dir)
        else:
            flip_a_bit_in_the_active_segment(wiped_dir)
        cluster.stop_node(leader)  # the only intact copy of the records is down now
        cluster.start_node(wiped)
        cluster.start_node(lagging)
        # The wiped and the lagging node are a majority. Give them many election timeouts.
        await asyncio.sleep(4)

        cluster.start_node(leader)
        cluster.wait_ready()
        await wait_for(lambda: readmitted(wiped_dir), "the group re-admits the replica", 90)
        assert await read_all(cluster.bootstrap) == acked

        # Re-admitted, the replica votes again: without the first leader, the two others
        # elect one, and it holds every acknowledged record.
        cluster.stop_node(leader)
        await partition_leader(cluster.address(lagging))
        stored = await read_all(cluster.address(lagging))
        assert stored == acked
    except BaseException:
        print(cluster.logs(40))
        raise
    finally:
        cluster.stop()


def test_markers_read_back_the_same_after_restarts(tmp_path: Path) -> None:
    """A restart stats each marker and reads only the ones that hold more than the default
    (an empty file): every kind of marker comes back as it was written."""
    first = Amnesia(tmp_path)
    for name in ("plain", "lost", "readmitted"):
        (tmp_path / name).mkdir()
    assert not first.opening(1, "plain", tmp_path / "plain", exists=True)
    assert not first.opening(2, "lost", tmp_path / "lost")
    assert not first.opening(3, "readmitted", tmp_path / "readmitted")
    first.lose(2)
    first.lose(3)
    assert first.recovered(3, first.incident(3), term=9)
    assert not (tmp_path / MARKERS_DIR / "plain.json").exists()  # a line of created.log
    incident = first.incident(2)

    restarted = Amnesia(tmp_path)
    assert not restarted.opening(1, "plain", tmp_path / "plain", exists=True)
    assert restarted.opening(2, "lost", tmp_path / "lost", exists=True)
    assert restarted.incident(2) == incident
    assert not restarted.opening(3, "readmitted", tmp_path / "readmitted", exists=True)
    assert restarted.markers[3][1].vote_floor == 9 and restarted.filtering
    assert not restarted.opening(4, "new", tmp_path / "new", exists=False)  # no marker yet
    assert "+new\n" in (tmp_path / MARKERS_DIR / CREATED_FILE).read_text()

    # the caller's look at the directory decides, as the directory itself does without one
    again = Amnesia(tmp_path)
    assert again.opening(1, "plain", tmp_path / "plain", exists=False), "its directory is gone"
    assert Amnesia(tmp_path).opening(1, "plain", tmp_path / "plain"), "and stays lost"
    shutil.rmtree(tmp_path / "readmitted")
    assert Amnesia(tmp_path).opening(3, "readmitted", tmp_path / "readmitted")


def test_default_markers_are_lines_of_one_file_that_survive_a_torn_tail(tmp_path: Path) -> None:
    """New replicas' markers are lines of created.log, durable with sync_markers; a line cut
    short by a crash counts for nothing (never synced: no replica took part under it) and is
    cut away, so later lines are whole."""
    amnesia = Amnesia(tmp_path)
    for name in ("a", "b"):
        assert not amnesia.opening(1, name, tmp_path / name, durable=False, exists=False)
    amnesia.sync_markers()
    created = tmp_path / MARKERS_DIR / CREATED_FILE
    assert created.read_text() == "+a\n+b\n"
    assert list((tmp_path / MARKERS_DIR).glob("*.json")) == []
    with created.open("a") as file:
        file.write("+c")  # torn: no newline
    restarted = Amnesia(tmp_path)
    assert restarted.opening(1, "a", tmp_path / "a", exists=False), "created, directory gone"
    assert not restarted.opening(2, "c", tmp_path / "c", exists=False), "never created"
    assert "+c\n" in created.read_text() and "+c+" not in created.read_text()
    assert Amnesia(tmp_path).opening(3, "b", tmp_path / "b", exists=False)


def test_forgotten_markers_leave_created_log_and_it_is_compacted(tmp_path: Path) -> None:
    amnesia = Amnesia(tmp_path)
    names = [f"r{i}" for i in range(10)]
    for name in names:
        amnesia.opening(1, name, tmp_path / name, exists=False)
    for name in names[:8]:
        amnesia.forget(name)
    created = tmp_path / MARKERS_DIR / CREATED_FILE
    assert created.read_text().count("\n") == 10  # (a forgotten line waits for the next sync)
    amnesia.sync_markers()
    assert created.read_text().count("\n") == 18  # (forgetting appends)
    restarted = Amnesia(tmp_path)
    for name in names[:8]:  # gone: a replica of that name would be new
        assert not restarted.opening(1, name, tmp_path / name, exists=False)
    assert restarted.opening(2, "r9", tmp_path / "r9", exists=False)
    assert created.read_text().startswith("+r8\n+r9\n")  # compacted on reading


def test_an_older_empty_marker_file_still_reads_as_the_default(tmp_path: Path) -> None:
    (tmp_path / MARKERS_DIR).mkdir()
    (tmp_path / MARKERS_DIR / "old.json").write_bytes(b"")
    amnesia = Amnesia(tmp_path)
    assert amnesia.opening(1, "old", tmp_path / "old", exists=False), "created before: lost"
    assert not amnesia.opening(2, "fresh", tmp_path / "fresh", exists=False)
