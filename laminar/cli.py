"""The `laminar` command: run nodes, a local dev cluster, and talk to a cluster.

User mistakes (bad options, unknown topics, an unreachable cluster) end with one line on
stderr starting with "error:" and exit code 1; tracebacks are for bugs only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import structlog
import typer
import uvloop

from laminar.cli_auth import Password, User, client_options, set_client_login
from laminar.cli_common import UserError, fail, parse_duration_ms
from laminar.cli_health import leaderless, render_health, under_replicated
from laminar.cli_node import node_start
from laminar.cli_tls import (
    TlsCa,
    TlsCert,
    TlsKey,
    dev_tls_note,
    set_client_tls,
)
from laminar.client import (
    DEFAULT_BOOTSTRAP,
    Admin,
    Consumer,
    ConsumerRecord,
    Producer,
    TopicPartition,
)
from laminar.client.descriptions import ClusterStatus, TopicDescription
from laminar.client.localcluster import LocalCluster
from laminar.client.offsets import list_offsets
from laminar.errors import LaminarError, TopicExistsError, UnsupportedCompressionError
from laminar.protocol import ACKS_BY_NAME, EARLIEST, LATEST
from laminar.segment.compression import codec_of

T = TypeVar("T")

app = typer.Typer(
    name="laminar",
    help="laminar: a distributed, partitioned, Raft-replicated, immutable log.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
node_app = typer.Typer(help="Run a node.", no_args_is_help=True, rich_markup_mode=None)
cluster_app = typer.Typer(help="Inspect the cluster.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(node_app, name="node")
app.add_typer(cluster_app, name="cluster")

Bootstrap = Annotated[
    str,
    typer.Option(
        "--bootstrap",
        "-b",
        envvar="LAMINAR_BOOTSTRAP",
        help="Client addresses host:port[,host:port...] of any cluster nodes.",
    ),
]


@app.callback()
def _quiet_library_logs(
    tls_ca: TlsCa = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    user: User = None,
    password: Password = None,
) -> None:
    """Client-library logs stay out of command output (errors only, on stderr).

    `laminar node start` sets up the node's own logging instead. The TLS and login options
    apply to every client command: `laminar --tls-ca ca.pem --user root topic list`.
    """
    set_client_tls(tls_ca, tls_cert, tls_key)
    set_client_login(user, password)
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    """Run a client coroutine on uvloop, turning expected failures into one-line errors."""
    try:
        return uvloop.run(_call(coro_fn))
    except UserError as exc:
        fail(str(exc))
    except ConnectionError as exc:
        fail(f"{exc} (is the cluster running? `laminar dev` starts one; see --bootstrap)")
    except LaminarError as exc:
        fail(f"{exc} ({type(exc).__name__})")
    except (ValueError, TypeError, OSError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


async def _call(coro_fn: Callable[[], Awaitable[T]]) -> T:
    return await coro_fn()


# parsing ---------------------------------------------------------------------------------
StartPosition = tuple[str, int]
"""("earliest"|"latest", 0), ("offset", n) or ("timestamp", ms)."""


def parse_start(text: str, now_ms: int | None = None) -> StartPosition:
    """--from: earliest, latest, an offset, @MS / an ISO date-time, or -DURATION (ago)."""
    value = text.strip()
    lowered = value.lower()
    if lowered in ("earliest", "beginning", "start"):
        return ("earliest", EARLIEST)
    if lowered in ("latest", "end"):
        return ("latest", LATEST)
    if value.isdigit():
        return ("offset", int(value))
    if value.startswith("@") and value[1:].isdigit():
        return ("timestamp", int(value[1:]))
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    if value.startswith("-") and len(value) > 1:
        try:
            return ("timestamp", max(now - parse_duration_ms(value[1:]), 0))
        except UserError:
            pass
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(
            f"--from {text!r} is not earliest, latest, an offset, @<ms since epoch>, "
            "an ISO date-time or -<duration> (e.g. -15m)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return ("timestamp", int(moment.timestamp() * 1000))


def parse_header(text: str) -> tuple[str, bytes]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise UserError(f"header {text!r} is not NAME=VALUE")
    return name, value.encode()


def text_of(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", errors="backslashreplace")


def format_timestamp(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_record(record: ConsumerRecord, style: str) -> str:
    if style == "value":
        return text_of(record.value)
    if style == "json":
        return json.dumps(
            {
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "timestamp": record.timestamp,
                "key": None if record.key is None else text_of(record.key),
                "value": None if record.value is None else text_of(record.value),
                "headers": {name: text_of(value) for name, value in record.headers},
            },
            ensure_ascii=False,
        )
    key = "-" if record.key is None else text_of(record.key)
    return (
        f"{record.partition}:{record.offset}\t{format_timestamp(record.timestamp)}"
        f"\t{key}\t{text_of(record.value)}"
    )


# node ------------------------------------------------------------------------------------
node_app.command("start")(node_start)


@node_app.command("drain")
def node_drain(
    node_id: Annotated[int, typer.Argument(help="The node to empty.")],
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="Wait until the node holds no replica.")
    ] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait at most.")] = 600.0,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Move every replica off a node so it can leave the cluster."""

    async def go() -> int:
        async with Admin(bootstrap, **client_options()) as admin:
            await admin.drain_node(node_id)
            deadline = time.monotonic() + timeout
            while wait:
                status = await admin.cluster_status()
                left = sum(m.replicas for m in status.members if m.node_id == node_id)
                if left == 0 and not status.moves:
                    break
                if time.monotonic() > deadline:
                    raise UserError(f"node {node_id} still holds {left} replicas")
                await asyncio.sleep(1.0)
            return 0

    run(go)
    typer.echo(f"node {node_id} is drained" if wait else f"node {node_id} is draining")


