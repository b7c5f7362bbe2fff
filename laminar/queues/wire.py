"""Client-protocol handlers of share fetch and queue describe.

A share fetch names partitions this node leads (the client groups them by leader, as for
fetch); it settles its acknowledgements first, then acquires from the partitions in turn until
``maxRecords`` are acquired, long-polling all of them while none has anything available. Each
partition's result carries the acquired offsets with their delivery counts and the whole
record batches that hold them (the client delivers only the acquired records).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from laminar.errors import InvalidRequestError, LaminarError
from laminar.node.replica import Replica
from laminar.protocol import fill_error
from laminar.queues.partition import AcquiredRun, SettleRun
from laminar.queues.service import QueueService

Handler = Callable[[Any, Any, memoryview], Awaitable[list[bytes] | None]]
LeaderReplica = Callable[[str, int], Replica]
ACTIONS = ("ack", "release", "reject", "extend")
MAX_WAIT_MS = 30_000
MAX_SETTLES = 100_000  # settlements in one request (runs expand to one per offset)
POLL_SLICE = 0.05
RunOutcome = list[tuple[int, LaminarError]] | LaminarError
"""A settlement run's result: the offsets that failed with their errors, or one error for all."""


def handlers(service: QueueService, leader_replica: LeaderReplica) -> dict[str, Handler]:
    async def share_fetch(body: Any, response: Any, _payload: memoryview) -> list[bytes]:
        group, member = body.group, body.memberId
        if not group or not member:
            raise InvalidRequestError("a share fetch names its group and member")
        wanted = [(p.topic, p.partition) for p in body.partitions]
        # Every settlement as a run (an ack of the per-offset list is a run of one), numbered
        # in request order (``acks`` first, then ``ackRuns``), grouped by partition.
        settles: dict[tuple[str, int], list[tuple[int, SettleRun]]] = {}
        acks = list(body.acks)
        total = 0
        for ack in acks:
            if ack.action >= len(ACTIONS):
                raise InvalidRequestError(f"unknown acknowledgement action {ack.action}")
            run = (ack.offset, 1, ack.deliveryCount, ACTIONS[ack.action], ack.ms)
            settles.setdefault((ack.topic, ack.partition), []).append((total, run))
            total += 1
        count = len(acks)
        for ack_run in body.ackRuns:
            action, n = ack_run.action, ack_run.count
            if action >= len(ACTIONS):
                raise InvalidRequestError(f"unknown acknowledgement action {action}")
            if count + n > MAX_SETTLES:
                raise InvalidRequestError(f"more than {MAX_SETTLES} settlements in one request")
            run = (ack_run.offset, n, ack_run.deliveryCount, ACTIONS[action], ack_run.ms)
            settles.setdefault((ack_run.topic, ack_run.partition), []).append((total, run))
            total += 1
            count += n
        max_records = body.maxRecords
        lock_ms = body.lockMs or None
        from_earliest = body.fromEarliest
        max_wait = min(body.maxWaitMs, MAX_WAIT_MS) / 1000
        # per run (request order): its partition's error, or the offsets that failed
        outcomes: list[RunOutcome] = [[] for _ in range(total)]
        found: dict[tuple[str, int], list[AcquiredRun] | LaminarError] = {}

        async def one_pass(tps: list[tuple[str, int]], budget: int) -> int:
            got = 0
            for tp in tps:
                mine = settles.pop(tp, [])
                try:
                    queues = service.queues(leader_replica(*tp))
                    results, acquired = await queues.fetch(
                        group,
                        member,
                        [run for _i, run in mine],
                        max(0, budget - got),
                        lock_ms,
                        from_earliest,
                        0,
                    )
                except LaminarError as exc:
                    found.setdefault(tp, exc)
                    for position, _run in mine:
                        outcomes[position] = exc
                    continue
                if isinstance(results, LaminarError):
                    for position, _run in mine:
                        outcomes[position] = results
                else:
                    for (position, _run), failed in zip(mine, results, strict=True):
                        outcomes[position] = failed
                previous = found.get(tp)
                if isinstance(previous, list):
                    previous += acquired
                else:
                    found[tp] = list(acquired)
                got += sum(hi - lo for lo, hi, _c, _d in acquired)
            return got

        deadline = asyncio.get_running_loop().time() + max_wait
        await one_pass([*dict.fromkeys([*wanted, *settles])], max_records)
        while max_records and not any(isinstance(v, list) and v for v in found.values()):
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            await _any_news(leader_replica, wanted, min(remaining, POLL_SLICE))
            await one_pass(wanted, max_records)
        as_runs = body.acquiredRuns
        lock = lock_ms or service.config_for(group).lock_ms
        return _fill(response, service, leader_replica, found, acks, outcomes, as_runs, lock)

    async def describe_queue(body: Any, response: Any, _payload: memoryview) -> None:
        group = body.group
        tps = [(p.topic, p.partition) for p in body.partitions]
        out = response.body.init("queue").init("partitions", len(tps))
        for slot, tp in zip(out, tps, strict=True):
            slot.topic, slot.partition = tp
            try:
                replica = leader_replica(*tp)
                queues = service.queues(replica)
                await queues.ready()
                view = queues.describe(group)
            except LaminarError as exc:
                fill_error(slot.error, exc)
                continue
            if view is None:
                slot.start = slot.end = replica.high_watermark
                continue
            slot.start, slot.end = view.start, view.end
            slot.available, slot.acquired = view.available, view.acquired
            slot.delayed, slot.deadLettering = view.delayed, view.archiving
            slot.oldestUnackedMs = queues.oldest_unacked_age(group)
        return None

    return {"shareFetch": share_fetch, "describeQueue": describe_queue}


