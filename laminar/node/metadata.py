"""The cluster metadata state machine, replicated by the metadata Raft group (group 0).

Every node holds a full copy (metadata voters and learners apply the same committed commands),
so any node answers metadata requests locally. Commands are small JSON documents carried as the
single record of a record batch, so the metadata group's Raft log is an ordinary partition log.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any

from laminar.auth.state import AUTH_OPS, AuthState
from laminar.errors import (
    ERRORS_BY_CODE,
    InvalidConfigError,
    InvalidRequestError,
    LaminarError,
    NotEnoughReplicasError,
    TopicExistsError,
    UnknownTopicError,
)
from laminar.queues import config as queue_config
from laminar.splits import ops as split_ops
from laminar.splits.ranges import initial_ranges
from laminar.topic_names import validate_topic_name as validate_topic_name

METADATA_GROUP = 0
PARTITION_BITS = 20
MAX_PARTITIONS = 1 << PARTITION_BITS
REMEMBERED_REQUESTS = 4096
"""How many recent request ids the state machine remembers to answer a retried command."""


def group_id(topic_id: int, partition: int) -> int:
    """A partition's Raft group id; unique across delete + re-create (topic ids never repeat)."""
    return topic_id << PARTITION_BITS | partition


@dataclass(slots=True)
class TopicSettings:
    partitions: int
    replication_factor: int
    segment_bytes: int
    segment_ms: int
    retention_ms: int | None
    retention_bytes: int | None
    partitioning: str = "hash"
    """``hash`` (crc32c(key) % partitions, fixed) or ``range`` (key-hash ranges that split
    and merge, ``laminar.splits``)."""
    auto_split_above: int = 0
    """Range topics: split a partition written faster than this (bytes/s) over a window (0:
    never automatically; ``laminar.splits.auto``)."""
    auto_merge_below: int = 0
    """Range topics: merge two sibling partitions both written slower than this (bytes/s)."""
    auto_window_ms: int = 60_000
    max_partitions: int = 0
    """Range topics: automatic splits stop at this many active partitions (0: 64)."""


ALTERABLE_SETTINGS = (
    "segment_bytes",
    "segment_ms",
    "retention_ms",
    "retention_bytes",
    "auto_split_above",
    "auto_merge_below",
    "auto_window_ms",
    "max_partitions",
)
"""The topic settings ``alter_topic`` may change at run time: per-log settings, and a range
topic's automatic split/merge policy (read by the metadata leader at each decision)."""


@dataclass(slots=True)
class PartitionAssignment:
    replicas: list[int]
    leader: int = 0
    leader_term: int = 0
    adding: int = 0
    """A move in progress: the node receiving a replica (0: none)."""
    removing: int = 0
    """A move in progress: the node giving its replica up."""
    move_id: str = ""
    """A move in progress: the request id of its ``start_move`` (names this attempt)."""
    target_ready: bool = False
    """A move in progress: the target has applied its ``start_move`` and hosts the replica
    created for it (``move_target_ready``). Until then the partition's leader must not add the
    target to the Raft group: the target node may still host an older replica of the group
    (one it held before, whose removal it has not applied yet), which would answer for it."""
    origins: dict[int, int] = field(default_factory=dict)
    """Node -> metadata offset of the command that assigned it this replica (its replicas and
    ``adding``). Names the replica's directory (``Node.partition_dir``), so a node rebuilding
    its state from a checkpoint opens the very directory it created back then."""
    range_start: int = -1
    """Range topics: the key-hash range ``[range_start, range_end)`` (-1: hash topic)."""
    range_end: int = -1
    state: str = "active"
    """Range topics: ``active``, ``pending`` (a child before its split finishes), ``sealed``
    (a parent: no record is accepted, readable up to ``seal_end``) or ``retired`` (a sealed
    partition retention emptied: no replicas, not readable; its number stays taken)."""
    parents: list[int] = field(default_factory=list)
    """Range topics: the partitions this one was split or merged from (lineage)."""
    seal_end: int = -1
    """A sealed partition: every record lies below this offset (its seal batch's + 1)."""

    @property
    def moving(self) -> bool:
        return self.adding != 0


