"""A cluster of laminar nodes run as local child processes: `laminar dev` and the tests use it.

Each node is ``python -m laminar node start ...`` with its log in a file. Nodes run in their
own session so a terminal's Ctrl-C reaches only the supervisor, which then stops them in an
orderly way (SIGTERM, SIGKILL after a timeout). On Linux a node also gets SIGTERM if its
supervisor dies, so no node outlives a crashed test run.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import functools
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from laminar.client.admin import Admin
from laminar.client.descriptions import ClusterStatus
from laminar.errors import LaminarError
from laminar.transport import split_address

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGTERM us when the parent goes away."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _prepare_child(open_files_limit: int | None) -> None:
    """Runs in the child between fork and exec."""
    if sys.platform == "linux":
        _die_with_parent()
    if open_files_limit is not None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files_limit, open_files_limit))


def free_port_pairs(count: int) -> list[tuple[int, int]]:
    """(client port, peer port) per node; the peer port is free for both TCP and UDP. Drawn
    below the kernel's ephemeral range, as ``free_ports`` explains: a node restarted in a test
    could not listen again when an outgoing connection (another node's, another test's) had
    taken its port as a source port meanwhile."""
    ports = free_ports(2 * count, udp_too=range(1, 2 * count, 2))
    return [(ports[i], ports[i + 1]) for i in range(0, 2 * count, 2)]


def free_ports(count: int, udp_too: Iterable[int] = ()) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (e.g. Kafka listeners), drawn below the
    kernel's ephemeral range: a port the kernel handed out for ``bind(0)`` and took back may
    next be the source port of a node's outgoing connection before the node listens on it.
    The ports at the positions in ``udp_too`` are free for UDP as well."""
    low, _high = _ephemeral_range()
    rng = random.Random()
    both = set(udp_too)
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randrange(max(10_000, low - 22_000), low)  # (22,000 ports: rare repeats)
        if port in ports:
            continue
        try:
            _bind(socket.SOCK_STREAM, port).close()
            if len(ports) in both:
                _bind(socket.SOCK_DGRAM, port).close()
        except OSError:
            continue
        ports.append(port)
    return ports


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _bind(kind: int, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, kind)
    sock.bind(("127.0.0.1", port))
    return sock


@dataclass
class LocalNode:
    node_id: int
    client_address: str
    peer_address: str
    data_dir: Path
    log_path: Path
    advertise_peer: str = ""
    """Where the other nodes reach this node's peer port (a fault proxy); "" = peer_address."""
    kafka_address: str = ""
    """This node's Kafka listener (``--kafka-listen``); "" = none."""
    metrics_address: str = ""
    """HTTP address of /metrics, /healthz and /readyz (``--metrics-listen``); "" = off."""
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()


