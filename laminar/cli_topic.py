"""`laminar topic ...`: create, list, describe, grow, alter and delete topics.

Registered on the main app by laminar/cli.py, like laminar/cli_group.py.
"""

from __future__ import annotations

from typing import Annotated

import typer

from laminar import cli_split
from laminar.cli import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    format_duration,
    format_retention,
    format_size,
    render_table,
    run,
)
from laminar.cli_auth import client_options
from laminar.cli_common import fail, parse_duration_ms, parse_retention, parse_size
from laminar.client import Admin, TopicPartition
from laminar.client.descriptions import TopicDescription
from laminar.protocol import EARLIEST, LATEST
from laminar.splits.ranges import HASH_SPACE

topic_app = typer.Typer(
    help="Create, list, describe, grow, alter and delete topics.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@topic_app.command("create")
def topic_create(
    name: str,
    partitions: Annotated[int, typer.Option("--partitions", "-p", min=1)] = 1,
    replication_factor: Annotated[int, typer.Option("--replication-factor", "-r", min=1)] = 3,
    retention: Annotated[
        str | None, typer.Option(help="Keep data this long: 7d, 12h, 30m, or 'forever'.")
    ] = None,
    retention_bytes: Annotated[
        str | None, typer.Option(help="Keep at most this much per partition: 1g, 512MiB.")
    ] = None,
    segment_bytes: Annotated[str | None, typer.Option(help="Roll segments at this size.")] = None,
    segment_ms: Annotated[str | None, typer.Option(help="Roll segments at this age.")] = None,
    partitioning: Annotated[
        str,
        typer.Option(
            help="hash (fixed partitions) or range (key-hash ranges that split and merge)."
        ),
    ] = "hash",
    auto_split_above: Annotated[
        str | None,
        typer.Option(help="Range topics: split a partition written faster than this (20MB/s)."),
    ] = None,
    auto_merge_below: Annotated[
        str | None,
        typer.Option(help="Range topics: merge sibling partitions both slower than this (2MB/s)."),
    ] = None,
    auto_window: Annotated[
        str, typer.Option(help="Range topics: the window those rates are measured over.")
    ] = "60s",
    max_partitions: Annotated[
        int, typer.Option(help="Range topics: automatic splits stop here (0: 64).", min=0)
    ] = 0,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Create a topic."""

    async def go() -> TopicDescription:
        options = {
            "retention_ms": parse_retention(retention) if retention else None,
            "retention_bytes": parse_size(retention_bytes) if retention_bytes else None,
            "segment_bytes": parse_size(segment_bytes) if segment_bytes else None,
            "segment_ms": parse_duration_ms(segment_ms) if segment_ms else None,
            "auto_split_above": parse_rate(auto_split_above) if auto_split_above else 0,
            "auto_merge_below": parse_rate(auto_merge_below) if auto_merge_below else 0,
            "auto_window_ms": parse_duration_ms(auto_window),
            "max_partitions": max_partitions,
        }
        async with Admin(bootstrap, **client_options()) as admin:
            return await admin.create_topic(
                name, partitions, replication_factor, partitioning=partitioning, **options
            )

    description = run(go)
    typer.echo(
        f"created topic {description.name} ({len(description.partitions)} partitions, "
        f"replication factor {description.replication_factor})"
    )


def _rate_or_off(text: str | None) -> int | None:
    if text is None:
        return None
    return 0 if text.strip().lower() == "off" else parse_rate(text)


def parse_rate(text: str) -> int:
    """'20MB/s', '512k/s' or '1048576' -> bytes per second."""
    return parse_size(text.strip().lower().removesuffix("/s"))


@topic_app.command("list")
def topic_list(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> None:
    """List topics with their partition count and replication factor."""

    async def go() -> list[TopicDescription]:
        async with Admin(bootstrap, **client_options()) as admin:
            names = await admin.list_topics()
            return [admin.cluster.topic(name) for name in names]

    topics = run(go)
    if not topics:
        typer.echo("no topics")
        return
    rows = [["TOPIC", "PARTITIONS", "REPLICATION"]]
    rows += [[t.name, str(len(t.partitions)), str(t.replication_factor)] for t in topics]
    typer.echo(render_table(rows))


@topic_app.command("describe")
def topic_describe(name: str, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> None:
    """Show a topic's settings and where its partitions live."""

    async def go() -> tuple[TopicDescription, dict[TopicPartition, int], dict[TopicPartition, int]]:
        async with Admin(bootstrap, **client_options()) as admin:
            description = await admin.describe_topic(name)
            tps = [
                TopicPartition(name, p.partition)
                for p in description.partitions
                if p.state != "retired"  # retention removed it: nothing to list
            ]
            return (
                description,
                await admin.list_offsets(tps, EARLIEST),
                await admin.list_offsets(tps, LATEST),
            )

    description, starts, ends = run(go)
    typer.echo(f"topic {description.name} (id {description.topic_id})")
    typer.echo(f"  partitions:         {len(description.partitions)}")
    typer.echo(f"  replication factor: {description.replication_factor}")
    typer.echo(f"  partitioning:       {description.partitioning}")
    typer.echo(f"  retention:          {format_retention(description.retention_ms)}")
    if description.retention_bytes:
        typer.echo(f"  retention bytes:    {format_size(description.retention_bytes)}")
    if description.segment_bytes:
        typer.echo(f"  segment bytes:      {format_size(description.segment_bytes)}")
    if description.segment_ms:
        typer.echo(f"  segment age:        {format_duration(description.segment_ms)}")
    rows = [["PARTITION", "LEADER", "REPLICAS", "START", "END"]]
    for p in description.partitions:
        if p.state == "retired":
            continue
        tp = TopicPartition(name, p.partition)
        rows.append(
            [
                str(p.partition),
                str(p.leader) if p.leader else "none",
                ",".join(map(str, p.replicas)),
                str(starts.get(tp, "?")),
                str(ends.get(tp, "?")),
            ]
        )
    typer.echo(render_table(rows))
    if description.partitioning == "range":
        typer.echo("\n".join(cli_split.describe_lines(description)))


@topic_app.command("delete")
def topic_delete(name: str, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> None:
    """Delete a topic and all its data."""

    async def go() -> None:
        async with Admin(bootstrap, **client_options()) as admin:
            await admin.delete_topic(name)

    run(go)
    typer.echo(f"deleted topic {name}")


@topic_app.command("add-partitions")
def topic_add_partitions(
    name: str,
    total: Annotated[
        int, typer.Option("--total", "-t", min=2, help="The partition count afterwards.")
    ],
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Grow a topic to --total partitions. Existing data stays where it is, so (as in Kafka)
    a key may hash to another partition afterwards."""

    async def go() -> TopicDescription:
        async with Admin(bootstrap, **client_options()) as admin:
            return await admin.add_partitions(name, total)

    description = run(go)
    typer.echo(f"topic {description.name} has {len(description.partitions)} partitions")


@topic_app.command("alter")
def topic_alter(
    name: str,
    retention: Annotated[
        str | None, typer.Option(help="Keep data this long: 7d, 12h, 30m, or 'forever'.")
    ] = None,
    retention_bytes: Annotated[
        str | None,
        typer.Option(help="Keep at most this much per partition (1g, 512MiB), or 'unlimited'."),
    ] = None,
    segment_bytes: Annotated[str | None, typer.Option(help="Roll segments at this size.")] = None,
    segment_ms: Annotated[str | None, typer.Option(help="Roll segments at this age.")] = None,
    auto_split_above: Annotated[
        str | None, typer.Option(help="Range topics: split above this rate (20MB/s), or 'off'.")
    ] = None,
    auto_merge_below: Annotated[
        str | None, typer.Option(help="Range topics: merge below this rate (2MB/s), or 'off'.")
    ] = None,
    auto_window: Annotated[str | None, typer.Option(help="Range topics: rate window.")] = None,
    max_partitions: Annotated[
        int | None, typer.Option(help="Range topics: active partitions at most (0: 64).", min=0)
    ] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Change a topic's log settings (every replica applies them at once) or a range topic's
    automatic split/merge policy, at run time."""
    changes = {
        "retention_ms": parse_retention(retention) if retention else None,
        "retention_bytes": (
            (-1 if retention_bytes == "unlimited" else parse_size(retention_bytes))
            if retention_bytes
            else None
        ),
        "segment_bytes": parse_size(segment_bytes) if segment_bytes else None,
        "segment_ms": parse_duration_ms(segment_ms) if segment_ms else None,
        "auto_split_above": _rate_or_off(auto_split_above),
        "auto_merge_below": _rate_or_off(auto_merge_below),
        "auto_window_ms": parse_duration_ms(auto_window) if auto_window else None,
        "max_partitions": max_partitions,
    }
    if all(value is None for value in changes.values()):
        fail(
            "give at least one of --retention, --retention-bytes, --segment-bytes, --segment-ms,"
            " --auto-split-above, --auto-merge-below, --auto-window, --max-partitions"
        )

    async def go() -> TopicDescription:
        async with Admin(bootstrap, **client_options()) as admin:
            return await admin.alter_topic(name, **changes)

    run(go)
    typer.echo(f"altered topic {name}")


@topic_app.command("split")
def topic_split(
    name: str,
    partition: int,
    at: Annotated[
        int | None,
        typer.Option(
            help="Split point in the key-hash space (crc32c of the key); default: "
            "the middle of the partition's range.",
            min=0,
            max=HASH_SPACE - 1,
        ),
    ] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Split an active partition of a range topic: it is sealed and two new partitions take
    its halves (per-key order is kept for readers that follow lineage)."""

    async def go() -> TopicDescription:
        async with Admin(bootstrap, **client_options()) as admin:
            return await admin.split_partition(name, partition, at)

    typer.echo(cli_split.outcome(run(go), f"split {name}/{partition}"))


@topic_app.command("merge")
def topic_merge(
    name: str, first: int, second: int, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP
) -> None:
    """Merge two active partitions with adjacent ranges into one new partition."""

    async def go() -> TopicDescription:
        async with Admin(bootstrap, **client_options()) as admin:
            return await admin.merge_partitions(name, first, second)

    typer.echo(cli_split.outcome(run(go), f"merged {name}/{first} and {name}/{second}"))
