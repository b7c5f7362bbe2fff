"""`laminar queue describe|config` and `laminar consume --share-group`: topics read as queues.

Registered on the main app by laminar/cli.py, like laminar/cli_group.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict
from typing import Annotated, Any

import typer

from laminar.cli import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    format_record,
    render_table,
    run,
    text_of,
)
from laminar.cli_auth import client_options
from laminar.cli_common import UserError, fail, parse_duration_ms
from laminar.client import Admin, QueueConfig, QueueDescription, ShareConsumer, ShareMessage
from laminar.client.admin import UNCHANGED

queue_app = typer.Typer(
    help="Inspect share groups (topics read as queues).",
    no_args_is_help=True,
    rich_markup_mode=None,
)

IDLE_MS = 1000
"""Without --follow, `consume --share-group` stops after a fetch this long brings nothing."""


@queue_app.command("describe")
def queue_describe(
    group: str,
    topic: Annotated[str, typer.Option("--topic", "-t", help="The topic the group reads.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Per partition: start offset, available, acquired, delayed, being dead-lettered and the
    age of the oldest message not done; and the records in the group's dead-letter topic."""

    async def go() -> QueueDescription:
        async with Admin(bootstrap, **client_options()) as admin:
            return await admin.describe_queue(group, topic)

    description = run(go)
    if as_json:
        typer.echo(json.dumps(asdict(description), indent=2))
        return
    typer.echo(render_queue(description))


RESETTABLE = {
    "lock": "lock_ms",
    "max-deliveries": "max_deliveries",
    "dead-letter-topic": "dead_letter_topic",
}