async def _any_news(leader_replica: LeaderReplica, tps: list[tuple[str, int]], wait: float) -> None:
    """Wait until one of the partitions' high watermark moves (or ``wait`` runs out)."""
    waiter = asyncio.get_running_loop().create_future()
    for tp in tps:
        try:
            leader_replica(*tp).fetch_waiters.append(waiter)
        except LaminarError:
            continue
    await asyncio.wait([waiter], timeout=wait)


def _fill(
    response: Any,
    service: QueueService,
    leader_replica: LeaderReplica,
    found: dict[tuple[str, int], list[AcquiredRun] | LaminarError],
    acks: list[Any],
    outcomes: list[RunOutcome],
    as_runs: bool,
    lock_ms: int,
) -> list[bytes]:
    out = response.body.init("shareFetch")
    results = out.init("results", len(found))
    chunks: list[bytes] = []
    position = 0
    for slot, (tp, value) in zip(results, found.items(), strict=True):
        slot.topic, slot.partition = tp
        slot.payloadOffset = position
        if isinstance(value, LaminarError):
            fill_error(slot.error, value)
            continue
        slot.lockMs = lock_ms
        if as_runs:
            _fill_runs(slot, value)
        else:
            acquired = slot.init("acquired", sum(hi - lo for lo, hi, _c, _d in value))
            listed = ((o, c, d) for lo, hi, c, d in value for o in range(lo, hi))
            for a, (offset, count, until) in zip(acquired, listed, strict=True):
                a.offset, a.deliveryCount, a.lockUntilMs = offset, count, until
        if not value:
            continue
        try:
            batches = service.queues(leader_replica(*tp)).read((lo, hi) for lo, hi, _c, _d in value)
        except LaminarError as exc:
            fill_error(slot.error, exc)
            continue
        size = sum(len(b) for b in batches)
        slot.payloadLength = size
        chunks += batches
        position += size
    slots = out.init("ackResults", len(acks))
    for slot, ack, outcome in zip(slots, acks, outcomes, strict=False):
        slot.topic, slot.partition, slot.offset = ack.topic, ack.partition, ack.offset
        error = outcome if isinstance(outcome, LaminarError) else outcome[0][1] if outcome else None
        if error is not None:
            fill_error(slot.error, error)
    run_outcomes = outcomes[len(acks) :]
    if run_outcomes:
        for slot, outcome in zip(
            out.init("ackRunResults", len(run_outcomes)), run_outcomes, strict=True
        ):
            if isinstance(outcome, LaminarError):
                fill_error(slot.error, outcome)  # the whole run (its partition) failed
            elif outcome:
                for f, (offset, error) in zip(
                    slot.init("failed", len(outcome)), outcome, strict=True
                ):
                    f.offset = offset
                    fill_error(f.error, error)
    return chunks


def _fill_runs(slot: Any, acquired: list[AcquiredRun]) -> None:
    """The acquired runs; neighbours with one delivery count and lock become one."""
    runs: list[list[int]] = []  # [offset, count, delivery count, lock until]
    for lo, hi, count, until in acquired:
        if runs:
            last = runs[-1]
            if lo == last[0] + last[1] and count == last[2] and until == last[3]:
                last[1] += hi - lo
                continue
        runs.append([lo, hi - lo, count, until])
    for out, (offset, n, count, until) in zip(
        slot.init("acquiredRuns", len(runs)), runs, strict=True
    ):
        out.offset, out.count, out.deliveryCount, out.lockUntilMs = offset, n, count, until
