"""The fault-injection suite, short version (the long one: python -m tests.faults --minutes 30).

The first tests check the instruments themselves (checker, power-loss seam, proxy) so that a
clean cluster run means something; the slow ones run real clusters under fault schedules.
``LAMINAR_FAULT_SEED`` picks another seed; every run prints its schedule and replay command.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from laminar.framing import encode_frame
from laminar.node.config import NodeConfig
from laminar.node.raft_codec import encode_hello
from laminar.protocol import KIND_PEER
from laminar.segment.fileio import POWERLOSS_JOURNAL_ENV
from tests.faults.checker import History, check
from tests.faults.harness import FaultRun, RunConfig
from tests.faults.powerloss import lose_power, synced_lengths
from tests.faults.proxy import FaultProxy
from tests.faults.schedule import make_schedule

SEED = int(os.environ.get("LAMINAR_FAULT_SEED", "1"))


# the instruments ------------------------------------------------------------------------------
def test_checker_names_every_kind_of_anomaly() -> None:
    history = History(
        sent={"a", "b", "c", "d", "e"},
        acked={"a": (0, 0), "b": (0, 1), "c": (1, 0)},
        consumed=[(0, 0, "a"), (1, 5, "x")],
    )
    logs = {0: [(0, "a"), (2, "c"), (1, "d")], 1: [(0, "d"), (1, "zz")]}
    anomalies = check(history, logs, ["divergence: replica 2"]).anomalies
    kinds = sorted({a.split(":", 1)[0] for a in anomalies})
    assert kinds == ["dirty_read", "divergence", "duplicate", "lost", "moved", "order", "phantom"]
    assert any("lost: 'b'" in a for a in anomalies)  # acked at (0, 1), nowhere in the log
    assert any("moved: 'c'" in a for a in anomalies)  # acked at (1, 0), found at (0, 2)


def test_checker_accepts_a_clean_history() -> None:
    history = History(sent={"a", "b", "c"}, acked={"a": (0, 0), "b": (0, 2)})
    verdict = check(history, {0: [(0, "a"), (1, "c"), (2, "b")]}, [])
    assert verdict.anomalies == []
    assert (verdict.acked, verdict.indeterminate, verdict.indeterminate_written) == (2, 1, 1)


def test_powerloss_journal_records_synced_lengths_and_the_cut_keeps_only_them(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal"
    data = tmp_path / "data"
    data.mkdir()
    script = f"""
