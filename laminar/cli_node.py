"""``laminar node start``: run one node in the foreground.

A file of its own, importing no client library, so that starting a node (the dev cluster, the
tests and every restart start many) skips the third of the CLI's import time the client
commands need: ``laminar/__main__.py`` runs ``node start`` through ``start_app`` alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from laminar.cli_common import UserError, fail, parse_size
from laminar.cli_tls import node_security
from laminar.errors import LaminarError


def node_start(
    node_id: Annotated[int, typer.Option("--node-id", help="This node's id (>= 1).")],
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Where this node keeps data.")],
    listen: Annotated[str, typer.Option(help="Client address host:port.")] = "127.0.0.1:9092",
    peer_listen: Annotated[
        str, typer.Option(help="Peer (Raft/gossip) address; default client port + 1.")
    ] = "",
    advertise_peer: Annotated[
        str,
        typer.Option(help="Peer address other nodes use to reach this one; default --peer-listen."),
    ] = "",
    peers: Annotated[
        str, typer.Option(help="Initial cluster: '1=host:port,2=host:port,...' (peer addresses).")
    ] = "",
    kafka_listen: Annotated[
        str, typer.Option(help="Kafka wire protocol address host:port; default: none.")
    ] = "",
    kafka_advertise: Annotated[
        str,
        typer.Option(help="Kafka address clients are given in Metadata; default --kafka-listen."),
    ] = "",
    join: Annotated[
        list[str] | None, typer.Option(help="Peer address of a running node to join through.")
    ] = None,
    log_format: Annotated[str, typer.Option(help="console or json.")] = "console",
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    node_dead_after: Annotated[
        float,
        typer.Option(help="Seconds a node may be dead before its replicas are re-created."),
    ] = 30.0,
    max_concurrent_moves: Annotated[
        int, typer.Option(help="Replica moves the cluster runs at once.", min=1)
    ] = 2,
    shutdown_handoff: Annotated[
        float,
        typer.Option(
            help="Seconds a stopping node (SIGTERM) spends handing its leaderships to other "
            "nodes first; 0 stops at once.",
            min=0,
        ),
    ] = 5.0,
    reap_after: Annotated[
        float,
        typer.Option(
            help="Seconds a node may be down before it is forgotten (once it holds no "
            "replica); 0 never.",
            min=0,
        ),
    ] = 86400.0,
    min_free_bytes: Annotated[
        str,
        typer.Option(
            help="Free space the data directory keeps: below it the node refuses new data "
            "(DiskFullError) until space is freed."
        ),
    ] = "256MiB",
    metadata_checkpoint_commands: Annotated[
        int,
        typer.Option(
            help="The metadata leader checkpoints the metadata state after this many "
            "commands (the metadata log is then cut below the checkpoint).",
            min=1,
        ),
    ] = 10_000,
    metadata_checkpoint_bytes: Annotated[
        str,
        typer.Option(
            help="... or after this many bytes of metadata commands (at least twice the "
            "last checkpoint's size)."
        ),
    ] = "16MiB",
    max_requests_per_connection: Annotated[
        int,
        typer.Option(
            help="Requests one client connection may have in service; beyond, the node reads "
            "no more from it until some are answered (its replies, too, must be read).",
            min=1,
        ),
    ] = 256,
    max_produce_batches_in_flight: Annotated[
        int,
        typer.Option(
            help="Record batches all produce requests together may have written and not yet "
            "committed; a request that does not fit waits for room, so a flood of writes "
            "costs latency, not leaderships.",
            min=1,
        ),
    ] = 2048,
    max_open_log_files: Annotated[
        int,
        typer.Option(
            help="Segment data files all hosted partition logs keep open together; the "
            "least recently used are closed and reopened on use (0: half the open-files "
            "limit).",
            min=0,
        ),
    ] = 0,
    retention_check_interval: Annotated[
        float, typer.Option(help="Seconds between retention passes over every replica.")
    ] = 60.0,
    rack: Annotated[
        str, typer.Option(help="This node's rack or zone (consumer groups prefer local reads).")
    ] = "",
    group_partitions: Annotated[
        int, typer.Option(help="Partitions of __consumer_offsets (fixed once created).", min=1)
    ] = 8,
    group_session_timeout: Annotated[
        float, typer.Option(help="Seconds a group member may go without a heartbeat.")
    ] = 45.0,
    group_heartbeat_interval: Annotated[
        float, typer.Option(help="Seconds between a group member's heartbeats.")
    ] = 5.0,
    group_offsets_retention: Annotated[
        float, typer.Option(help="Seconds a group with no members keeps its offsets (7 days).")
    ] = 7 * 24 * 3600.0,
    group_initial_rebalance_delay: Annotated[
        float,
        typer.Option(
            help="Seconds a new classic (Kafka JoinGroup) group waits for more members "
            "before its first generation (Kafka's group.initial.rebalance.delay.ms)."
        ),
    ] = 3.0,
    group_min_session_timeout: Annotated[
        float,
        typer.Option(help="Shortest session timeout a classic group member may ask for, s."),
    ] = 6.0,
    metrics_listen: Annotated[
        str,
        typer.Option(
            help="host:port serving Prometheus /metrics, /healthz and /readyz over HTTP "
            "(default: off)."
        ),
    ] = "",
    metrics_per_partition: Annotated[
        bool,
        typer.Option(
            "--metrics-per-partition",
            help="Label log and Raft metrics per partition (default: per topic).",
        ),
    ] = False,
    tls_cert: Annotated[
        Path | None,
        typer.Option(help="This node's certificate (PEM), signed by --tls-ca, named node-<id>."),
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="Key of --tls-cert (PEM).")] = None,
    tls_ca: Annotated[
        Path | None, typer.Option(help="The cluster CA (PEM): peers and client certs it signed.")
    ] = None,
    tls_ports: Annotated[
        str, typer.Option(help="Listeners that speak TLS once --tls-cert is given.")
    ] = "client,peer,kafka",
    tls_client_auth: Annotated[
        str, typer.Option(help="none or required: clients must present a certificate of the CA.")
    ] = "none",
    gossip_key: Annotated[
        list[str] | None,
        typer.Option(help="Base64 gossip key (16/24/32 bytes); repeatable, the first sends."),
    ] = None,
    gossip_key_file: Annotated[
        Path | None,
        typer.Option(help="Gossip keyring file, one base64 key per line; re-read on change."),
    ] = None,
    gossip_encrypt: Annotated[
        bool, typer.Option(help="Encrypt gossip with AES-GCM (not only authenticate it).")
    ] = False,
    insecure: Annotated[
        bool, typer.Option(help="Allow plain (no TLS, no gossip key) non-loopback listeners.")
    ] = False,
) -> None:
    """Run one node in the foreground until SIGTERM or Ctrl-C."""
    from laminar.groups.settings import GroupSettings
    from laminar.node.config import NodeConfig, parse_peers

    if node_id < 1:
        fail("--node-id must be >= 1")
    if log_format not in ("console", "json"):
        fail(f"--log-format must be console or json, not {log_format!r}")
    if log_level.lower() not in ("debug", "info", "warning", "error"):
        fail(f"--log-level must be debug, info, warning or error, not {log_level!r}")
    if peers and join:
        fail("give either --peers (a new cluster) or --join (an existing one), not both")
    try:
        min_free = 0 if min_free_bytes.strip() == "0" else parse_size(min_free_bytes)
    except UserError as exc:
        fail(str(exc))
    try:
        security = node_security(
            tls_cert,
            tls_key,
            tls_ca,
            tls_ports,
            tls_client_auth,
            list(gossip_key or []),
            gossip_key_file,
            gossip_encrypt,
            insecure,
        )
        config = NodeConfig(
            node_id=node_id,
            data_dir=data_dir,
            listen=listen,
            peer_listen=peer_listen,
            advertise_peer=advertise_peer,
            kafka_listen=kafka_listen,
            kafka_advertise=kafka_advertise,
            peers=parse_peers(peers) if peers else {},
            join=list(join or []),
            log_format=log_format,
            log_level=log_level.lower(),
            node_dead_after_ms=int(node_dead_after * 1000),
            max_concurrent_moves=max_concurrent_moves,
            shutdown_handoff_ms=int(shutdown_handoff * 1000),
            reap_after_ms=int(reap_after * 1000),
            min_free_bytes=min_free,
            metadata_checkpoint_commands=metadata_checkpoint_commands,
            metadata_checkpoint_bytes=parse_size(metadata_checkpoint_bytes),
            max_requests_per_connection=max_requests_per_connection,
            max_produce_batches_in_flight=max_produce_batches_in_flight,
            max_open_log_files=max_open_log_files,
            retention_check_ms=max(1, int(retention_check_interval * 1000)),
            rack=rack,
            metrics_listen=metrics_listen,
            metrics_per_partition=metrics_per_partition,
            groups=GroupSettings(
                partitions=group_partitions,
                session_timeout_ms=int(group_session_timeout * 1000),
                heartbeat_interval_ms=int(group_heartbeat_interval * 1000),
                offsets_retention_ms=int(group_offsets_retention * 1000),
                classic_initial_rebalance_delay_ms=int(group_initial_rebalance_delay * 1000),
                classic_min_session_timeout_ms=int(group_min_session_timeout * 1000),
            ),
            security=security,
        )
    except ValueError as exc:
        fail(str(exc))
    if config.peers and node_id not in config.peers:
        fail(f"--peers does not list this node ({node_id})")
    from laminar.node import daemon

    try:
        daemon.run(config)
    except (OSError, LaminarError) as exc:  # e.g. a data directory in use by another node
        fail(f"node {node_id} cannot start: {exc}")


def start_app() -> typer.Typer:
    """The ``laminar`` command with ``node start`` alone (same usage, options and help)."""
    app = typer.Typer(
        name="laminar", add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None
    )
    node = typer.Typer(help="Run a node.", no_args_is_help=True, rich_markup_mode=None)
    node.command("start")(node_start)
    app.add_typer(node, name="node")
    return app
