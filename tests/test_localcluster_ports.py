"""Ports for local test clusters come from below the kernel's ephemeral range, where no
outgoing connection can take one as its source port while a node is down and restarting."""

from __future__ import annotations

import socket
from pathlib import Path

from laminar.client.localcluster import free_port_pairs, free_ports


def test_node_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    pairs = free_port_pairs(4)
    ports = [port for pair in pairs for port in pair]
    assert len(set(ports)) == len(ports) == 8
    assert all(10_000 <= port < low for port in ports)
    for client, peer in pairs:
        for kind, port in ((socket.SOCK_STREAM, client), (socket.SOCK_STREAM, peer)):
            with socket.socket(socket.AF_INET, kind) as sock:
                sock.bind(("127.0.0.1", port))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:  # the gossip's port
            udp.bind(("127.0.0.1", peer))
    assert all(10_000 <= port < low for port in free_ports(3))
