"""Real node processes for tests: `start_cluster(tmp_path, nodes=3) -> ClusterHandle`.

Each node is a `python -m laminar node start` subprocess on random free ports with its log
under tmp_path. Usable from sync tests (the Spark source) and async tests alike: readiness is
checked on a private event loop in a helper thread. Stop the cluster in a `finally` or
fixture teardown; nodes also get SIGTERM if the test process dies.

    cluster = start_cluster(tmp_path)
    try:
        ... Producer(cluster.bootstrap) ...
        cluster.kill(2); cluster.restart(2)
    finally:
        cluster.stop()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import time
import urllib.request
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from laminar.client.descriptions import ClusterStatus
from laminar.client.localcluster import LocalCluster, LocalNode, free_port_pairs, free_ports

T = TypeVar("T")

READY_TIMEOUT = 60.0


def metric(metrics_address: str, name: str) -> float | None:
    """The sum of a metric's samples on one node's /metrics (every label set); None if it
    has none."""
    text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10).read()
    pattern = rb"^" + re.escape(name.encode()) + rb"(?:\{[^}]*\})? ([0-9.e+]+)$"
    found = re.findall(pattern, text, re.M)
    return sum(float(value) for value in found) if found else None


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from sync or async code (on a helper thread's loop)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


class ClusterHandle:
    """A running process cluster; node ids are 1..n."""

    def __init__(self, local: LocalCluster) -> None:
        self.local = local

    @property
    def bootstrap(self) -> str:
        return self.local.bootstrap

    @property
    def kafka_bootstrap(self) -> str:
        """The nodes' Kafka listeners (started with ``kafka=True``)."""
        return self.local.kafka_bootstrap

    @property
    def nodes(self) -> dict[int, LocalNode]:
        return self.local.nodes

    def address(self, node_id: int) -> str:
        return self.local.nodes[node_id].client_address

    def wait_ready(self, timeout: float = READY_TIMEOUT, nodes: int | None = None) -> ClusterStatus:
        """Block until the cluster has a metadata leader and ``nodes`` (default all) alive."""
        try:
            return run_sync(self.local.wait_ready(timeout, nodes=nodes))
        except (TimeoutError, RuntimeError) as exc:
            raise RuntimeError(f"{exc}\n{self.logs()}") from None

    def kill(self, node_id: int) -> None:
        """SIGKILL one node (a crash)."""
        self.local.kill_node(node_id)

    def stop_node(self, node_id: int, timeout: float = 10.0) -> int | None:
        """SIGTERM one node (a clean stop); returns its exit code."""
        return self.local.stop_node(node_id, timeout)

    def start_node(self, node_id: int) -> None:
        self.local.start_node(node_id)

    def restart(self, node_id: int, *, wait: bool = True, timeout: float = READY_TIMEOUT) -> None:
        """Stop (if running) and start one node; by default wait until all nodes are alive."""
        self.local.restart_node(node_id)
        if wait:
            self.wait_ready(timeout)

    def stop(self, timeout: float = 10.0) -> dict[int, int | None]:
        """Stop every node (SIGTERM, SIGKILL after ``timeout``); returns exit codes."""
        return self.local.stop(timeout)

    def produce_batches_held(self, timeout: float = 30.0) -> dict[int, float | None]:
        """Each node's ``laminar_produce_batches_in_flight`` (started with ``metrics``) once
        all are 0, or as they stand after ``timeout`` s: room a write kept is never given
        back, and the node refuses every write once it has leaked all of it."""
        deadline = time.monotonic() + timeout
        while True:
            held = {
                n: metric(node.metrics_address, "laminar_produce_batches_in_flight")
                for n, node in self.nodes.items()
            }
            if all(value == 0 for value in held.values()) or time.monotonic() > deadline:
                return held
            time.sleep(0.2)

    def logs(self, lines: int = 15) -> str:
        """The tail of every node's log, for failure messages."""
        return "\n".join(
            f"--- node {node_id} ({node.log_path}):\n{self.local.log_tail(node_id, lines)}"
            for node_id, node in self.local.nodes.items()
        )

    def __enter__(self) -> ClusterHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_cluster(
    tmp_path: Path,
    nodes: int = 3,
    *,
    wait: bool = True,
    timeout: float = READY_TIMEOUT,
    log_level: str = "info",
    extra_args: list[str] | None = None,
    kafka: bool = False,
    open_files_limit: int | None = None,
    metrics: bool = False,
) -> ClusterHandle:
    """Start ``nodes`` node processes under ``tmp_path``; by default wait until ready.
    ``extra_args`` go to every `laminar node start`; ``kafka`` opens a Kafka listener on
    each node (``kafka_bootstrap``); ``open_files_limit`` caps each node's RLIMIT_NOFILE;
    ``metrics`` serves each node's /metrics (``LocalNode.metrics_address``)."""
    local = LocalCluster(
        Path(tmp_path) / "cluster",
        free_port_pairs(nodes),
        log_level=log_level,
        extra_args=extra_args or (),
        kafka_ports=free_ports(nodes) if kafka else None,
        open_files_limit=open_files_limit,
        metrics_ports=free_ports(nodes) if metrics else None,
    )
    handle = ClusterHandle(local)
    local.start()
    if wait:
        try:
            handle.wait_ready(timeout)
        except BaseException:
            handle.stop()
            raise
    return handle
