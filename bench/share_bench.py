"""Throughput of the share-partition state machine (laminar/queues) alone: acquire + ack.

No node, no network: records/s that one core can acquire and acknowledge through
``SharePartition`` (records taken, encoded and committed as the driver would), for batches of
100 and 500, with 8 members taking turns and acking their batch in shuffled order (receipts
arrive batched but not sorted); and as the node drives it (``acquire_runs`` /
``settle_runs``: the runs a share fetch carries, acked in the order a member sends them). The
baseline is a plain dict-based loop doing the least such a queue must (offset -> (member,
count) on acquire, a receipt check and a delete on ack). The last line is one JSON object.

    python bench/share_bench.py [--records N]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from laminar.queues.partition import Acknowledgement, ShareConfig, SharePartition
from laminar.queues.records import encode

MEMBERS = [f"member-{i}" for i in range(8)]


def run_state_machine(total: int, batch: int, seed: int = 1) -> float:
    rng = random.Random(seed)
    sp = SharePartition(ShareConfig(max_in_flight=20_000), 0)
    sp.end_offset(10**12)
    done = 0
    now = 0
    started = time.perf_counter()
    while done < total:
        for member in MEMBERS:
            now += 1
            sp.end_offset(sp.window_end)
            got = sp.acquire(member, batch, now).value
            rng.shuffle(got)
            result = sp.acknowledge([Acknowledgement(d.receipt, "ack") for d in got], now)
            assert result.value.count(None) == len(got)
            for record in sp.take_batch():
                encode(record)
            sp.records_committed(sp.written)
            done += len(got)
    return done / (time.perf_counter() - started)


def run_state_machine_runs(total: int, batch: int) -> float:
    """The node's form: acquired runs in, acked runs back, no object per offset."""
    sp = SharePartition(ShareConfig(max_in_flight=20_000), 0)
    sp.end_offset(10**12)
    done = 0
    now = 0
    started = time.perf_counter()
    while done < total:
        for member in MEMBERS:
            now += 1
            sp.end_offset(sp.window_end)
            got = sp.acquire_runs(member, batch, now).value
            runs = [(lo, hi - lo, count, "ack", 0) for lo, hi, count, _until in got]
            result = sp.settle_runs(member, runs, now)
            assert not any(result.value)
            for record in sp.take_batch():
                encode(record)
            sp.records_committed(sp.written)
            done += sum(hi - lo for lo, hi, _count, _until in got)
    return done / (time.perf_counter() - started)


def run_dict_baseline(total: int, batch: int, seed: int = 1) -> float:
    rng = random.Random(seed)
    held: dict[int, tuple[str, int]] = {}
    next_offset = 0
    done = 0
    started = time.perf_counter()
    while done < total:
        for member in MEMBERS:
            got = []
            for o in range(next_offset, next_offset + batch):
                held[o] = (member, 1)
                got.append((member, o, 1))
            next_offset += batch
            rng.shuffle(got)
            for m, o, count in got:
                if held.get(o) == (m, count):
                    del held[o]
            done += len(got)
    return done / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=400_000)
    args = parser.parse_args()
    out: dict[str, float] = {}
    for batch in (100, 500):
        sm = max(run_state_machine(args.records, batch) for _ in range(3))
        runs = max(run_state_machine_runs(args.records, batch) for _ in range(3))
        base = max(run_dict_baseline(args.records, batch) for _ in range(3))
        out[f"share_partition_batch{batch}_per_s"] = round(sm)
        out[f"share_partition_runs_batch{batch}_per_s"] = round(runs)
        out[f"dict_baseline_batch{batch}_per_s"] = round(base)
        out[f"ratio_batch{batch}"] = round(sm / base, 3)
        print(
            f"batch {batch}: state machine {sm:,.0f}/s, as runs {runs:,.0f}/s, "
            f"dict baseline {base:,.0f}/s"
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