@node_app.command("undrain")
def node_undrain(
    node_id: Annotated[int, typer.Argument(help="The node to take replicas again.")],
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Undo a drain: the node takes replicas again as the cluster evens out replica counts."""

    async def go() -> None:
        async with Admin(bootstrap, **client_options()) as admin:
            await admin.undrain_node(node_id)

    run(go)
    typer.echo(f"node {node_id} takes replicas again")


# dev -------------------------------------------------------------------------------------
@app.command()
def dev(
    data_dir: Annotated[Path, typer.Option(help="Where the nodes keep data and logs.")] = Path(
        ".laminar"
    ),
    nodes: Annotated[int, typer.Option(help="How many nodes.", min=1, max=9)] = 3,
    base_port: Annotated[
        int,
        typer.Option(
            help="Node N listens on base+100*(N-1), peers on that +1, Kafka on +2, HTTP "
            "metrics on +3."
        ),
    ] = 9092,
    topic: Annotated[str, typer.Option(help="Demo topic created at start.")] = "demo",
    ready_timeout: Annotated[float, typer.Option(help="Seconds to wait for the cluster.")] = 60,
    tls: Annotated[
        bool, typer.Option(help="TLS on every port and signed gossip, with a throw-away CA.")
    ] = False,
) -> None:
    """Run a local cluster in the foreground (Ctrl-C stops it); data under ./.laminar."""
    ports = [(base_port + 100 * i, base_port + 100 * i + 1) for i in range(nodes)]
    if ports[-1][1] + 2 > 65535:
        fail("--base-port is too high for that many nodes")
    kafka_ports = [client + 2 for client, _ in ports]
    metrics_ports = [client + 3 for client, _ in ports]
    cluster = LocalCluster(
        data_dir, ports, tls=tls, kafka_ports=kafka_ports, metrics_ports=metrics_ports
    )
    busy = cluster.busy_addresses()
    if busy:
        fail(
            f"{', '.join(busy)} already in use (another `laminar dev`?); "
            "stop it or pick another --base-port"
        )
    code = uvloop.run(_dev(cluster, topic, ready_timeout))
    raise typer.Exit(code)


async def _dev(cluster: LocalCluster, topic: str, ready_timeout: float) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    count = len(cluster.nodes)
    typer.echo(f"starting {count} nodes (data and logs under {cluster.root}/) ...")
    cluster.start()
    try:
        ready = asyncio.ensure_future(_dev_prepare(cluster, topic, ready_timeout))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait([ready, stopping], return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            await asyncio.gather(ready, return_exceptions=True)
            return 0
        stopping.cancel()
        try:
            ready.result()
        except (TimeoutError, RuntimeError, ConnectionError, LaminarError) as exc:
            typer.echo(f"error: {exc}", err=True)
            for node in cluster.nodes.values():
                typer.echo(f"  node {node.node_id} log: {node.log_path}", err=True)
            return 1
        typer.echo(_dev_banner(cluster, topic))
        reported: set[int] = set()
        while not stop.is_set():
            for node in cluster.exited():
                if node.node_id not in reported:
                    reported.add(node.node_id)
                    typer.echo(
                        f"warning: node {node.node_id} exited with code {node.returncode}; "
                        f"see {node.log_path}",
                        err=True,
                    )
            if len(reported) == count:
                typer.echo("error: every node has exited", err=True)
                return 1
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await stop.wait()
        return 0
    finally:
        typer.echo("stopping nodes ...")
        await asyncio.to_thread(cluster.stop, 10.0)
        typer.echo("stopped")


async def _dev_prepare(cluster: LocalCluster, topic: str, timeout: float) -> None:
    await cluster.wait_ready(timeout)
    async with Admin(cluster.bootstrap, ssl=cluster.client_ssl) as admin:
        if topic not in await admin.list_topics():
            replication = min(3, len(cluster.nodes))
            with contextlib.suppress(TopicExistsError):
                await admin.create_topic(topic, partitions=3, replication_factor=replication)


def _dev_banner(cluster: LocalCluster, topic: str) -> str:
    bootstrap = cluster.bootstrap
    flag = "" if bootstrap == DEFAULT_BOOTSTRAP else f" --bootstrap {bootstrap}"
    nodes = "\n".join(
        f"  node {n.node_id}: {n.client_address}, Kafka {n.kafka_address} "
        f"(pid {n.pid}, log {n.log_path})"
        + (f"\n          metrics http://{n.metrics_address}/metrics" if n.metrics_address else "")
        for n in cluster.nodes.values()
    )
    return f"""
laminar dev cluster is running
{nodes}

Try, in another terminal:
  laminar cluster status{flag}
  laminar cluster health{flag}
  laminar produce {topic} --value 'hello {{i}}' -n 1000{flag}
  echo 'one line, one record' | laminar produce {topic}{flag}
  laminar consume {topic} --from earliest{flag}
  laminar consume {topic} --from latest --follow{flag}
  laminar topic create events --partitions 6 --replication-factor 3 --retention 7d{flag}

Or from Python:
  import asyncio
  from laminar.client import Producer, Consumer

  async def main():
      async with Producer("{bootstrap}") as producer:
          sent = await producer.send_and_wait("{topic}", b"hello", key=b"user-1")
          print(sent)
      async with Consumer("{bootstrap}") as consumer:
          await consumer.subscribe("{topic}")
          await consumer.seek_to_beginning()
          for record in await consumer.getmany(timeout_ms=1000):
              print(record.partition, record.offset, record.value)

  asyncio.run(main())

Kafka clients and tools work too (bootstrap.servers={cluster.kafka_bootstrap}):
  kcat -b {cluster.kafka_bootstrap} -t {topic} -C -e

{dev_tls_note(cluster)}Ctrl-C stops the cluster."""


def format_duration(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def format_size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


def format_retention(ms: int | None) -> str:
    if ms is None:
        return "node default"
    if ms < 0:
        return "forever"
    return format_duration(ms)


def render_table(rows: list[list[str]]) -> str:
    """Left-aligned columns, two spaces apart (plain text: pipes and greps keep working)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


# produce ---------------------------------------------------------------------------------
@app.command()
def produce(
    topic: str,
    key: Annotated[str | None, typer.Option("--key", "-k", help="Key of every record.")] = None,
    value: Annotated[
        str | None, typer.Option("--value", "-v", help="The value; '{i}' becomes the index.")
    ] = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="Send this file as one record.")
    ] = None,
    count: Annotated[
        int | None, typer.Option("--count", "-n", min=1, help="Send COUNT records.")
    ] = None,
    partition: Annotated[int | None, typer.Option("--partition", "-p", min=0)] = None,
    header: Annotated[
        list[str] | None, typer.Option("--header", "-H", help="NAME=VALUE, repeatable.")
    ] = None,
    key_separator: Annotated[
        str | None, typer.Option(help="Split stdin lines into KEY<sep>VALUE.")
    ] = None,
    acks: Annotated[str, typer.Option(help="all, leader or none.")] = "all",
    linger_ms: Annotated[float, typer.Option(help="Batching delay.")] = 5.0,
    compression: Annotated[
        str,
        typer.Option(
            "--compression", "-z", help="none, gzip, snappy, lz4 or zstd (Kafka's codecs)."
        ),
    ] = "none",
    delay: Annotated[
        str | None,
        typer.Option(
            "--delay",
            help="Share groups deliver each record no earlier than this after it is sent "
            "(30s, 5m, ...); stream consumers see it at once.",
        ),
    ] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Send records: --value (COUNT times), --file, or one record per stdin line."""
    try:
        delay_ms = None if delay is None else parse_duration_ms(delay)
    except UserError as exc:
        fail(f"--delay: {exc}")
    if value is not None and file is not None:
        fail("give either --value or --file, not both")
    if acks not in ACKS_BY_NAME:
        fail(f"--acks must be one of {', '.join(ACKS_BY_NAME)}, not {acks!r}")
    try:
        codec_of(compression)
    except UnsupportedCompressionError as exc:
        fail(f"--compression: {exc}")
    if file is not None and count is not None:
        fail("--file sends one record; --count does not apply")
    try:
        headers = tuple(parse_header(h) for h in header or [])
    except UserError as exc:
        fail(str(exc))
    if file is not None:
        try:
            payloads: Iterator[tuple[bytes | None, bytes]] = iter([(_key(key), file.read_bytes())])
        except OSError as exc:
            fail(f"cannot read {file}: {exc.strerror or exc}")
        total: int | None = 1
    elif value is not None:
        payloads = _repeat(key, value, count or 1)
        total = count or 1
    else:
        if sys.stdin.isatty():
            typer.echo("reading records from stdin, one per line (Ctrl-D ends) ...", err=True)
        payloads = _stdin_lines(key, key_separator, count)
        total = count

    async def go() -> tuple[int, list[Any], float]:
        return await _produce(
            bootstrap,
            topic,
            payloads,
            total,
            partition,
            headers,
            acks,
            linger_ms,
            delay_ms,
            compression,
        )

    sent, last, elapsed = run(go)
    if sent == 1 and last:
        meta = last[0]
        where = f"offset {meta.offset}" if meta.offset >= 0 else "offset unknown (acks=none)"
        typer.echo(f"produced 1 record to {topic} partition {meta.partition} {where}")
    else:
        rate = sent / elapsed if elapsed > 0 else 0.0
        typer.echo(f"produced {sent} records to {topic} in {elapsed:.2f} s ({rate:,.0f} records/s)")


def _key(key: str | None) -> bytes | None:
    return None if key is None else key.encode()


def _repeat(key: str | None, value: str, count: int) -> Iterator[tuple[bytes | None, bytes]]:
    templated = "{i}" in value
    fixed = value.encode()
    encoded_key = _key(key)
    for index in range(count):
        yield encoded_key, (value.replace("{i}", str(index)).encode() if templated else fixed)


def _stdin_lines(
    key: str | None, separator: str | None, limit: int | None
) -> Iterator[tuple[bytes | None, bytes]]:
    encoded_key = _key(key)
    for index, line in enumerate(sys.stdin.buffer):
        if limit is not None and index >= limit:
            return
        data = line.rstrip(b"\r\n")
        if separator:
            record_key, sep, record_value = data.partition(separator.encode())
            if not sep:
                raise UserError(f"stdin line {index + 1} has no key separator {separator!r}")
            yield record_key, record_value
        else:
            yield encoded_key, data


async def _produce(
    bootstrap: str,
    topic: str,
    payloads: Iterator[tuple[bytes | None, bytes]],
    total: int | None,
    partition: int | None,
    headers: tuple[tuple[str, bytes], ...],
    acks: str,
    linger_ms: float,
    delay_ms: int | None = None,
    compression: str = "none",
) -> tuple[int, list[Any], float]:
    from rich.console import Console
    from rich.progress import Progress

    started = time.perf_counter()
    sent = 0
    pending: list[asyncio.Future[Any]] = []
    results: list[Any] = []
    show_progress = total is not None and total > 1
    console = Console(stderr=True)
    with Progress(console=console, transient=True, disable=not show_progress) as progress:
        task = progress.add_task(f"producing to {topic}", total=total)
        async with Producer(
            bootstrap, acks=acks, linger_ms=linger_ms, compression=compression, **client_options()
        ) as producer:
            for record_key, record_value in payloads:
                future = await producer.send(
                    topic,
                    record_value,
                    key=record_key,
                    headers=headers,
                    partition=partition,
                    delay_ms=delay_ms,
                )
                pending.append(future)
                sent += 1
                if len(pending) >= 5_000:
                    results = list(await asyncio.gather(*pending))
                    progress.update(task, advance=len(pending))
                    pending.clear()
            await producer.flush()
            if pending:
                results = list(await asyncio.gather(*pending))
                progress.update(task, advance=len(pending))
    return sent, results[-1:], time.perf_counter() - started


# consume ---------------------------------------------------------------------------------
@app.command()
def consume(
    topic: str,
    partition: Annotated[
        list[int] | None, typer.Option("--partition", "-p", help="Only these partitions.")
    ] = None,
    start: Annotated[
        str,
        typer.Option(
            "--from",
            help="earliest, latest, an OFFSET, @MS, an ISO date-time, or -DURATION (e.g. -15m).",
        ),
    ] = "earliest",
    follow: Annotated[
        bool, typer.Option("--follow", "-F", help="Keep waiting for new records.")
    ] = False,
    count: Annotated[
        int | None, typer.Option("--count", "-n", min=1, help="Stop after COUNT records.")
    ] = None,
    output: Annotated[str, typer.Option("--format", help="text, json or value.")] = "text",
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            "-g",
            help="Read as a member of this consumer group: its share of the partitions, from "
            "the group's committed offsets (--from applies where none is committed), "
            "committing what was printed.",
        ),
    ] = None,
    share_group: Annotated[
        str | None,
        typer.Option(
            "--share-group",
            "-s",
            help="Read as a member of this share group (the topic as a queue): messages no "
            "other member holds, from every partition. --from earliest or latest applies "
            "where the group is new. Without --follow, stops once nothing comes for 1 s.",
        ),
    ] = None,
    ack: Annotated[
        bool,
        typer.Option(
            "--ack/--release",
            help="With --share-group: acknowledge each message once printed (done), or "
            "release them all when the command ends (delivered again, to any member).",
        ),
    ] = True,
    lock: Annotated[
        str | None,
        typer.Option(
            "--lock",
            help="With --share-group: the lock of each message (default: the group's, "
            "see `laminar queue config`).",
        ),
    ] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Print records: up to the current end, or forever with --follow."""
    if output not in ("text", "json", "value"):
        fail(f"--format must be text, json or value, not {output!r}")
    try:
        position = parse_start(start)
    except UserError as exc:
        fail(str(exc))
    if share_group is not None:
        if group is not None:
            fail("--group and --share-group do not mix")
        if partition:
            fail("--partition and --share-group do not mix (members read every partition)")
        if position[0] not in ("earliest", "latest"):
            fail("with --share-group, --from is earliest or latest (where the group is new)")
        try:
            lock_ms = None if lock is None else parse_duration_ms(lock)
        except UserError as exc:
            fail(f"--lock: {exc}")
        if lock_ms is not None and lock_ms <= 0:
            fail("--lock must be positive")
    if group is not None:
        if position[0] not in ("earliest", "latest"):
            fail("with --group, --from is earliest or latest (where nothing is committed yet)")
        if partition:
            fail("--partition and --group do not mix (the group assigns partitions)")

    async def go() -> int:
        if share_group is not None:
            return await consume_share(
                bootstrap,
                topic,
                share_group,
                position[0] == "earliest",
                follow,
                count,
                output,
                ack,
                lock_ms,
            )
        if group is not None:
            return await consume_group(bootstrap, topic, group, position[0], follow, count, output)
        return await _consume(bootstrap, topic, partition, position, follow, count, output)

    run(go)