@dataclass(slots=True)
class Topic:
    name: str
    topic_id: int
    settings: TopicSettings
    partitions: list[PartitionAssignment]
    operation: dict[str, Any] | None = None
    """Range topics: the split or merge in progress (``laminar.splits.ops``), else None."""


@dataclass(slots=True)
class NodeInfo:
    node_id: int
    client_address: str
    peer_address: str
    rack: str = ""
    """The operator's failure domain (``--rack``); consumer groups prefer a member in the
    rack of a partition's replica when choosing between equally loaded members."""
    kafka_address: str = ""
    """Where Kafka clients reach this node (``--kafka-advertise``); empty: no Kafka listener."""
    incarnation: str = ""
    """The data directory's identity it registered with (amnesia.py): a node that lost its
    directory knows from it that its new incarnation is registered."""


@dataclass(slots=True)
class Recovery:
    """A replica that lost its state (``incident`` names the loss) and awaits re-admission;
    ``voter``: it is to be a voter again (else it was a learner, nothing to undo)."""

    incident: str
    voter: bool


LEADERSHIP_REPORTS = frozenset({"set_leader", "set_leaders"})


@dataclass(slots=True)
class MetadataState:
    """Applied state; ``apply`` is deterministic so every replica computes the same state."""

    topics: dict[str, Topic] = field(default_factory=dict)
    nodes: dict[int, NodeInfo] = field(default_factory=dict)
    draining: set[int] = field(default_factory=set)
    next_topic_id: int = 1
    recovering: dict[tuple[int, int], Recovery] = field(default_factory=dict)
    """(group, node) -> replicas that lost their state and must not vote until re-admitted."""
    queue_configs: dict[str, dict[str, queue_config.Value]] = field(default_factory=dict)
    """Share group -> the settings stored for it (the rest are defaults; laminar.queues.config).
    A changed group gets a new dict, so a reader may compare by identity."""
    auth: AuthState = field(default_factory=AuthState)
    """Users, ACLs and the nodes' internal secret (laminar/auth/state.py)."""
    outcomes: OrderedDict[str, Any] = field(default_factory=OrderedDict)
    """Outcome of the last REMEMBERED_REQUESTS commands by request id, as JSON values
    (``remembered``; an error as ``{"error": code, "message": text}``), so a checkpoint
    restates them exactly."""
    placement_changes: int = field(default=0, compare=False)
    """How many commands other than leadership reports this process applied (or checkpoints
    it restored): replica placement looks at the state again only when it moves. Thousands
    of partitions report leaders while a topic is created or a node fails, and a pass over
    10,000 partitions each time cost the metadata leader tens of ms every half second."""

    def apply_once(self, command: dict[str, Any], index: int = -1) -> tuple[Any, bool]:
        """Apply a command unless one with the same ``request_id`` was applied already.

        A proposer whose wait was cut short (leader change) retries with the same request id,
        so the command may reach the log twice; the second copy gets the first one's outcome
        (``remembered``: a JSON summary) and changes nothing. Returns (result, applied_now); a
        remembered error is raised again. ``index`` is the command's metadata offset.
        """
        request_id = command.get("request_id")
        if not isinstance(request_id, str) or not request_id:
            return self.apply(command, index), True
        if request_id in self.outcomes:
            outcome = self.outcomes[request_id]
            if isinstance(outcome, dict) and "error" in outcome:
                raise ERRORS_BY_CODE.get(outcome["error"], LaminarError)(outcome["message"])
            return outcome, False
        try:
            result = self.apply(command, index)
        except LaminarError as exc:
            self._remember(request_id, {"error": exc.code, "message": str(exc)})
            raise
        self._remember(request_id, remembered(result))
        return result, True

    def _remember(self, request_id: str, outcome: Any) -> None:
        self.outcomes[request_id] = outcome
        if len(self.outcomes) > REMEMBERED_REQUESTS:
            self.outcomes.popitem(last=False)

    def apply(self, command: dict[str, Any], index: int = -1) -> Any:
        op = command.get("op")
        if op not in LEADERSHIP_REPORTS:
            self.placement_changes += 1
        if op == "register_node":
            info = NodeInfo(
                command["node_id"],
                command["client_address"],
                command["peer_address"],
                command.get("rack", ""),
                command.get("kafka_address", ""),
                str(command.get("incarnation", "")),
            )
            self.nodes[info.node_id] = info
            return info
        if op == "create_topic":
            return self._create_topic(command, index)
        if op == "delete_topic":
            topic = self.topics.pop(command["name"], None)
            if topic is None:
                raise UnknownTopicError(f"unknown topic {command['name']!r}")
            for key in [k for k in self.recovering if k[0] >> PARTITION_BITS == topic.topic_id]:
                del self.recovering[key]
            return topic
        if op == "set_leader":
            return self._set_leader(
                command["topic_id"], command["partition"], command["leader"], command["term"]
            )
        if op == "set_leaders":  # many partitions of one leader (leader_reports.py)
            by_id = {topic.topic_id: topic for topic in self.topics.values()}
            for topic_id, partition, term in command["partitions"]:
                self._set_leader(topic_id, partition, command["leader"], term, by_id.get(topic_id))
            return None
        if op in ("start_move", "finish_move", "abort_move"):
            return self._move(op, command, index)
        if op == "move_target_ready":
            return self._move_target_ready(command)
        if op == "replica_lost":
            return self._replica_lost(command)
        if op == "replica_recovered":
            key = (command["group"], command["node"])
            recovery = self.recovering.get(key)
            if recovery is None or recovery.incident != command["incident"]:
                return None
            del self.recovering[key]
            return recovery
        if op == "alter_queue_config":
            return self._alter_queue_config(command)
        if op in ("drain_node", "undrain_node"):
            if command["node_id"] not in self.nodes:
                raise InvalidRequestError(f"node {command['node_id']} is not a cluster member")
            if op == "drain_node":
                self.draining.add(command["node_id"])
            else:
                self.draining.discard(command["node_id"])
            return command["node_id"]
        if op == "forget_node":
            return self._forget_node(command["node_id"])
        if op == "add_partitions":
            return self._add_partitions(command, index)
        if op == "alter_topic":
            return self._alter_topic(command)
        if op in ("begin_split", "begin_merge"):
            topic = self._topic(command["name"])
            return split_ops.begin(topic, command, lambda replicas: _assigned(replicas, index))
        if op == "finish_op":
            return split_ops.finish(self._topic(command["name"]), command)
        if op == "retire_partition":
            topic = self.topic_by_id(command["topic_id"])
            if topic is None:
                return None  # deleted meanwhile
            return split_ops.retire(topic, command)
        if op in AUTH_OPS:
            return self.auth.apply(command)
        raise InvalidRequestError(f"unknown metadata command {op!r}")

    def _set_leader(
        self, topic_id: int, partition: int, leader: int, term: int, topic: Topic | None = None
    ) -> PartitionAssignment | None:
        topic = topic or self.topic_by_id(topic_id)
        if topic is None or partition >= len(topic.partitions):
            return None  # the topic was deleted meanwhile
        assignment = topic.partitions[partition]
        if term >= assignment.leader_term:
            assignment.leader = leader
            assignment.leader_term = term
        return assignment

    def _alter_queue_config(self, command: dict[str, Any]) -> dict[str, queue_config.Value]:
        """Set and reset some of a share group's settings; a bad entry changes nothing."""
        group = queue_config.validate_group(command.get("group"))
        changes, reset = command.get("set") or {}, command.get("reset") or []
        if not isinstance(changes, dict) or not isinstance(reset, list):
            raise InvalidConfigError("set is an object and reset a list of names")
        stored = queue_config.altered(self.queue_configs.get(group, {}), changes, reset)
        if stored:
            self.queue_configs[group] = stored
        else:
            self.queue_configs.pop(group, None)
        return stored

    def _replica_lost(self, command: dict[str, Any]) -> Recovery | None:
        """A replica reports it lost its state; its group's leader will re-admit it."""
        group, node, incident = int(command["group"]), int(command["node"]), command["incident"]
        if not isinstance(incident, str) or not incident:
            raise InvalidRequestError("replica_lost needs an incident id")
        if group == METADATA_GROUP:
            voter = bool(command.get("voter", True))  # decided by the metadata leader
        else:
            topic = self.topic_by_id(group >> PARTITION_BITS)
            partition = group & (MAX_PARTITIONS - 1)
            if topic is None or partition >= len(topic.partitions):
                return None
            assignment = topic.partitions[partition]
            if node not in assignment.replicas and node != assignment.adding:
                return None
            voter = node in assignment.replicas
        recovery = Recovery(incident, voter)
        self.recovering[(group, node)] = recovery
        return recovery

    def _move(self, op: str, command: dict[str, Any], index: int) -> PartitionAssignment | None:
        """Moves replace one replica: start (the new one catches up), then finish; or abort
        (the target died on the way: the replicas stay as they were)."""
        topic = self.topic_by_id(command["topic_id"])
        if topic is None or command["partition"] >= len(topic.partitions):
            return None
        assignment = topic.partitions[command["partition"]]
        source, target = command["from"], command["to"]
        if op == "start_move":
            if assignment.moving or source not in assignment.replicas:
                return None
            if target in assignment.replicas:
                return None
            assignment.adding, assignment.removing = target, source
            assignment.move_id = str(command.get("request_id") or "")
            assignment.target_ready = False
            assignment.origins[target] = index
        else:
            if (assignment.adding, assignment.removing) != (target, source):
                return None
            if op == "finish_move":
                assignment.replicas = [target if r == source else r for r in assignment.replicas]
            assignment.origins.pop(source if op == "finish_move" else target, None)
            group = group_id(topic.topic_id, command["partition"])
            # The replica that left the group needs no re-admission any more.
            self.recovering.pop((group, source if op == "finish_move" else target), None)
            assignment.adding = assignment.removing = 0
            assignment.move_id = ""
            assignment.target_ready = False
        return assignment

    def _move_target_ready(self, command: dict[str, Any]) -> PartitionAssignment | None:
        """The target of a move has applied its ``start_move`` (and so every earlier command,
        including the one that removed any replica of the group it held before)."""
        topic = self.topic_by_id(command["topic_id"])
        if topic is None or command["partition"] >= len(topic.partitions):
            return None
        assignment = topic.partitions[command["partition"]]
        move_id = command["move_id"]
        if not move_id or (assignment.adding, assignment.move_id) != (command["to"], move_id):
            return None  # another move (or none) by now
        assignment.target_ready = True
        return assignment

    def _create_topic(self, command: dict[str, Any], index: int) -> Topic:
        name = command["name"]
        if name in self.topics:
            raise TopicExistsError(f"topic {name!r} already exists")
        settings = TopicSettings(**command["settings"])
        if settings.partitioning not in ("hash", split_ops.RANGE):
            raise InvalidRequestError(
                f"partitioning is hash or range, not {settings.partitioning!r}"
            )
        topic = Topic(
            name=name,
            topic_id=self.next_topic_id,
            settings=settings,
            partitions=[_assigned(r, index) for r in command["replicas"]],
        )
        if settings.partitioning == split_ops.RANGE:
            for assignment, bounds in zip(
                topic.partitions, initial_ranges(len(topic.partitions)), strict=True
            ):
                assignment.range_start, assignment.range_end = bounds
        self.next_topic_id += 1
        self.topics[name] = topic
        return topic

    def _add_partitions(self, command: dict[str, Any], index: int) -> Topic:
        """Grow a topic to ``len(replicas)`` partitions more; existing ones are untouched, so
        (as in Kafka) keys hash to other partitions from then on."""
        topic = self._topic(command["name"])
        if topic.settings.partitioning == split_ops.RANGE:
            raise InvalidRequestError(
                f"topic {topic.name!r} is range-partitioned: split partitions instead"
            )
        if command["from"] != len(topic.partitions):
            # Placed for another partition count (a concurrent add committed first).
            raise InvalidRequestError(
                f"topic {topic.name!r} has {len(topic.partitions)} partitions now; try again"
            )
        topic.partitions.extend(_assigned(r, index) for r in command["replicas"])
        topic.settings.partitions = len(topic.partitions)
        return topic

    def _alter_topic(self, command: dict[str, Any]) -> Topic:
        """Change a topic's log settings; each replica applies them to its log at once."""
        topic = self._topic(command["name"])
        changes = command["settings"]
        unknown = set(changes) - set(ALTERABLE_SETTINGS)
        if unknown:
            raise InvalidRequestError(f"cannot alter {', '.join(sorted(unknown))}")
        for name, value in changes.items():
            setattr(topic.settings, name, value)
        return topic

    def _forget_node(self, node_id: int) -> int:
        """Drop a node the gossip reaped (down for a day) that holds no replica any more, so it
        leaves ``cluster status``; if it ever comes back it registers afresh."""
        if node_id not in self.nodes:
            raise InvalidRequestError(f"node {node_id} is not a cluster member")
        holding = [
            f"{topic.name}/{index}"
            for topic in self.topics.values()
            for index, a in enumerate(topic.partitions)
            if node_id in a.replicas or node_id == a.adding
        ]
        if holding:
            raise InvalidRequestError(f"node {node_id} still holds replicas of {holding[:3]}")
        del self.nodes[node_id]
        self.draining.discard(node_id)
        for key in [k for k in self.recovering if k[1] == node_id]:
            del self.recovering[key]
        return node_id

    def _topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            raise UnknownTopicError(f"unknown topic {name!r}")
        return topic

    def topic_by_id(self, topic_id: int) -> Topic | None:
        for topic in self.topics.values():
            if topic.topic_id == topic_id:
                return topic
        return None

    def replica_counts(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for topic in self.topics.values():
            for assignment in topic.partitions:
                for node_id in assignment.replicas:
                    counts[node_id] = counts.get(node_id, 0) + 1
        return counts


def _assigned(replicas: list[int], index: int) -> PartitionAssignment:
    return PartitionAssignment(list(replicas), origins={node: index for node in replicas})


def remembered(result: Any) -> Any:
    """What the state machine keeps of a command's result for a retry: a JSON value (a topic by
    name and id only, a partition's assignment not at all: restating them per remembered
    request would bloat checkpoints; no proposer reads them)."""
    if isinstance(result, Topic):
        return {"name": result.name, "topic_id": result.topic_id}
    if result is None or isinstance(result, int | str):
        return result
    if isinstance(result, PartitionAssignment):  # set_leader and moves: it moves on anyway
        return None
    try:
        return json.loads(encode_command(result if isinstance(result, dict) else asdict(result)))
    except TypeError:
        return None


def place_replicas(
    partitions: int,
    replication_factor: int,
    live_nodes: list[int],
    load: dict[int, int],
    first: int = 0,
) -> list[list[int]]:
    """Spread replicas evenly: each replica goes to the live node with the fewest so far.

    Ties break by node id, rotated per partition (numbered from ``first``) so that first
    replicas (preferred leaders) spread too.
    """
    if partitions < 1 or partitions >= MAX_PARTITIONS:
        raise InvalidRequestError(f"partitions must be between 1 and {MAX_PARTITIONS - 1}")
    if replication_factor < 1:
        raise InvalidRequestError("replication factor must be at least 1")
    if replication_factor > len(live_nodes):
        raise NotEnoughReplicasError(
            f"replication factor {replication_factor} needs {replication_factor} live nodes, "
            f"the cluster has {len(live_nodes)}"
        )
    counts = {node: load.get(node, 0) for node in live_nodes}
    nodes = sorted(live_nodes)
    placement: list[list[int]] = []
    for partition in range(first, first + partitions):
        rotation = nodes[partition % len(nodes) :] + nodes[: partition % len(nodes)]
        order = {node: i for i, node in enumerate(rotation)}
        chosen: list[int] = []
        for _ in range(replication_factor):
            node = min((n for n in nodes if n not in chosen), key=lambda n: (counts[n], order[n]))
            chosen.append(node)
            counts[node] += 1
        placement.append(chosen)
    return placement


def encode_command(command: dict[str, Any]) -> bytes:
    return json.dumps(command, separators=(",", ":"), sort_keys=True).encode()


def decode_command(data: bytes) -> dict[str, Any]:
    value = json.loads(data)
    if not isinstance(value, dict):
        raise InvalidRequestError("a metadata command is a JSON object")
    return value
