"""Fuzz every input a network peer can send a node: client frames, peer frames, gossip.

Two phases:

1. In-process (the bulk, ``--inputs`` in all, split evenly over the three kinds): a real node
   runs in this process on uvloop, and hostile inputs enter through the protocol objects its
   own listeners create (client server, peer network, SWIM driver), over an in-memory
   transport: the node's full parsing, decoding, Raft and request-handling path at a few
   thousand inputs per second. The same path's cost for unmutated frames is the baseline.
2. Real processes (``--socket-inputs`` per kind): a 3-node cluster (LocalCluster) gets a
   sample over real client TCP, peer TCP and gossip UDP sockets, then idle connections that
   each announce an 80 MiB frame; node RSS is read from /proc before, while holding them,
   and after (VmHWM: the peak over the whole run).

Afterwards each node must be running, a well-behaved client must produce and read back, and
every replica's bytes written before the run must be byte-identical. Any exception escaping
an entry point, any unhandled error in a task or callback, and any node log event at level
error counts as a crash. Prints readable lines, then one JSON line last.

    python bench/fuzz_inputs.py                     # 1,000,000 in-process + 3 x 20,000
    python bench/fuzz_inputs.py --inputs 30000 --socket-inputs 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
    rss_kib,
)


async def in_process(root: Path, total: int, seed: int) -> dict[str, Any]:
    findings = Findings()
    target = InProcessNode(root)
    await target.start()
    capture_logs(findings)
    install_loop_handler(findings)
    per_kind: dict[str, dict[str, float]] = {}
    pid = int(Path("/proc/self/stat").read_text().split()[0])
    rss_start = rss_kib(pid)["VmRSS"]
    try:
        for kind in KINDS:
            before = rss_kib(pid)["VmRSS"]
            result = await fuzz_in_process(target, kind, total // len(KINDS), seed, findings)
            await asyncio.sleep(1.0)
            per_kind[kind] = {
                "inputs": result.inputs,
                "connections": result.connections,
                "closed_by_node": result.closed_by_node,
                "us_per_input": round(result.seconds / result.inputs * 1e6, 1),
                "us_per_valid_input": round(result.valid_seconds / result.valid_inputs * 1e6, 1),
                "rss_growth_kib": rss_kib(pid)["VmRSS"] - before,
            }
            print(f"in-process {kind}: {per_kind[kind]}", flush=True)
        problems = target.healthy()
        problems += prefix_intact(target.before, await read_partitions(target.config.listen))
        problems += await produce_and_read_back(target.config.listen)
        summary = {
            "kinds": per_kind,
            "escaped": sum(findings.escaped.values()),
            "loop_errors": len(findings.loop_errors),
            "logged_errors": sum(findings.logged_errors.values()),
            "benign_noise": dict(findings.benign),
            "examples": findings.examples[:10],
            "problems": problems,
            "rss_growth_kib": rss_kib(pid)["VmRSS"] - rss_start,
        }
    finally:  # (requests still waiting when the node stops end then: not counted)
        await target.stop()
    return summary


async def real_cluster(root: Path, per_kind: int, seed: int, hold: int) -> dict[str, Any]:
    cluster = LocalCluster(root / "cluster", free_port_pairs(3))
    cluster.start()
    try:
        run = await fuzz_cluster(cluster, per_kind, seed, hold)
    finally:
        cluster.stop()
    results = {
        kind: {
            "inputs": r.inputs,
            "connections": r.connections,
            "closed_by_node": r.closed_by_node,
            "replies": r.replies,
            "typed_error_codes": dict(sorted(r.typed_errors.items())),
        }
        for kind, r in run.results.items()
    }
    for kind, result in results.items():
        print(f"cluster {kind}: {result}", flush=True)
    print(f"cluster rss before (KiB): {run.rss_before}", flush=True)
    print(f"cluster rss after (KiB): {run.rss_after}", flush=True)
    print(f"cluster rss growth holding {hold}+{hold} huge-frame headers: {run.hold_growth_kib}")
    return {
        "kinds": results,
        "rss_before_kib": run.rss_before,
        "rss_after_kib": run.rss_after,
        "max_rss_growth_kib": run.max_rss_growth_kib,
        "hold_connections_per_port": hold,
        "hold_rss_growth_kib": run.hold_growth_kib,
        "problems": run.problems,
        "seconds": round(run.seconds, 1),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="laminar-fuzz-", ignore_cleanup_errors=True) as tmp:
        local = await in_process(Path(tmp) / "in-process", args.inputs, args.seed)
        cluster = (
            await real_cluster(Path(tmp), args.socket_inputs, args.seed, args.hold)
            if args.socket_inputs
            else None
        )
    crashes = local["escaped"] + local["loop_errors"] + local["logged_errors"]
    problems = local["problems"] + (cluster["problems"] if cluster else [])
    for line in local["examples"]:
        print(f"  finding: {line}")
    for problem in problems:
        print(f"  problem: {problem}")
    kinds = local["kinds"]
    sockets = {k: v["inputs"] for k, v in cluster["kinds"].items()} if cluster else {}
    return {
        "bench": "fuzz_inputs",
        "seed": args.seed,
        "inputs": {kind: kinds[kind]["inputs"] for kind in kinds},
        "socket_inputs": sockets,
        "total_inputs": sum(kinds[k]["inputs"] for k in kinds) + sum(sockets.values()),
        "crashes": crashes,
        "benign_noise": local["benign_noise"],
        "problems": len(problems),
        "us_per_input": {k: kinds[k]["us_per_input"] for k in kinds},
        "us_per_valid_input": {k: kinds[k]["us_per_valid_input"] for k in kinds},
        "in_process_rss_growth_kib": local["rss_growth_kib"],
        "cluster_max_rss_growth_kib": cluster["max_rss_growth_kib"] if cluster else None,
        "cluster_hold_rss_growth_kib": cluster["hold_rss_growth_kib"] if cluster else None,
        "max_rss_kib_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "seconds": round(time.perf_counter() - started, 1),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=1_000_000, help="in-process, all kinds")
    parser.add_argument("--socket-inputs", type=int, default=20_000, help="per kind, 0: skip")
    parser.add_argument("--hold", type=int, default=32, help="huge-frame connections per port")
    parser.add_argument("--seed", type=int, default=1)
    summary = uvloop.run(main(parser.parse_args()))
    print(json.dumps(summary))
    sys.exit(1 if summary["crashes"] or summary["problems"] else 0)
