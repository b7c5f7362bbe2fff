"""`laminar group ...`: list, describe (lag), reset offsets and delete consumer groups.

Registered on the main app by laminar/cli.py; the output follows rpk's `group` commands.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterable
from dataclasses import asdict
from typing import Annotated

import typer

from laminar.cli import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    format_record,
    parse_start,
    render_table,
    run,
)
from laminar.cli_auth import client_options
from laminar.cli_common import UserError, fail
from laminar.client import Admin, Consumer, GroupDescription, GroupSummary, TopicPartition
from laminar.client.offsets import list_offsets
from laminar.protocol import LATEST

group_app = typer.Typer(
    help="List, describe, reset and delete consumer groups.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@group_app.command("list")
def group_list(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> None:
    """Every consumer group of the cluster."""

    async def go() -> list[GroupSummary]:
        async with Admin(bootstrap, **client_options()) as admin:
            return await admin.list_groups()

    groups = run(go)
    if not groups:
        typer.echo("no groups")
        return
    rows = [["GROUP", "STATE", "MEMBERS", "COORDINATOR", "PROTOCOL"]]
    rows += [[g.group, g.state, str(g.members), str(g.coordinator), g.protocol] for g in groups]
    typer.echo(render_table(rows))


@group_app.command("describe")
def group_describe(
    group: str,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """State, members, and per partition: owner, committed offset, end offset and lag."""

    async def go() -> GroupDescription:
        async with Admin(bootstrap, **client_options()) as admin:
            return await admin.describe_group(group)

    description = run(go)
    if as_json:
        typer.echo(json.dumps(asdict(description), indent=2))
        return
    typer.echo(render_group(description))


def render_group(d: GroupDescription) -> str:
    total = sum(p.lag for p in d.partitions if p.lag is not None)
    lines = [
        f"GROUP        {d.group}",
        f"COORDINATOR  {d.coordinator}",
        f"PROTOCOL     {d.protocol}",
        f"STATE        {d.state}",
        f"{'GENERATION' if d.protocol == 'classic' else 'EPOCH':<13}{d.epoch}",
        f"MEMBERS      {len(d.members)}",
        f"TOTAL-LAG    {total}",
    ]
    if d.members:
        rows = [["MEMBER", "INSTANCE", "EPOCH", "TOPICS", "ASSIGNED", "REVOKING"]]
        for m in d.members:
            rows.append(
                [
                    m.member_id + (" (fenced)" if m.fenced else ""),
                    m.instance_id or "-",
                    str(m.member_epoch),
                    ",".join(m.topics) or "-",
                    _partition_list(m.assigned),
                    _partition_list(m.revoking),
                ]
            )
        lines += ["", render_table(rows)]
    if d.partitions:
        rows = [["TOPIC", "PARTITION", "MEMBER", "COMMITTED", "END", "LAG"]]
        for p in d.partitions:
            rows.append(
                [
                    p.topic,
                    str(p.partition),
                    p.member_id or "-",
                    _or_dash(p.committed),
                    _or_dash(p.end_offset),
                    _or_dash(p.lag),
                ]
            )
        lines += ["", render_table(rows)]
    return "\n".join(lines)


def _partition_list(tps: tuple[TopicPartition, ...]) -> str:
    if not tps:
        return "-"
    by_topic: dict[str, list[str]] = {}
    for tp in tps:
        by_topic.setdefault(tp.topic, []).append(str(tp.partition))
    return " ".join(f"{t}:{','.join(ps)}" for t, ps in by_topic.items())


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


@group_app.command("reset-offsets")
def group_reset_offsets(
    group: str,
    topic: Annotated[str, typer.Option("--topic", "-t", help="The topic whose offsets to set.")],
    to: Annotated[
        str,
        typer.Option(
            "--to", help="earliest, latest, an OFFSET, @MS, an ISO date-time or -DURATION (-15m)."
        ),
    ],
    partition: Annotated[
        list[int] | None, typer.Option("--partition", "-p", help="Only these partitions.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the new offsets without committing them.")
    ] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Set a group's committed offsets (only while the group has no members)."""
    try:
        kind, where = parse_start(to)
    except UserError as exc:
        fail(str(exc).replace("--from", "--to"))

    async def go() -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        async with Admin(bootstrap, **client_options()) as admin:
            before = {tp: o.offset for tp, o in (await admin.fetch_offsets(group)).items()}
            options: dict[str, object] = {"partitions": partition, "dry_run": dry_run}
            if kind == "timestamp":
                options["timestamp_ms"] = where
            else:
                options["to"] = kind if kind in ("earliest", "latest") else where
            plan = await admin.reset_offsets(group, topic, **options)  # type: ignore[arg-type]
            return before, plan

    before, plan = run(go)
    rows = [["TOPIC", "PARTITION", "PREVIOUS", "NEW"]]
    for tp in sorted(plan):
        rows.append([tp.topic, str(tp.partition), _or_dash(before.get(tp)), str(plan[tp])])
    if dry_run:
        typer.echo(f"dry run: group {group} not changed")
    else:
        typer.echo(f"reset {len(plan)} offsets of group {group}")
    typer.echo(render_table(rows))


