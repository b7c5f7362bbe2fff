"""Metadata checkpoint size and cost at 1,000 and 10,000 partitions (in-process).

The state: topics of 100 partitions (RF 3 over 5 nodes) with a leader recorded for every
partition, 5 registered nodes and the 4,096 remembered request ids a busy cluster holds. For
each size it times, best of a few rounds: building the checkpoint batch on the leader
(serialize + zstd), the in-step check every node makes (serialize + compare), and rebuilding
a state from the batch (inflate + parse). Baseline in the same run: replaying the commands
that built the state (what a node without checkpoints applies on every restart).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from laminar.node import metadata_checkpoint as checkpoints
from laminar.node.metadata import MetadataState

NODES = [1, 2, 3, 4, 5]


def commands(partitions: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for node in NODES:
        out.append(
            {
                "op": "register_node",
                "node_id": node,
                "client_address": f"h:{node}",
                "peer_address": f"h:{node + 100}",
                "incarnation": f"inc-{node}",
                "request_id": f"reg-{node}",
            }
        )
    topics = partitions // 100
    for t in range(topics):
        replicas = [[NODES[(p + k) % 5] for k in range(3)] for p in range(100)]
        settings = {
            "partitions": 100,
            "replication_factor": 3,
            "segment_bytes": 1 << 26,
            "segment_ms": 604_800_000,
            "retention_ms": 604_800_000,
            "retention_bytes": None,
        }
        out.append(
            {
                "op": "create_topic",
                "name": f"topic-{t:05d}",
                "settings": settings,
                "replicas": replicas,
                "request_id": f"create-{t}",
            }
        )
    rng = random.Random(partitions)
    n = 0
    while n < max(partitions, 4096):
        t, p = divmod(n % partitions, 100)
        out.append(
            {
                "op": "set_leader",
                "topic_id": t + 1,
                "partition": p,
                "leader": NODES[p % 5],
                "term": 1 + n // partitions,
                "request_id": f"{rng.getrandbits(128):032x}",  # uuid4().hex-like
            }
        )
        n += 1
    return out


def best(rounds: int, action: Any) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return min(times)


def measure(partitions: int, rounds: int) -> dict[str, Any]:
    history = commands(partitions)

    def replay() -> MetadataState:
        state = MetadataState()
        for index, command in enumerate(history):
            state.apply_once(command, index)
        return state

    state = replay()
    batch = checkpoints.checkpoint_batch(state, 0)
    data = checkpoints.encode(state)

    def rebuild() -> None:
        checkpoints.restore(MetadataState(), checkpoints.checkpoint_data(batch) or b"")

    copy = MetadataState()
    checkpoints.restore(copy, data)
    assert copy == state
    return {
        "partitions": partitions,
        "commands": len(history),
        "state_json_bytes": len(data),
        "checkpoint_batch_bytes": len(batch),
        "build_ms": round(best(rounds, lambda: checkpoints.checkpoint_batch(state, 0)) * 1e3, 1),
        "in_step_check_ms": round(best(rounds, lambda: checkpoints.encode(state) == data) * 1e3, 1),
        "rebuild_ms": round(best(rounds, rebuild) * 1e3, 1),
        "baseline_replay_ms": round(best(rounds, replay) * 1e3, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results = [measure(n, args.rounds) for n in (1_000, 10_000)]
    print(json.dumps({"sizes": results, "rounds": args.rounds, "note": "best of rounds, ms"}))


if __name__ == "__main__":
    main()