@queue_app.command("config")
def queue_config(
    group: str,
    lock: Annotated[
        str | None,
        typer.Option("--lock", help="Lock of each message a member acquires (e.g. 30s, 500ms)."),
    ] = None,
    max_deliveries: Annotated[
        int | None,
        typer.Option("--max-deliveries", help="Deliveries before a message is dead-lettered."),
    ] = None,
    dead_letter_topic: Annotated[
        str | None,
        typer.Option("--dead-letter-topic", help="Where dead letters go (default GROUP.dlq)."),
    ] = None,
    reset: Annotated[
        list[str] | None,
        typer.Option(
            "--reset",
            help="Back to the default: lock, max-deliveries, dead-letter-topic or all "
            "(repeatable).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Show share group GROUP's settings, or change them (stored cluster-wide, applied by
    every partition leader; a new lock applies to messages acquired from now on)."""
    changes: dict[str, Any] = {}
    try:
        if lock is not None:
            changes["lock_ms"] = parse_duration_ms(lock)
    except UserError as exc:
        fail(f"--lock: {exc}")
    if max_deliveries is not None:
        changes["max_deliveries"] = max_deliveries
    if dead_letter_topic is not None:
        changes["dead_letter_topic"] = dead_letter_topic
    for name in reset or []:
        if name != "all" and name not in RESETTABLE:
            fail(f"--reset {name}: expected {', '.join(RESETTABLE)} or all")
        for option, setting in RESETTABLE.items():
            if name in ("all", option):
                if changes.get(setting) is not None:
                    fail(f"--{option} and --reset {name} do not mix")
                changes[setting] = None

    async def go() -> QueueConfig:
        async with Admin(bootstrap, **client_options()) as admin:
            if not changes:
                return await admin.describe_queue_config(group)
            return await admin.alter_queue_config(
                group,
                lock_ms=changes.get("lock_ms", UNCHANGED),
                max_deliveries=changes.get("max_deliveries", UNCHANGED),
                dead_letter_topic=changes.get("dead_letter_topic", UNCHANGED),
            )

    settings = run(go)
    if as_json:
        typer.echo(json.dumps(asdict(settings), indent=2))
        return
    typer.echo(render_queue_config(settings))


def render_queue_config(c: QueueConfig) -> str:
    def source(name: str) -> str:
        return "" if name in c.overridden else "  (default)"

    return "\n".join(
        [
            f"GROUP              {c.group}",
            f"LOCK               {format_age(c.lock_ms)}{source('lock_ms')}",
            f"MAX-DELIVERIES     {c.max_deliveries}{source('max_deliveries')}",
            f"DEAD-LETTER-TOPIC  {c.dead_letter_topic}{source('dead_letter_topic')}",
        ]
    )


def render_queue(d: QueueDescription) -> str:
    lines = [
        f"GROUP          {d.group}",
        f"TOPIC          {d.topic}",
        f"DEAD-LETTERED  {d.dead_lettered} (topic {d.dead_letter_topic})",
        f"SETTINGS       lock {format_age(d.config.lock_ms)}, "
        f"max deliveries {d.config.max_deliveries}"
        + (f" (set: {', '.join(d.config.overridden)})" if d.config.overridden else " (defaults)"),
        "",
    ]
    rows = [
        [
            "PARTITION",
            "START",
            "END",
            "AVAILABLE",
            "ACQUIRED",
            "DELAYED",
            "DEAD-LETTERING",
            "OLDEST-UNACKED",
        ]
    ]
    for p in d.partitions:
        rows.append(
            [
                str(p.partition),
                str(p.start),
                str(p.end),
                str(p.available),
                str(p.acquired),
                str(p.delayed),
                str(p.dead_lettering),
                format_age(p.oldest_unacked_ms),
            ]
        )
    lines.append(render_table(rows))
    return "\n".join(lines)


def format_age(ms: int) -> str:
    """0 -> '-', else a short age: 250ms, 12.5s, 3m20s, 5h02m."""
    if ms <= 0:
        return "-"
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def format_share_message(message: ShareMessage, style: str) -> str:
    if style == "json":
        return json.dumps(
            {
                "topic": message.topic,
                "partition": message.partition,
                "offset": message.offset,
                "timestamp": message.timestamp,
                "key": None if message.key is None else text_of(message.key),
                "value": None if message.value is None else text_of(message.value),
                "headers": {name: text_of(value) for name, value in message.headers},
                "delivery_count": message.delivery_count,
            },
            ensure_ascii=False,
        )
    return format_record(message, style)  # type: ignore[arg-type] - the same fields


async def consume_share(
    bootstrap: str,
    topic: str,
    group: str,
    from_earliest: bool,
    follow: bool,
    count: int | None,
    output: str,
    ack: bool,
    lock_ms: int | None,
) -> int:
    """`laminar consume TOPIC --share-group G`: print messages as this group's member.

    With ``ack`` each message is acknowledged once printed (and flushed). Without, nothing is
    settled while the command runs (a released message would come straight back to it) and
    closing releases everything it printed, so other members get it at once (one delivery
    more on its count). Without ``follow`` it stops once ``IDLE_MS`` brings nothing.
    """
    out = sys.stdout
    printed = 0
    max_records = min(count or 100, 100)
    acks: list[asyncio.Future[None]] = []
    async with ShareConsumer(
        bootstrap,
        group,
        topic,
        lock_ms=lock_ms,
        max_records=max_records,
        from_earliest=from_earliest,
        max_wait_ms=IDLE_MS,
        prefetch=count is None,  # with a count, take no more than it needs
        **client_options(),
    ) as consumer:
        if follow:
            print(f"% reading {topic} as share group {group}", file=sys.stderr, flush=True)
        while count is None or printed < count:
            wanted = max_records if count is None else min(max_records, count - printed)
            messages = await consumer.fetch(timeout_ms=IDLE_MS, max_records=wanted)
            if not messages:
                if follow:
                    continue
                break
            for message in messages:
                out.write(format_share_message(message, output) + "\n")
            out.flush()
            printed += len(messages)
            if ack:
                acks = [a for a in acks if not a.done() or a.exception() is not None]
                acks += [message.ack() for message in messages]  # batched on the wire
        results = await asyncio.gather(*acks, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        print(
            f"% {len(failed)} acks failed ({failed[0]}): those messages will be delivered again",
            file=sys.stderr,
        )
    return printed
