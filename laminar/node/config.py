"""Node configuration: what `laminar node start` parses and the daemon runs with."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from laminar.groups.settings import GroupSettings
from laminar.tls import SecurityConfig
from laminar.transport import split_address

DAY_MS = 24 * 3600 * 1000


@dataclass(slots=True)
class NodeConfig:
    node_id: int
    data_dir: Path
    listen: str = "127.0.0.1:9092"
    """Client address host:port."""
    peer_listen: str = ""
    """Node-to-node TCP (Raft) and UDP (gossip) address; default: client port + 1."""
    advertise_peer: str = ""
    """Peer address the other nodes reach this one at (e.g. through a proxy); default
    peer_listen."""
    peers: dict[int, str] = field(default_factory=dict)
    """Initial cluster: node id -> peer address (this node included or not)."""
    join: list[str] = field(default_factory=list)
    """Peer addresses of running nodes to join through (gossip seeds)."""
    cluster_id: str = "laminar"
    metadata_replicas: int = 3
    tick_ms: int = 50
    election_ticks: int = 10
    flush_interval_ms: int = 2
    flush_threads: int = 16
    """Threads fdatasyncing a group-commit pass's partition logs in parallel (runtime.py)."""
    max_open_log_files: int = 0
    """Segment data files all hosted logs keep open together, least recently used closed
    first (``segment/descriptors.py``); 0: half the open-files limit."""
    retention_check_ms: int = 60_000
    default_segment_bytes: int = 64 * 1024 * 1024
    default_segment_ms: int = 7 * DAY_MS
    default_retention_ms: int = 7 * DAY_MS
    max_batch_bytes: int = 4 * 1024 * 1024
    node_dead_after_ms: int = 30_000
    max_concurrent_moves: int = 2
    kafka_listen: str = ""
    """Kafka wire protocol address host:port (laminar/kafka); empty: no Kafka listener."""
    kafka_advertise: str = ""
    """Kafka address clients are given in Metadata; default kafka_listen."""
    shutdown_handoff_ms: int = 5_000
    """How long a stopping node spends handing its leaderships over (0: stop at once)."""
    reap_after_ms: int = DAY_MS
    """A node down this long is dropped from the gossip, and from the cluster once it holds
    no replica (``--reap-after``; 0 keeps it forever)."""
    min_free_bytes: int = 256 * 1024 * 1024
    """Below this much free space in ``data_dir`` the node takes no new data (``disk.py``)."""
    metadata_checkpoint_commands: int = 10_000
    """The metadata leader checkpoints the state after this many commands..."""
    metadata_checkpoint_bytes: int = 16 * 1024 * 1024
    """... or this many bytes of commands (``metadata_checkpoint.py``)."""
    max_requests_per_connection: int = 256
    """Client requests one connection may have in service; beyond, the node stops reading it."""
    max_produce_batches_in_flight: int = 2048
    """Batches all produce requests together may have proposed and not yet committed; a
    request that does not fit waits (``admission.py``)."""
    rack: str = ""
    """Failure domain of this node (rack, zone); consumer groups use it (``--rack``)."""
    groups: GroupSettings = field(default_factory=GroupSettings)
    metrics_listen: str = ""
    """HTTP address serving /metrics, /healthz and /readyz (``--metrics-listen``; "" = off)."""
    metrics_per_partition: bool = False
    """Label log and Raft metrics per partition, not only per topic."""
    security: SecurityConfig = field(default_factory=SecurityConfig)
    """TLS, gossip keys, ``--insecure`` (``laminar/tls.py``)."""
    log_format: str = "console"
    log_level: str = "info"

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        split_address(self.listen)
        if not self.peer_listen:
            host, port = split_address(self.listen)
            self.peer_listen = f"{host}:{port + 1}"
        split_address(self.peer_listen)
        if not self.advertise_peer:
            self.advertise_peer = self.peer_listen
        split_address(self.advertise_peer)
        if self.kafka_listen and not self.kafka_advertise:
            if split_address(self.kafka_listen)[0] in ("0.0.0.0", "::", ""):
                raise ValueError(
                    "--kafka-listen binds every interface: give --kafka-advertise, the address "
                    "Kafka clients are to connect to"
                )
            self.kafka_advertise = self.kafka_listen
        kafka = [a for a in (self.kafka_listen, self.kafka_advertise) if a]
        for address in [*self.peers.values(), *self.join, *kafka]:
            split_address(address)
        if self.metrics_listen:
            split_address(self.metrics_listen)
        if self.max_open_log_files < 0:
            raise ValueError(f"max_open_log_files must be >= 0, not {self.max_open_log_files}")
        self.security.check_exposure(self.listen, self.peer_listen, self.kafka_listen)


def parse_peers(text: str) -> dict[int, str]:
    """'1=host:port,2=host:port' -> {1: 'host:port', 2: 'host:port'}; ValueError if malformed."""
    peers: dict[int, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        node, sep, address = item.partition("=")
        if not sep or not node.strip().isdigit():
            raise ValueError(f"peer {item!r} is not ID=host:port")
        split_address(address.strip())
        peers[int(node)] = address.strip()
    return peers
