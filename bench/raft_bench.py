"""Raft core throughput: a 3-node in-memory cluster driven by the core alone (no I/O).

Keeps ``--inflight`` single-record proposals outstanding at the leader, delivers every message
synchronously, reports durability right after each Ready (in-memory "disk"), and counts what
the leader has committed. The last line printed is JSON.

    python bench/raft_bench.py --quick
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time

from laminar.raft import ConfState, MemoryStorage, Message, RaftConfig, RaftNode, Role


class Cluster:
    def __init__(self, n: int = 3) -> None:
        conf = ConfState(tuple(range(1, n + 1)))
        self.storages = {i: MemoryStorage() for i in conf.voters}
        self.nodes = {
            i: RaftNode(
                i,
                self.storages[i],
                conf,
                config=RaftConfig(seed=i, deliver_committed=False, max_inflight_msgs=64),
            )
            for i in conf.voters
        }
        self.queue: list[Message] = []
        self.core_s = 0.0
        self.messages = 0

    def pump(self) -> None:
        """Drain every node's Ready and deliver messages until the cluster is quiet."""
        nodes = self.nodes
        storages = self.storages
        clock = time.perf_counter
        while True:
            for nid, node in nodes.items():
                t0 = clock()
                if not node.has_ready():
                    self.core_s += clock() - t0
                    continue
                rd = node.ready()
                self.core_s += clock() - t0
                st = storages[nid]
                if rd.reset is not None:
                    st.reset(*rd.reset)
                if rd.entries:
                    st.append(rd.entries)
                    last = rd.entries[-1]
                    self.queue.extend(rd.messages)
                    t0 = clock()
                    node.advance(rd)
                    node.persisted(last.last, last.term)
                    self.core_s += clock() - t0
                else:
                    self.queue.extend(rd.messages)
                    t0 = clock()
                    node.advance(rd)
                    self.core_s += clock() - t0
            if not self.queue:
                return
            q, self.queue = self.queue, []
            self.messages += len(q)
            t0 = clock()
            for m in q:
                nodes[m.to].step(m)
            self.core_s += clock() - t0


def run(seconds: float, inflight: int, batch: int) -> dict[str, float]:
    c = Cluster()
    leader = c.nodes[1]
    leader.campaign()
    c.pump()
    assert leader.role == Role.LEADER
    payload = b"r" * 100
    base = leader.commit
    proposed = leader.last_index
    start = time.perf_counter()
    c.core_s = 0.0
    c.messages = 0
    deadline = start + seconds
    while True:
        outstanding = proposed - leader.commit
        room = inflight - outstanding
        if room > 0:
            items = [(payload, 1)] * min(room, batch)
            t0 = time.perf_counter()
            spans = leader.propose_many(items)
            c.core_s += time.perf_counter() - t0
            proposed = spans[-1][1]
        c.pump()
        if time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - start
    committed = leader.commit - base
    for nid, node in c.nodes.items():
        assert c.storages[nid].last_index() >= leader.commit or node.commit <= leader.commit
    return {
        "proposals_per_s": round(committed / elapsed),
        "core_us_per_proposal": round(c.core_s / committed * 1e6, 3),
        "committed": committed,
        "seconds": round(elapsed, 2),
        "inflight": inflight,
        "messages_per_s": round(c.messages / elapsed),
        "nodes": 3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="short run (a few seconds)")
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--inflight", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=1000, help="max proposals per propose_many")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    seconds = args.seconds or (3.0 if args.quick else 15.0)
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        res = run(seconds, args.inflight, args.batch)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)
    else:
        run(0.3, args.inflight, args.batch)  # warm-up
        res = run(seconds, args.inflight, args.batch)
    res["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps({"bench": "raft_core", **res}))


if __name__ == "__main__":
    main()
