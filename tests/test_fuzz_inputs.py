"""Hostile client frames, peer frames and gossip datagrams against a node (short CI version).

The long version is ``bench/fuzz_inputs.py`` (1,000,000 inputs by default); this runs the
same generators and harness with ``LAMINAR_FUZZ_INPUTS`` in-process inputs per kind (default
5,000) and a sample over real sockets to a 3-node cluster. A failing seed is printed and
replayed with ``LAMINAR_FUZZ_SEED``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import structlog
import uvloop

from laminar.client.localcluster import LocalCluster, free_port_pairs
from tests.fuzz_harness import (
    KINDS,
    Findings,
    InProcessNode,
    capture_logs,
    fuzz_cluster,
    fuzz_in_process,
    install_loop_handler,
    prefix_intact,
    produce_and_read_back,
    read_partitions,
)

INPUTS = int(os.environ.get("LAMINAR_FUZZ_INPUTS", "5000"))
SEED = int(os.environ.get("LAMINAR_FUZZ_SEED", "20261123"))
HOLD = 8
"""Idle connections per port and node that each announce an 80 MiB frame: before the
transport fix these cost 2 x 8 x 100 MiB per node; now about 1.25 MiB each."""


def test_in_process_node_survives_every_kind_of_hostile_input(tmp_path: Path) -> None:
    """On uvloop, as the daemon runs (its sendto and asyncio's differ on bad addresses)."""
    saved = structlog.get_config()
    try:
        findings, kinds, problems = uvloop.run(_in_process(tmp_path))
    finally:
        structlog.configure(**saved)
    summary = f"seed {SEED}: {dict(findings.escaped)} {findings.loop_errors[:5]} "
    summary += f"{dict(findings.logged_errors)} {findings.examples[:5]}"
    assert findings.total == 0, summary
    assert problems == [], f"seed {SEED}: {problems}"
    for kind in KINDS:
        assert kinds[kind].inputs >= INPUTS
    # Most mutated streams are refused: the node closes those connections itself.
    assert kinds["client"].closed_by_node > kinds["client"].connections // 2
    assert kinds["peer"].closed_by_node > kinds["peer"].connections // 2


async def _in_process(root: Path) -> tuple[Findings, dict[str, Any], list[str]]:
    findings = Findings()
    target = InProcessNode(root)
    await target.start()
    capture_logs(findings)
    install_loop_handler(findings)
    try:
        kinds = {}
        for kind in KINDS:
            kinds[kind] = await fuzz_in_process(target, kind, INPUTS, SEED, findings)
        problems = target.healthy()
        problems += prefix_intact(target.before, await read_partitions(target.config.listen))
        problems += await produce_and_read_back(target.config.listen)
    finally:
        await target.stop()
    return findings, kinds, problems


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_cluster_processes_survive_hostile_inputs_on_every_port(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", free_port_pairs(3))
    cluster.start()
    try:
        run = await fuzz_cluster(cluster, max(INPUTS // 8, 300), SEED, HOLD)
    finally:
        cluster.stop()
    logs = "\n".join(cluster.log_tail(n, 5) for n in cluster.nodes)
    assert run.problems == [], f"seed {SEED}: {run.problems}\n{logs}"
    # A length field alone never makes a node allocate the frame it announces.
    assert max(run.hold_growth_kib.values()) < 48 * 1024, run.hold_growth_kib
    assert run.max_rss_growth_kib < 160 * 1024, (run.rss_before, run.rss_after)
    # Every client reply was typed; most hostile connections were closed by the node.
    client = run.results["client"]
    assert client.closed_by_node > client.connections // 2
    assert run.results["peer"].closed_by_node > run.results["peer"].connections // 2
