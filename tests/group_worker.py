"""A consumer-group member process for tests/test_group_processes.py.

It joins ``GROUP`` on ``TOPIC`` with auto-commit off, and after every non-empty ``getmany``
batch commits what it processed (the next offset of each partition in the batch); the revoke
listener commits the partitions it gives up. Everything it sees goes to its own log, one JSON
object per line, each written with a single write() so a line is in the page cache before the
worker acts on it and survives a SIGKILL (a torn last line is possible and skipped by readers):

    {"t": ..., "ev": "ready", "pid": ...}             connected, about to subscribe (join)
    {"t": ..., "ev": "assigned"|"revoked"|"lost", "tps": [partition, ...]}
    {"t": ..., "ev": "records", "recs": [[partition, offset, seq], ...]}
    {"t": ..., "ev": "commit", "ok": true|false, "offsets": {partition: offset},
     "error": "FencedMemberEpochError", "where": "batch"|"revoke", "t0": when it started}
    {"t": ..., "ev": "pausing"} / {"t": ..., "ev": "resumed"}   around a self-inflicted SIGSTOP
    {"t": ..., "ev": "holding"}                       a batch is processed, its commit waits
    {"t": ..., "ev": "closed"}

"revoked" is written when the listener is done (its commit included): the member owned the
partitions until then. Signals: SIGTERM closes the consumer (revoke listener, leave) and exits;
SIGUSR1 makes the worker SIGSTOP itself right after it logs its next batch, before committing
it (a zombie holding processed, uncommitted records); SIGHUP makes it wait 10 s (its
heartbeats go on) between logging its next batch and committing it, so a SIGKILL then leaves
processed records uncommitted.

    python -m tests.group_worker BOOTSTRAP TOPIC GROUP LOG [--instance ID]
        [--rebalance-timeout-ms MS]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import structlog

from laminar.client import Consumer, TopicPartition
from laminar.errors import LaminarError

HOLD_SECONDS = 10.0


class EventLog:
    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"t": time.time(), "ev": event, **fields}, separators=(",", ":"))
        os.write(self.fd, (line + "\n").encode())


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.log = EventLog(Path(args.log))
        self.next: dict[int, int] = {}
        """Next offset to commit per partition, for what this ownership processed."""
        self.stop = asyncio.Event()
        self.pause_next = False
        self.hold_next = False

    async def commit(self, offsets: dict[int, int], where: str) -> None:
        if not offsets:
            return
        tps = {TopicPartition(self.args.topic, p): o for p, o in offsets.items()}
        started = time.time()
        try:
            await self.consumer.commit(tps)
        except (ConnectionError, OSError, LaminarError, TimeoutError) as exc:
            error = type(exc).__name__
            self.log.write(
                "commit", ok=False, offsets=offsets, error=error, where=where, t0=started
            )
            return
        self.log.write("commit", ok=True, offsets=offsets, where=where, t0=started)

    async def on_revoked(self, tps: set[TopicPartition]) -> None:
        parts = sorted(tp.partition for tp in tps)
        await self.commit({p: self.next[p] for p in parts if p in self.next}, "revoke")
        for p in parts:
            self.next.pop(p, None)
        self.log.write("revoked", tps=parts)

    def on_assigned(self, tps: set[TopicPartition]) -> None:
        self.log.write("assigned", tps=sorted(tp.partition for tp in tps))

    def on_lost(self, tps: set[TopicPartition]) -> None:
        parts = sorted(tp.partition for tp in tps)
        for p in parts:
            self.next.pop(p, None)
        self.log.write("lost", tps=parts)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop.set)
        loop.add_signal_handler(signal.SIGUSR1, self._arm_pause)
        loop.add_signal_handler(signal.SIGHUP, self._arm_hold)
        args = self.args
        self.consumer = Consumer(
            args.bootstrap,
            group_id=args.group,
            group_instance_id=args.instance,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            rebalance_timeout_ms=args.rebalance_timeout_ms,
            max_wait_ms=200,
            on_partitions_revoked=self.on_revoked,
            on_partitions_assigned=self.on_assigned,
            on_partitions_lost=self.on_lost,
        )
        await self.consumer.start()
        self.log.write("ready", pid=os.getpid())
        try:
            await self.consumer.subscribe([args.topic])
            while not self.stop.is_set():
                records = await self.consumer.getmany(timeout_ms=200)
                if not records:
                    continue
                batch: dict[int, int] = {}
                recs = []
                for r in records:
                    recs.append([r.partition, r.offset, int(r.value or b"-1")])
                    batch[r.partition] = max(batch.get(r.partition, 0), r.offset + 1)
                self.log.write("records", recs=recs)
                self.next.update(batch)
                if self.pause_next:
                    self.pause_next = False
                    self.log.write("pausing")
                    os.kill(os.getpid(), signal.SIGSTOP)
                    self.log.write("resumed")
                if self.hold_next:
                    self.hold_next = False
                    self.log.write("holding")
                    await asyncio.sleep(HOLD_SECONDS)
                await self.commit(batch, "batch")
        finally:
            await self.consumer.close()
            self.log.write("closed")

    def _arm_pause(self) -> None:
        self.pause_next = True

    def _arm_hold(self) -> None:
        self.hold_next = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("group")
    parser.add_argument("log")
    parser.add_argument("--instance", default=None)
    parser.add_argument("--rebalance-timeout-ms", type=int, default=60_000)
    # The client logs retries at debug level; the worker's output file only needs warnings.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    asyncio.run(Worker(parser.parse_args()).run())


if __name__ == "__main__":
    main()