async def _consume(
    bootstrap: str,
    topic: str,
    partitions: list[int] | None,
    position: StartPosition,
    follow: bool,
    count: int | None,
    output: str,
) -> int:
    async with Consumer(bootstrap, auto_offset_reset="none", **client_options()) as consumer:
        description = await consumer.cluster.wait_for_topic(topic, 5.0)
        available = [p.partition for p in description.partitions]
        for number in partitions or []:
            if number not in available:
                raise UserError(
                    f"topic {topic} has no partition {number} (it has {len(available)})"
                )
        tps = [TopicPartition(topic, p) for p in (partitions or available)]
        if description.partitioning == "range" and not partitions:
            await consumer.subscribe(topic)  # also follows partitions that splits create
        else:
            await consumer.assign(tps)
        kind, where = position
        if kind == "earliest":
            await consumer.seek_to_beginning(*tps)
        elif kind == "latest":
            await consumer.seek_to_end(*tps)
        elif kind == "timestamp":
            await consumer.seek_to_timestamp(tps, where)
        else:
            starts = await list_offsets(consumer.cluster, tps, EARLIEST)
            ends = await list_offsets(consumer.cluster, tps, LATEST)
            for tp in tps:
                if not starts[tp] <= where <= ends[tp]:
                    raise UserError(
                        f"offset {where} is out of range for {topic}/{tp.partition} "
                        f"[{starts[tp]}, {ends[tp]}]"
                    )
                await consumer.seek(tp, where)
        if follow:
            ends = {}
            # Like kcat's "% Reached end" notes: on stderr, so scripts (and tests) can tell
            # that records produced from now on will be printed.
            starts = ", ".join(f"{tp.partition}@{consumer.position(tp)}" for tp in tps)
            print(f"% following {topic} from {starts}", file=sys.stderr, flush=True)
        else:
            ends = await list_offsets(consumer.cluster, tps, LATEST)
        printed = 0
        out = sys.stdout
        while True:
            if not follow and all(consumer.position(tp) >= ends[tp] for tp in tps):
                break
            for record in await consumer.getmany(timeout_ms=500):
                if not follow and record.offset >= ends[TopicPartition(topic, record.partition)]:
                    continue
                out.write(format_record(record, output) + "\n")
                printed += 1
                if count is not None and printed >= count:
                    out.flush()
                    return printed
            out.flush()
        return printed


