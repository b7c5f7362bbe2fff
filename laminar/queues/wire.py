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
from laminar.queues.driver import Settle
from laminar.queues.partition import Delivery
from laminar.queues.service import QueueService

Handler = Callable[[Any, Any, memoryview], Awaitable[list[bytes] | None]]
LeaderReplica = Callable[[str, int], Replica]
ACTIONS = ("ack", "release", "reject", "extend")
MAX_WAIT_MS = 30_000
MAX_SETTLES = 100_000  # settlements in one request (runs expand to one per offset)
POLL_SLICE = 0.05


def handlers(service: QueueService, leader_replica: LeaderReplica) -> dict[str, Handler]:
    async def share_fetch(body: Any, response: Any, _payload: memoryview) -> list[bytes]:
        group, member = body.group, body.memberId
        if not group or not member:
            raise InvalidRequestError("a share fetch names its group and member")
        wanted = [(p.topic, p.partition) for p in body.partitions]
        settles: dict[tuple[str, int], list[tuple[int, Settle]]] = {}
        acks = list(body.acks)
        for position, ack in enumerate(acks):
            if ack.action >= len(ACTIONS):
                raise InvalidRequestError(f"unknown acknowledgement action {ack.action}")
            tp = (ack.topic, ack.partition)
            settle = Settle(ack.offset, ack.deliveryCount, ACTIONS[ack.action], ack.ms)
            settles.setdefault(tp, []).append((position, settle))
        total = len(acks)
        runs: list[tuple[int, int, int]] = []  # (position of its first item, count, offset)
        for run in body.ackRuns:
            action, count, first = run.action, run.count, run.offset
            if action >= len(ACTIONS):
                raise InvalidRequestError(f"unknown acknowledgement action {action}")
            if total + count > MAX_SETTLES:
                raise InvalidRequestError(f"more than {MAX_SETTLES} settlements in one request")
            kind, count_, ms = ACTIONS[action], run.deliveryCount, run.ms
            new = tuple.__new__  # a NamedTuple's own __new__ costs a Python call per offset
            settles.setdefault((run.topic, run.partition), []).extend(
                (total + i, new(Settle, (first + i, count_, kind, ms))) for i in range(count)
            )
            runs.append((total, count, first))
            total += count
        max_records = body.maxRecords
        lock_ms = body.lockMs or None
        from_earliest = body.fromEarliest
        max_wait = min(body.maxWaitMs, MAX_WAIT_MS) / 1000
        errors: list[LaminarError | None] = [None] * total  # per settlement, request order
        found: dict[tuple[str, int], list[Delivery] | LaminarError] = {}

        async def one_pass(tps: list[tuple[str, int]], budget: int) -> int:
            got = 0
            for tp in tps:
                mine = settles.pop(tp, [])
                try:
                    queues = service.queues(leader_replica(*tp))
                    results, deliveries = await queues.fetch(
                        group,
                        member,
                        [s for _p, s in mine],
                        max(0, budget - got),
                        lock_ms,
                        from_earliest,
                        0,
                    )
                except LaminarError as exc:
                    found.setdefault(tp, exc)
                    for position, _settle in mine:
                        errors[position] = exc
                    continue
                for (position, _settle), error in zip(mine, results, strict=True):
                    errors[position] = error
                previous = found.get(tp)
                if isinstance(previous, list):
                    previous += deliveries
                else:
                    found[tp] = list(deliveries)
                got += len(deliveries)
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
        return _fill(response, service, leader_replica, found, acks, runs, errors, as_runs, lock)

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
    found: dict[tuple[str, int], list[Delivery] | LaminarError],
    acks: list[Any],
    runs: list[tuple[int, int, int]],
    errors: list[LaminarError | None],
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
            acquired = slot.init("acquired", len(value))
            for a, delivery in zip(acquired, value, strict=True):
                a.offset = delivery.offset
                a.deliveryCount = delivery.delivery_count
                a.lockUntilMs = delivery.lock_until_ms
        if not value:
            continue
        try:
            batches = service.queues(leader_replica(*tp)).read(value)
        except LaminarError as exc:
            fill_error(slot.error, exc)
            continue
        size = sum(len(b) for b in batches)
        slot.payloadLength = size
        chunks += batches
        position += size
    slots = out.init("ackResults", len(acks))
    for slot, ack, error in zip(slots, acks, errors, strict=False):
        slot.topic, slot.partition, slot.offset = ack.topic, ack.partition, ack.offset
        if error is not None:
            fill_error(slot.error, error)
    if runs:
        for slot, (position, count, first) in zip(
            out.init("ackRunResults", len(runs)), runs, strict=True
        ):
            mine = errors[position : position + count]
            failed = [(first + i, e) for i, e in enumerate(mine) if e is not None]
            if not failed:
                continue
            if len(failed) == count and all(e is failed[0][1] for _o, e in failed):
                fill_error(slot.error, failed[0][1])  # the whole run (its partition) failed
                continue
            for f, (offset, error) in zip(slot.init("failed", len(failed)), failed, strict=True):
                f.offset = offset
                fill_error(f.error, error)
    return chunks


def _fill_runs(slot: Any, deliveries: list[Delivery]) -> None:
    """``deliveries`` as runs of consecutive offsets with one delivery count and lock."""
    runs: list[list[int]] = []  # [offset, count, delivery count, lock until]
    for (_member, offset, count), until in deliveries:
        if runs:
            last = runs[-1]
            if offset == last[0] + last[1] and count == last[2] and until == last[3]:
                last[1] += 1
                continue
        runs.append([offset, 1, count, until])
    for out, (offset, n, count, until) in zip(
        slot.init("acquiredRuns", len(runs)), runs, strict=True
    ):
        out.offset, out.count, out.deliveryCount, out.lockUntilMs = offset, n, count, until
