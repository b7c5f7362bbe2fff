"""Several batches in flight per partition: a seeded simulation of the accumulator against the
node's real sequence rule (``laminar.node.sequences`` over a real ProducerTable), with injected
failures: requests lost before the node, replies lost after a write, batches refused for good.

The reply handling follows ``Producer._done``/``_retry_or_fail``'s branches (the contract the
accumulator expects). Invariants: every partition's log holds each record at most once, in
send order; every acknowledged record is in the log exactly once, at the offset it was told;
a batch refused for good is absent; every batch is settled in the end.
Replay a failing seed with ``LAMINAR_SIM_SEED=<seed>``.
"""

from __future__ import annotations

import os
import random
from collections import deque

import pytest

from laminar.client.accumulator import ProducerBatch, RecordAccumulator
from laminar.client.types import TopicPartition
from laminar.errors import (
    BatchTooLargeError,
    DuplicateSequenceError,
    InvalidProducerEpochError,
    LaminarError,
    OutOfOrderSequenceError,
)
from laminar.node import sequences
from laminar.node.producers import ProducerTable
from laminar.segment.batch import decode_records, verify_batch

TPS = [TopicPartition("t", 0), TopicPartition("t", 1)]
SEEDS = (
    [int(os.environ["LAMINAR_SIM_SEED"])]
    if "LAMINAR_SIM_SEED" in os.environ
    else range(int(os.environ.get("LAMINAR_SIM_SEEDS", "60")))
)


class SimNode:
    """One partition leader: a log of record values and the real producer table."""

    def __init__(self) -> None:
        self.logs: dict[TopicPartition, list[bytes]] = {tp: [] for tp in TPS}
        self.tables = {tp: ProducerTable() for tp in TPS}

    def produce(self, tp: TopicPartition, data: bytes) -> int:
        header = verify_batch(data)
        earlier = sequences.check(self.tables[tp], header)  # raises the typed refusals
        if earlier is not None:
            return earlier.base_offset
        log = self.logs[tp]
        base = len(log)
        log.extend(r.value for r in decode_records(data))
        self.tables[tp].record(header, base, len(log) - 1)
        return base


def settle(
    acc: RecordAccumulator, batch: ProducerBatch, error: BaseException | None, base: int, now: float
) -> None:
    """The producer's reply handling, branch for branch."""
    if isinstance(error, DuplicateSequenceError):
        error, base = None, -1
    if error is None:
        batch.complete(base)
        acc.finished(batch)
    elif isinstance(error, OutOfOrderSequenceError) or (
        isinstance(error, InvalidProducerEpochError) and acc.stale(batch)
    ):
        acc.requeue(batch, now, rebuild=True, counted=False)
    elif isinstance(error, ConnectionError):
        acc.requeue(batch, now + 0.01 * min(batch.attempts + 1, 5))
    else:
        batch.fail(error)
        acc.finished(batch)


@pytest.mark.parametrize("seed", SEEDS)
async def test_pipelined_batches_keep_order_and_land_once(seed: int) -> None:
    rng = random.Random(seed)
    max_in_flight = rng.choice([1, 2, 5])
    acc = RecordAccumulator(
        batch_bytes=rng.choice([120, 300]), linger=0.0, producer_id=9, max_in_flight=max_in_flight
    )
    node = SimNode()
    wire: dict[TopicPartition, deque[ProducerBatch]] = {tp: deque() for tp in TPS}
    replies: list[tuple[ProducerBatch, BaseException | None, int]] = []
    handles = []
    sent_before: set[int] = set()
    refused_for_good: list[ProducerBatch] = []
    now, counter = 0.0, 0
    p_lost, p_reply_lost, p_refuse = rng.choice([(0.0, 0.0, 0.0), (0.1, 0.1, 0.03), (0.3, 0.2, 0)])
    for step in range(20_000):
        if step > 2000 and acc.empty() and not replies:
            break
        now += 0.001
        failing = step < 2000  # then a calm period: everything must settle
        if step < 1500 and rng.random() < 0.5:
            tp = rng.choice(TPS)
            for _ in range(rng.randint(1, 4)):
                value = f"{tp.partition}:{counter:06d}".encode()
                counter += 1
                handles.append((tp, value, acc.append(tp, None, value, (), 0, now=now)[0]))
        ready, _ = acc.ready(now)
        acc.start_sending(ready)
        for batch in ready:
            wire[batch.tp].append(batch)
        for tp in TPS:  # the node reads each connection in order
            while wire[tp] and rng.random() < 0.6:
                batch = wire[tp].popleft()
                first_send = id(batch) not in sent_before
                sent_before.add(id(batch))
                if failing and rng.random() < p_lost:
                    replies.append((batch, ConnectionError("lost"), -1))
                    continue
                if failing and first_send and rng.random() < p_refuse:
                    refused_for_good.append(batch)
                    replies.append((batch, BatchTooLargeError("refused"), -1))
                    continue
                try:
                    base = node.produce(tp, batch.data or b"")
                    error: LaminarError | ConnectionError | None = None
                except LaminarError as exc:
                    base, error = -1, exc
                if failing and error is None and rng.random() < p_reply_lost:
                    error = ConnectionError("reply lost")
                replies.append((batch, error, base))
        rng.shuffle(replies)  # replies of different requests come back in any order
        keep = []
        for reply in replies:
            if rng.random() < 0.5:
                settle(acc, reply[0], reply[1], reply[2], now)
            else:
                keep.append(reply)
        replies = keep
    assert acc.empty(), f"seed {seed}: batches left unsettled"
    for tp, log in node.logs.items():
        assert len(set(log)) == len(log), f"seed {seed}: a record written twice in {tp}"
        assert log == sorted(log), f"seed {seed}: {tp} is out of send order"
    refused = {v for b in refused_for_good for _, v, _, _ in b.records}
    acked = 0
    for tp, value, handle in handles:
        log = node.logs[tp]
        if handle.exception() is not None:
            assert value in refused and value not in log, f"seed {seed}: {value!r} failed"
            continue
        acked += 1
        offset = handle.result().offset
        assert log.count(value) == 1, f"seed {seed}: acknowledged {value!r} not stored once"
        assert offset == -1 or log[offset] == value, f"seed {seed}: {value!r} wrong offset"
    assert acked >= len(handles) - len(refused)
