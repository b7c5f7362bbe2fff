"""Long fault-injection runs from the command line (the pytest version is short).

    python -m tests.faults --minutes 30                 # seeds 1, 2, ... for 30 min, mixed
    python -m tests.faults --seed 17 --nodes 5 --cycles 8 --faults split,powerloss_all
    python -m tests.faults --seed 17 ...                # replays a run's schedule

Every run prints its schedule and a replay command; the exit status is 1 if any run found an
anomaly. Run directories (node logs, worker event logs) are kept for failed runs.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.faults.harness import FaultRun, RunConfig, RunReport
from tests.faults.schedule import ALL_FAULTS


def fit(faults: list[str], nodes: int) -> list[str]:
    """Drop what this cluster size cannot run: 3-vs-2 splits need five nodes, amnesia three."""
    kept = [f for f in faults if (f != "split" or nodes >= 5) and (f != "amnesia" or nodes == 3)]
    return kept or faults


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__)
    parser.add_argument("--seed", type=int, default=1, help="first seed (default 1)")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds to run")
    parser.add_argument("--minutes", type=float, default=0, help="run seeds until this long")
    parser.add_argument("--nodes", default="3", help="3, 5, or 3,5 to alternate")
    parser.add_argument("--faults", default="", help=f"comma list of {', '.join(ALL_FAULTS)}")
    parser.add_argument("--cycles", type=int, default=8, help="fault cycles per run")
    parser.add_argument("--mixed", action="store_true", help="random faults, some overlapping")
    parser.add_argument("--root", type=Path, default=None, help="where run directories go")
    parser.add_argument("--keep", action="store_true", help="keep run directories that passed")
    parser.add_argument(
        "--max-open-log-files", type=int, default=0, help="each node's open log files budget"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    node_counts = [int(n) for n in args.nodes.split(",")]
    root = args.root or Path(tempfile.mkdtemp(prefix="laminar-faults-"))
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    mixed = args.mixed or bool(args.minutes)
    reports: list[RunReport] = []
    seed = args.seed
    while True:
        nodes = node_counts[(seed - args.seed) % len(node_counts)]
        faults = fit([f for f in args.faults.split(",") if f] or list(ALL_FAULTS), nodes)
        run_dir = root / f"seed-{seed}-n{nodes}"
        config = RunConfig(
            run_dir,
            nodes=nodes,
            seed=seed,
            faults=faults,
            cycles=args.cycles,
            mixed=mixed,
            max_open_log_files=args.max_open_log_files,
        )
        report = asyncio.run(FaultRun(config).execute())
        print(report.summary(), flush=True)
        reports.append(report)
        if not report.anomalies and not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
        seed += 1
        if deadline is not None:
            if time.monotonic() >= deadline:
                break
        elif seed >= args.seed + args.seeds:
            break
    failed = [r for r in reports if r.anomalies]
    acked = sum(r.verdict.acked for r in reports if r.verdict)
    cycles = sum(r.cycles_run for r in reports)
    print(
        f"\n{len(reports)} runs, {cycles} fault cycles, {acked} writes acknowledged, "
        f"{sum(r.anomaly_count for r in failed)} anomalies in {len(failed)} runs"
        + (f" (seeds {[r.config.seed for r in failed]}; kept under {root})" if failed else ""),
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