class LocalCluster:
    """Starts, stops, kills and restarts node processes on fixed local ports."""

    def __init__(
        self,
        root: Path,
        ports: Sequence[tuple[int, int]],
        *,
        host: str = "127.0.0.1",
        python: str = sys.executable,
        log_format: str = "json",
        log_level: str = "info",
        extra_args: Sequence[str] = (),
        advertised_peers: Sequence[str] | None = None,
        node_env: Callable[[int], Mapping[str, str]] | None = None,
        tls: bool = False,
        tls_client_auth: bool = False,
        kafka_ports: Sequence[int] | None = None,
        metrics_ports: Sequence[int] | None = None,
        open_files_limit: int | None = None,
    ) -> None:
        """``ports`` holds one (client port, peer port) pair per node; node ids count from 1.

        ``advertised_peers`` (one per node) are the peer addresses the nodes tell each other,
        e.g. fault-injecting proxies in front of the real ports; ``node_env`` adds environment
        variables to one node's process (test seams such as the power-loss journal);
        ``kafka_ports`` (one per node) opens a Kafka listener on each node.
        ``tls`` makes a throw-away CA and node certificates under ``root/tls`` (once) and runs
        the nodes with TLS on both ports and authenticated gossip; ``client_ssl`` is then the
        context clients need (with a client certificate if ``tls_client_auth``).
        ``metrics_ports`` (one per node) turn on each node's HTTP metrics and health port.
        ``open_files_limit`` caps each node process's open files (soft and hard RLIMIT_NOFILE,
        so the node cannot raise it), as a small production limit would.
        """
        if advertised_peers is not None and len(advertised_peers) != len(ports):
            raise ValueError("advertised_peers needs one address per node")
        if kafka_ports is not None and len(kafka_ports) != len(ports):
            raise ValueError("kafka_ports needs one port per node")
        if metrics_ports is not None and len(metrics_ports) != len(ports):
            raise ValueError("metrics_ports needs one port per node")
        self.root = Path(root)
        self.node_env = node_env
        self.python = python
        self.log_format = log_format
        self.log_level = log_level
        self.extra_args = list(extra_args)
        self.open_files_limit = open_files_limit
        self.nodes: dict[int, LocalNode] = {}
        for node_id, (client_port, peer_port) in enumerate(ports, start=1):
            self.nodes[node_id] = LocalNode(
                node_id=node_id,
                client_address=f"{host}:{client_port}",
                peer_address=f"{host}:{peer_port}",
                data_dir=self.root / f"node-{node_id}",
                log_path=self.root / f"node-{node_id}.log",
                advertise_peer=advertised_peers[node_id - 1] if advertised_peers else "",
                kafka_address=f"{host}:{kafka_ports[node_id - 1]}" if kafka_ports else "",
                metrics_address=f"{host}:{metrics_ports[node_id - 1]}" if metrics_ports else "",
            )
        self.tls_dir = self.root / "tls" if tls else None
        self.tls_client_auth = tls_client_auth
        self.client_ssl: ssl.SSLContext | None = None
        self.login: tuple[str, str] | None = None
        """(user, password) ``wait_ready`` connects with once the cluster has users."""
        if self.tls_dir is not None:
            self.client_ssl = self._make_certificates(self.tls_dir)

    @property
    def bootstrap(self) -> str:
        return ",".join(node.client_address for node in self.nodes.values())

    @property
    def kafka_bootstrap(self) -> str:
        """The Kafka listeners, comma-separated (Kafka clients' bootstrap.servers)."""
        return ",".join(n.kafka_address for n in self.nodes.values() if n.kafka_address)

    @property
    def peers(self) -> str:
        return ",".join(
            f"{n.node_id}={n.advertise_peer or n.peer_address}" for n in self.nodes.values()
        )

    def command(self, node_id: int) -> list[str]:
        node = self.nodes[node_id]
        return [
            self.python,
            "-m",
            "laminar",
            "node",
            "start",
            "--node-id",
            str(node_id),
            "--data-dir",
            str(node.data_dir),
            "--listen",
            node.client_address,
            "--peer-listen",
            node.peer_address,
            *(["--advertise-peer", node.advertise_peer] if node.advertise_peer else []),
            *(["--kafka-listen", node.kafka_address] if node.kafka_address else []),
            "--peers",
            self.peers,
            "--log-format",
            self.log_format,
            "--log-level",
            self.log_level,
            *(["--metrics-listen", node.metrics_address] if node.metrics_address else []),
            *self._tls_args(node_id),
            *self.extra_args,
        ]

    def _make_certificates(self, directory: Path) -> ssl.SSLContext:
        """CA, one certificate per node, a client certificate and a gossip key (kept across
        restarts of the cluster); returns the clients' context."""
        from laminar.devcerts import Authority, write_cert, write_node_cert
        from laminar.tls import client_context

        ca = directory / "ca.pem"
        client = directory / "client.pem"
        if not ca.exists():
            authority = Authority.create("laminar dev CA")
            authority.write(directory)
            write_cert(authority, directory, "client")
            (directory / "gossip.keys").write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
        else:
            authority = Authority.load(directory)
        for node in self.nodes.values():  # also nodes added since the CA was made
            if not (directory / f"node-{node.node_id}.pem").exists():
                hosts = {split_address(node.client_address)[0], split_address(node.peer_address)[0]}
                write_node_cert(authority, directory, node.node_id, sorted(hosts))
        if self.tls_client_auth:
            return client_context(ca, client, directory / "client.key")
        return client_context(ca)

    def _tls_args(self, node_id: int) -> list[str]:
        directory = self.tls_dir
        if directory is None:
            return []
        return [
            "--tls-cert",
            str(directory / f"node-{node_id}.pem"),
            "--tls-key",
            str(directory / f"node-{node_id}.key"),
            "--tls-ca",
            str(directory / "ca.pem"),
            "--tls-client-auth",
            "required" if self.tls_client_auth else "none",
            "--gossip-key-file",
            str(directory / "gossip.keys"),
        ]

    def busy_addresses(self) -> list[str]:
        """Node addresses something else already listens on (TCP, and UDP for gossip)."""
        busy: list[str] = []
        for node in self.nodes.values():
            checks = [(node.client_address, (socket.SOCK_STREAM,))]
            checks.append((node.peer_address, (socket.SOCK_STREAM, socket.SOCK_DGRAM)))
            if node.kafka_address:
                checks.append((node.kafka_address, (socket.SOCK_STREAM,)))
            if node.metrics_address:
                checks.append((node.metrics_address, (socket.SOCK_STREAM,)))
            for address, kinds in checks:
                host, port = split_address(address)
                for kind in kinds:
                    with socket.socket(socket.AF_INET, kind) as probe:
                        if kind == socket.SOCK_STREAM:
                            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                        try:
                            probe.bind((host, port))
                        except OSError:
                            busy.append(address)
                            break
        return busy

    def start(self) -> None:
        for node_id in self.nodes:
            self.start_node(node_id)

    def start_node(self, node_id: int) -> LocalNode:
        node = self.nodes[node_id]
        if node.running:
            return node
        self.root.mkdir(parents=True, exist_ok=True)
        node.data_dir.mkdir(parents=True, exist_ok=True)
        if node._log_file is not None:
            node._log_file.close()
        node._log_file = open(node.log_path, "ab")  # noqa: SIM115 - lives as long as the node
        env = None
        if self.node_env is not None:
            env = {**os.environ, **self.node_env(node_id)}
        node.process = subprocess.Popen(
            self.command(node_id),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=node._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=functools.partial(_prepare_child, self.open_files_limit),
        )
        return node

    def stop_node(self, node_id: int, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout`` s; returns the exit code."""
        node = self.nodes[node_id]
        process = node.process
        if process is None:
            return None
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                process.wait()
        self._close_log(node)
        return process.returncode

    def kill_node(self, node_id: int) -> None:
        """SIGKILL: a crash, no chance to flush."""
        node = self.nodes[node_id]
        if node.process is not None and node.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.process.pid, signal.SIGKILL)
            node.process.wait()
        self._close_log(node)

    def restart_node(self, node_id: int, timeout: float = 10.0) -> LocalNode:
        self.stop_node(node_id, timeout)
        return self.start_node(node_id)

    def stop(self, timeout: float = 10.0) -> dict[int, int | None]:
        """Stop every node: SIGTERM to all first, so they shut down in parallel."""
        for node in self.nodes.values():
            if node.running:
                assert node.process is not None
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.process.pid, signal.SIGTERM)
        return {node_id: self.stop_node(node_id, timeout) for node_id in self.nodes}

    def exited(self) -> list[LocalNode]:
        """Nodes that were started and are no longer running."""
        return [n for n in self.nodes.values() if n.process is not None and not n.running]

    def log_tail(self, node_id: int, lines: int = 20) -> str:
        path = self.nodes[node_id].log_path
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    async def wait_ready(self, timeout: float = 30.0, *, nodes: int | None = None) -> ClusterStatus:
        """Wait until the cluster answers status with a metadata leader and ``nodes`` alive."""
        expected = len(self.nodes) if nodes is None else nodes
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last_problem = "no answer yet"
        while loop.time() < deadline:
            crashed = [n for n in self.exited() if n.returncode not in (0, None)]
            if crashed:
                node = crashed[0]
                raise RuntimeError(
                    f"node {node.node_id} exited with code {node.returncode}; see {node.log_path}"
                )
            try:
                async with Admin(
                    self.bootstrap, request_timeout_ms=2_000, ssl=self.client_ssl, **self._login()
                ) as admin:
                    status = await admin.cluster_status()
                alive = sum(1 for m in status.members if m.state == "alive")
                # Gossip may still call a just-restarted node alive: ask each running node too.
                silent = [
                    n.node_id
                    for n in self.nodes.values()
                    if n.running and not (await self._answers(n.client_address))
                ]
                if status.metadata_leader and alive >= expected and not silent:
                    return status
                last_problem = (
                    f"{alive} of {expected} nodes alive, metadata leader "
                    f"{status.metadata_leader}, not answering yet: {silent}"
                )
            except (ConnectionError, LaminarError) as exc:
                last_problem = str(exc)
            await asyncio.sleep(0.2)
        raise TimeoutError(f"cluster not ready after {timeout:.0f} s: {last_problem}")

    def _login(self) -> dict[str, str | None]:
        user, password = self.login or (None, None)
        return {"username": user, "password": password}

    async def _answers(self, address: str) -> bool:
        """Whether the node at ``address`` answers cluster status itself."""
        try:
            async with Admin(
                address, request_timeout_ms=2_000, ssl=self.client_ssl, **self._login()
            ) as admin:
                await admin.cluster_status()
        except (ConnectionError, LaminarError):
            return False
        return True

    @staticmethod
    def _close_log(node: LocalNode) -> None:
        if node._log_file is not None:
            node._log_file.close()
            node._log_file = None