import os
from laminar.segment import fileio
path = {str(data / "seg.log")!r}
handle = fileio.open_append(__import__("pathlib").Path(path))
os.write(handle.fd, b"A" * 100)
os.fdatasync(handle.fd)
os.write(handle.fd, b"B" * 50)   # written, never synced
fileio.write_atomic(__import__("pathlib").Path({str(data / "state.json")!r}), b"{{}}")
open({str(data / "never.index")!r}, "wb").write(b"C" * 30)
os._exit(0)  # like SIGKILL: no cleanup
"""
    env = {**os.environ, POWERLOSS_JOURNAL_ENV: str(journal)}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    synced = synced_lengths(journal)
    assert synced[(data / "seg.log").stat().st_ino] == 100
    assert synced[(data / "state.json").stat().st_ino] == 2
    report = lose_power(data, journal, random.Random(1), garble=False)
    assert (data / "seg.log").read_bytes() == b"A" * 100
    assert (data / "state.json").read_bytes() == b"{}"
    assert (data / "never.index").read_bytes() == b""
    assert report.bytes_lost == 80


def test_powerloss_seam_costs_nothing_when_off() -> None:
    script = "import os, laminar.segment.fileio; print(os.fsync.__name__, os.fdatasync.__name__)"
    env = {k: v for k, v in os.environ.items() if k != POWERLOSS_JOURNAL_ENV}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, check=True, capture_output=True, timeout=60
    )
    assert out.stdout.split() == [b"fsync", b"fdatasync"]  # the os functions, not wrapped


def test_a_node_advertises_its_peer_listen_address_unless_told_otherwise(tmp_path: Path) -> None:
    plain = NodeConfig(node_id=1, data_dir=tmp_path, listen="127.0.0.1:9000")
    assert plain.advertise_peer == plain.peer_listen == "127.0.0.1:9001"
    proxied = NodeConfig(node_id=1, data_dir=tmp_path, advertise_peer="127.0.0.1:7000")
    assert proxied.advertise_peer == "127.0.0.1:7000"
    with pytest.raises(ValueError):
        NodeConfig(node_id=1, data_dir=tmp_path, advertise_peer="no-port")


def test_schedule_is_replayable_from_its_seed() -> None:
    faults = ["kill_one", "pause_leader", "split", "powerloss_one", "truncate_data"]
    first = [str(c) for c in make_schedule(42, 5, faults, 12, mixed=True)]
    assert first == [str(c) for c in make_schedule(42, 5, faults, 12, mixed=True)]
    assert first != [str(c) for c in make_schedule(43, 5, faults, 12, mixed=True)]
    with pytest.raises(ValueError, match="five nodes"):
        make_schedule(1, 3, ["split"], 1)


async def _udp_node() -> tuple[asyncio.DatagramTransport, asyncio.Queue[bytes], int]:
    received: asyncio.Queue[bytes] = asyncio.Queue()

    class Receiver(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
            received.put_nowait(data)

    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(Receiver, local_addr=("127.0.0.1", 0))
    return transport, received, transport.get_extra_info("sockname")[1]  # type: ignore[return-value]


async def _udp_and_tcp_node() -> tuple[
    asyncio.DatagramTransport, asyncio.Queue[bytes], int, socket.socket
]:
    """A UDP node and a TCP socket bound to the same port number, as on a real node. (The
    port is free for UDP; another process, a test on another worker say, may hold it for
    TCP: then another port.)"""
    for _ in range(20):
        transport, received, port = await _udp_node()
        tcp = socket.socket()
        try:
            tcp.bind(("127.0.0.1", port))
        except OSError:
            tcp.close()
            transport.close()
            continue
        return transport, received, port, tcp
    raise AssertionError("no port free for both UDP and TCP")


async def test_proxy_cuts_one_direction_of_gossip_and_of_a_peer_connection() -> None:
    gossip1, inbox1, port1 = await _udp_node()
    gossip2, inbox2, port2, tcp = await _udp_and_tcp_node()
    accepted: asyncio.Queue[asyncio.StreamReader] = asyncio.Queue()

    async def on_peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(reader)
        await asyncio.sleep(30)

    server = await asyncio.start_server(on_peer, sock=tcp)
    proxy = FaultProxy({1: ("127.0.0.1", port1), 2: ("127.0.0.1", port2)})
    advertised = await proxy.start()
    host, proxy2 = advertised[2].split(":")
    try:
        gossip1.sendto(b"ping 1->2", (host, int(proxy2)))
        assert await asyncio.wait_for(inbox2.get(), 5) == b"ping 1->2"
        reader, writer = await asyncio.open_connection(host, int(proxy2))
        writer.write(b"".join(encode_frame(KIND_PEER, encode_hello(1, "c", "x:1", "x:2"))))
        writer.write(b"before")
        upstream = await asyncio.wait_for(accepted.get(), 5)
        assert (await asyncio.wait_for(upstream.readuntil(b"before"), 5)).endswith(b"before")

        proxy.cut({(1, 2)})
        gossip1.sendto(b"lost", (host, int(proxy2)))
        writer.write(b"during")
        await writer.drain()
        host1, proxy1 = advertised[1].split(":")
        gossip2.sendto(b"ping 2->1", (host1, int(proxy1)))  # the other way still flows
        assert await asyncio.wait_for(inbox1.get(), 5) == b"ping 2->1"
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(upstream.read(1), 0.5)
        assert inbox2.empty()

        proxy.heal()  # bytes were lost on this connection: it is closed, never resumed
        assert await asyncio.wait_for(upstream.read(100), 5) == b""
        assert await asyncio.wait_for(reader.read(100), 5) == b""  # the dialer's side too
    finally:
        await proxy.stop()
        server.close()
        gossip1.close()
        gossip2.close()


# real clusters ------------------------------------------------------------------------------
def _run(tmp_path: Path, **settings: object) -> None:
    settings.setdefault("recover_timeout", 40.0)  # recovery normally takes 1-4 s
    config = RunConfig(tmp_path / "run", seed=SEED, **settings)  # type: ignore[arg-type]
    report = asyncio.run(FaultRun(config).execute())
    print(report.summary())
    assert report.verdict is not None and report.verdict.acked > 0, report.summary()
    assert not report.anomalies, report.summary() + "\n" + "\n".join(report.events[-40:])


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_three_nodes_each_fault_alone(tmp_path: Path) -> None:
    """Crashes, pauses, partitions, power loss and client kills, one at a time, while every
    node keeps only three log files open: each hosts more logs than that, so data files are
    closed and reopened all the time, handles a flush still holds included, and every
    acknowledged write must survive the power cuts too (seed 11 with flushes that skipped
    taken-away handles lost the metadata group's acknowledged writes: no node came back)."""
    faults = [
        "kill_leader",
        "pause_leader",
        "isolate_leader",
        "oneway",
        "powerloss_one",
        "kill_majority",
        "client_kill",
        "powerloss_all",
        "kill_all",
        "delete_index",
    ]
    _run(tmp_path, nodes=3, faults=faults, cycles=len(faults), max_open_log_files=3)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_five_nodes_split_and_mixed_faults(tmp_path: Path) -> None:
    """3-vs-2 splits, leader isolation and crashes, sometimes two at once."""
    faults = ["split", "isolate_leader", "kill_leader", "powerloss_one", "client_kill"]
    _run(tmp_path, nodes=5, faults=faults, cycles=4, mixed=True)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("damage", ["bitflip_sealed", "truncate_data"])
def test_disk_corruption_on_a_minority(tmp_path: Path, damage: str) -> None:
    """One node's sealed segment damaged: it must notice, never serve it, and resync (the
    replica is repaired: cut before the damage, or started over when it cannot be opened, and
    re-admitted to its group before it votes again)."""
    _run(tmp_path, nodes=3, faults=[damage], cycles=1, fail_fast=True, recover_timeout=20.0)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_replica_that_lost_its_data_must_not_vote_acked_writes_away(tmp_path: Path) -> None:
    """Writes commit on A and C while B is cut off; A loses its partition directories and C
    goes down. A must not come back as a voter with an empty log: A and B would elect B and
    the writes acked in between would be gone (before the amnesia fix, seed 1 lost 224 of
    2,816 acked writes)."""
    _run(tmp_path, nodes=3, faults=["amnesia"], cycles=1, recover_timeout=20.0)