# cluster ---------------------------------------------------------------------------------
@cluster_app.command("status")
def cluster_status(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Under-replicated and leaderless partitions, members, partitions, leaders, replica lag."""

    async def go() -> tuple[ClusterStatus, list[TopicDescription]]:
        async with Admin(bootstrap, **client_options()) as admin:
            status = await admin.cluster_status()
            names = await admin.list_topics()
            described = await asyncio.gather(
                *(admin.describe_topic(name) for name in names), return_exceptions=True
            )
            return status, [t for t in described if isinstance(t, TopicDescription)]

    status, topics = run(go)
    if as_json:
        shown = asdict(status)
        shown["under_replicated"] = [asdict(p) for p in under_replicated(status, topics)]
        shown["leaderless"] = [asdict(p) for p in leaderless(status, topics)]
        typer.echo(json.dumps(shown, indent=2))
        return
    typer.echo(render_status(status, topics))


def render_status(status: ClusterStatus, topics: Sequence[TopicDescription] = ()) -> str:
    """The status as tables, partitions needing attention first (``cli_health.py``)."""
    members = [["NODE", "ADDRESS", "STATE", "INCARNATION", "VOTER", "REPLICAS", "LEADERS"]]
    for m in status.members:
        node = f"{m.node_id}*" if m.node_id == status.metadata_leader else str(m.node_id)
        members.append(
            [
                node,
                m.address,
                m.state,
                str(m.incarnation),
                "yes" if m.metadata_voter else "no",
                str(m.replicas),
                str(m.leaders),
            ]
        )
    parts = [
        *render_health(status, topics, render_table),
        f"members ({len(status.members)}; * = metadata leader)",
        render_table(members),
        "",
        f"partitions ({len(status.partitions)})",
    ]
    if status.partitions:
        rows = [["TOPIC", "PART", "LEADER", "TERM", "START", "HW", "END", "REPLICAS (LAG)"]]
        for p in status.partitions:
            replicas = " ".join(f"{r.node_id}({r.lag})" for r in p.replicas)
            rows.append(
                [
                    p.topic,
                    str(p.partition),
                    str(p.leader) if p.leader else "none",
                    str(p.term),
                    str(p.start_offset),
                    str(p.high_watermark),
                    str(p.end_offset),
                    replicas,
                ]
            )
        parts.append(render_table(rows))
    else:
        parts.append("no partitions")
    if status.moves:
        parts += ["", f"replica moves ({len(status.moves)})"]
        rows = [["TOPIC", "PART", "FROM", "TO", "STAGE"]]
        rows += [
            [m.topic, str(m.partition), str(m.from_node), str(m.to_node), m.stage]
            for m in status.moves
        ]
        parts.append(render_table(rows))
    parts += cli_split.status_lines(status.operations)
    if status.faults:
        parts += ["", f"replicas not serving ({len(status.faults)})"]
        rows = [["TOPIC", "PART", "NODE", "STATE", "ERROR"]]
        rows += [
            [f.topic, str(f.partition), str(f.node_id), f.state, f.error] for f in status.faults
        ]
        parts.append(render_table(rows))
    if status.metadata_log:
        parts += ["", "metadata log (starts at its newest durable checkpoint once cut)"]
        rows = [["NODE", "START", "END", "CHECKPOINT", "APPLIED", "SIZE"]]
        rows += [
            [
                str(m.node_id),
                str(m.start_offset),
                str(m.end_offset),
                str(m.checkpoint) if m.checkpoint >= 0 else "-",
                str(m.applied),
                format_size(m.size_bytes),
            ]
            for m in status.metadata_log
        ]
        parts.append(render_table(rows))
    return "\n".join(parts)


from laminar import cli_cluster, cli_split  # noqa: E402, F401 - needs the helpers above
from laminar.cli_acl import acl_app  # noqa: E402 - needs the helpers above
from laminar.cli_group import consume_group, group_app  # noqa: E402 - needs the helpers above
from laminar.cli_queue import consume_share, queue_app  # noqa: E402 - needs the helpers above
from laminar.cli_topic import topic_app  # noqa: E402 - needs the helpers above
from laminar.cli_user import user_app  # noqa: E402 - needs the helpers above

app.add_typer(topic_app, name="topic")
app.add_typer(group_app, name="group")
app.add_typer(queue_app, name="queue")
app.add_typer(user_app, name="user")
app.add_typer(acl_app, name="acl")
