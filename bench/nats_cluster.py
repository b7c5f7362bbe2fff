"""A three-server NATS JetStream cluster on this machine, for the benches' baselines.

Uses Debian's ``nats-server`` (on PATH or /usr/sbin) and ``nats-py``; installs nothing:
``nats_available()`` says why the NATS side cannot run, and the bench then skips it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

SERVER_PATHS = ("/usr/sbin/nats-server", "/usr/bin/nats-server")


def nats_server() -> str | None:
    """The nats-server executable, or None (Debian puts it in /usr/sbin, often off PATH)."""
    found = shutil.which("nats-server")
    if found:
        return found
    return next((p for p in SERVER_PATHS if Path(p).exists()), None)


def nats_available() -> str | None:
    """Why the NATS side cannot run, or None."""
    if nats_server() is None:
        return "nats-server is not installed (Debian: apt-get install nats-server)"
    try:
        import nats  # noqa: F401
    except ImportError:
        return "nats-py is not installed (pip install nats-py)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_listening(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def nats_cluster(work: Path, servers: int = 3) -> AsyncIterator[tuple[list[str], list[int]]]:
    """Start ``servers`` clustered JetStream servers storing under ``work``; yields their
    client URLs and process ids once every one listens, and stops them (by PID) on exit."""
    executable = nats_server()
    assert executable is not None, "check nats_available() first"
    ports = [(free_port(), free_port()) for _ in range(servers)]
    routes = ",".join(f"nats://127.0.0.1:{c}" for _, c in ports)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, (client_port, cluster_port) in enumerate(ports):
            store = work / f"nats-{i}"
            store.mkdir(parents=True)
            procs.append(
                subprocess.Popen(
                    [
                        executable,
                        "-a",
                        "127.0.0.1",
                        "-p",
                        str(client_port),
                        "-js",
                        "-sd",
                        str(store),
                        "-n",
                        f"n{i}",
                        "--cluster_name",
                        "bench",
                        "--cluster",
                        f"nats://127.0.0.1:{cluster_port}",
                        "--routes",
                        routes,
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        for port, _ in ports:  # every server listens before anyone connects
            await wait_listening(port, 30)
        yield [f"nats://127.0.0.1:{p}" for p, _ in ports], [proc.pid for proc in procs]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


async def add_r3_stream(js: Any, name: str, subject: str, timeout: float = 30) -> None:
    """An R3 file-storage stream, retried while the cluster elects its meta leader."""
    from nats.js.api import StorageType, StreamConfig

    deadline = time.monotonic() + timeout
    while True:
        try:
            config = StreamConfig(
                name=name, subjects=[subject], num_replicas=3, storage=StorageType.FILE
            )
            await js.add_stream(config)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
