"""Client-side cost of each codec: build and decode record batches of varied JSON-like events.

For each codec, a 256 KiB batch of ~80-byte events is built (`build_batch`, compressing the
records section) and decoded back (`decode_records`, inflating first), in this process; the
baseline is the same work uncompressed, interleaved with it in the same run, and each figure
is the fastest of its rounds (the machine is shared). Also reports each codec's size ratio
and inflate speed (MB/s of records section produced). The last line is one JSON object.

    python bench/compression_bench.py --quick
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from produce_bench import event_records

from laminar.segment import compression
from laminar.segment.batch import build_batch, decode_records


def fastest(work: Callable[[], object], rounds: int) -> float:
    """Seconds of the fastest of ``rounds`` runs: the machine is shared, the minimum is the
    cost of the work itself."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def main(args: argparse.Namespace) -> dict[str, Any]:
    now = int(time.time() * 1000)
    values = event_records(args.records)
    records = [(None, value, (), now + i) for i, value in enumerate(values)]
    batches = {code: build_batch(records, compression=code) for code in range(5)}
    plain_bytes = len(batches[compression.NONE]) - 68
    build: dict[int, float] = dict.fromkeys(batches, float("inf"))
    decode = dict(build)
    inflate = dict(build)
    for _ in range(args.rounds):  # codecs interleaved, so load spikes hit all of them alike
        for code, batch in batches.items():
            build[code] = min(
                build[code], fastest(lambda c=code: build_batch(records, compression=c), 1)
            )
            decode[code] = min(decode[code], fastest(lambda b=batch: decode_records(b), 1))
            if code:
                section = memoryview(batch)[68:]
                inflate[code] = min(
                    inflate[code],
                    fastest(lambda c=code, s=section: compression.decompress(c, s), 1),
                )
    count = len(records)
    out: dict[str, Any] = {
        "records_per_batch": count,
        "record_bytes": plain_bytes // count,
        "none_batch_bytes": len(batches[compression.NONE]),
        "none_build_records_per_s": round(count / build[compression.NONE]),
        "none_decode_records_per_s": round(count / decode[compression.NONE]),
    }
    for name, code in compression.CODECS.items():
        out[f"{name}_ratio"] = round(len(batches[0]) / len(batches[code]), 2)
        out[f"{name}_build_records_per_s"] = round(count / build[code])
        out[f"{name}_decode_records_per_s"] = round(count / decode[code])
        out[f"{name}_decode_vs_none"] = round(decode[compression.NONE] / decode[code], 3)
        out[f"{name}_inflate_mb_s"] = round(plain_bytes / inflate[code] / 1e6)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 rounds instead of 60")
    parser.add_argument("--records", type=int, default=3300, help="records per batch (~256 KiB)")
    arguments = parser.parse_args()
    arguments.rounds = 10 if arguments.quick else 60
    print(json.dumps(main(arguments)))
