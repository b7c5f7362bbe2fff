"""Client-side cost of each codec: build and decode record batches of varied JSON-like events.

For each codec, 256 KiB batches of ~80-byte events are built (`build_batch`, compressing the
records section) and decoded back (`decode_records`, inflating first), in this process; the
baseline is the same work uncompressed, measured in the same run. Also reports each codec's
size ratio and inflate speed (MB/s of records section produced). The last line is one JSON
object.

    python bench/compression_bench.py --quick
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from produce_bench import event_records

from laminar.segment import compression
from laminar.segment.batch import build_batch, decode_records


def measure(records: list[tuple], codec: int, seconds: float) -> dict[str, float]:
    count = len(records)
    built = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        batch = build_batch(records, compression=codec)
        built += 1
    build_s = (time.perf_counter() - started) / built
    decoded = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        decode_records(batch)
        decoded += 1
    decode_s = (time.perf_counter() - started) / decoded
    inflate_s = 0.0
    if codec:
        section = memoryview(batch)[68:]
        rounds = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds / 2:
            compression.decompress(codec, section)
            rounds += 1
        inflate_s = (time.perf_counter() - started) / rounds
    return {
        "batch_bytes": len(batch),
        "build_records_per_s": count / build_s,
        "decode_records_per_s": count / decode_s,
        "inflate_mb_s": (len(build_batch(records)) - 68) / inflate_s / 1e6 if codec else 0.0,
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    now = int(time.time() * 1000)
    values = event_records(args.records)
    records = [(None, value, (), now + i) for i, value in enumerate(values)]
    base = measure(records, compression.NONE, args.seconds)
    out: dict[str, Any] = {
        "records_per_batch": len(records),
        "record_bytes": sum(len(v) for v in values) // len(values),
        "none_batch_bytes": base["batch_bytes"],
        "none_build_records_per_s": round(base["build_records_per_s"]),
        "none_decode_records_per_s": round(base["decode_records_per_s"]),
    }
    for name, codec in compression.CODECS.items():
        got = measure(records, codec, args.seconds)
        out[f"{name}_ratio"] = round(base["batch_bytes"] / got["batch_bytes"], 2)
        out[f"{name}_build_vs_none"] = round(
            got["build_records_per_s"] / base["build_records_per_s"], 2
        )
        out[f"{name}_decode_vs_none"] = round(
            got["decode_records_per_s"] / base["decode_records_per_s"], 2
        )
        out[f"{name}_inflate_mb_s"] = round(got["inflate_mb_s"])
        out[f"{name}_compress_records_per_s"] = round(got["build_records_per_s"])
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (a few seconds)")
    parser.add_argument("--records", type=int, default=3300, help="records per batch (~256 KiB)")
    parser.add_argument("--seconds", type=float, default=None, help="per measurement")
    arguments = parser.parse_args()
    if arguments.seconds is None:
        arguments.seconds = 0.5 if arguments.quick else 2.0
    print(json.dumps(main(arguments)))