@group_app.command("delete")
def group_delete(group: str, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> None:
    """Delete a group with no members, and its committed offsets."""

    async def go() -> None:
        async with Admin(bootstrap, **client_options()) as admin:
            await admin.delete_group(group)

    run(go)
    typer.echo(f"deleted group {group}")


# consume --group -------------------------------------------------------------------------
NO_ASSIGNMENT_WAIT = 10.0


async def consume_group(
    bootstrap: str,
    topic: str,
    group: str,
    reset: str,
    follow: bool,
    count: int | None,
    output: str,
) -> int:
    """`laminar consume TOPIC --group G`: print this member's share and commit exactly what
    was printed (after writing it out), also when partitions are revoked."""
    pending: dict[TopicPartition, int] = {}

    async def commit(consumer: Consumer, tps: Iterable[TopicPartition]) -> None:
        offsets = {tp: pending.pop(tp) for tp in list(tps) if tp in pending}
        if offsets:
            await consumer.commit(offsets)

    async def on_revoked(tps: set[TopicPartition]) -> None:
        sys.stdout.flush()
        await commit(consumer, tps)

    def on_lost(tps: set[TopicPartition]) -> None:
        for tp in tps:  # another member may own them now: its commits win
            pending.pop(tp, None)

    consumer = Consumer(
        bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset=reset,
        on_partitions_revoked=on_revoked,
        on_partitions_lost=on_lost,
        **client_options(),
    )
    async with consumer:
        description = await consumer.cluster.wait_for_topic(topic, 5.0)
        every = [TopicPartition(topic, p.partition) for p in description.partitions]
        await consumer.subscribe(topic)
        ends = {} if follow else await list_offsets(consumer.cluster, every, LATEST)
        if follow:
            print(f"% joined group {group}, following {topic}", file=sys.stderr, flush=True)
        loop = asyncio.get_running_loop()
        started = loop.time()
        printed = 0
        out = sys.stdout
        while True:
            mine = consumer.assignment()
            if not follow:
                if mine and all(consumer.position(tp) >= ends[tp] for tp in mine):
                    break
                if not mine and loop.time() - started > NO_ASSIGNMENT_WAIT:
                    print(f"% group {group} gave this member no partition", file=sys.stderr)
                    break
            for record in await consumer.getmany(timeout_ms=500):
                tp = TopicPartition(record.topic, record.partition)
                if not follow and record.offset >= ends[tp]:
                    continue
                out.write(format_record(record, output) + "\n")
                pending[tp] = record.offset + 1
                printed += 1
                if count is not None and printed >= count:
                    break
            out.flush()
            await commit(consumer, [tp for tp in pending if tp in consumer.assignment()])
            if count is not None and printed >= count:
                break
        return printed
