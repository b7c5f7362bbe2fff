"""`laminar cluster health`: is the cluster whole? Counts, cheap enough to poll.

Registered on the `cluster` group by laminar/cli.py. Meant for scripts as much as people: the
exit status is 0 when healthy and 2 when not (1 stays for errors), and `--exit-when-healthy`
waits for health, the step a rolling restart takes between nodes (as `rpk cluster health
--watch --exit-when-healthy` does for Redpanda).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated

import typer

from laminar.cli import DEFAULT_BOOTSTRAP, Bootstrap, cluster_app, run
from laminar.cli_auth import client_options
from laminar.client import Admin, ClusterHealth
from laminar.errors import LaminarError

UNHEALTHY = 2
"""Exit status of a cluster that is not healthy (or did not become so in --timeout)."""


@cluster_app.command("health")
def cluster_health(
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Print the health again every --interval.")
    ] = False,
    exit_when_healthy: Annotated[
        bool,
        typer.Option(
            "--exit-when-healthy",
            "-e",
            help="Wait until the cluster is healthy (errors while a node restarts are retried).",
        ),
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", help="Seconds between polls.", min=0.05)
    ] = 1.0,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", help="With -w or -e: give up after this many seconds (0: never).", min=0
        ),
    ] = 0.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Nodes down, leaderless and under-replicated partitions, replicas not serving.

    Healthy means every registered node is up and answered, every partition has a leader and
    every replica of it is in sync (connected, streamed to, sent every committed entry) and
    serving. Exit status: 0 healthy, 2 not (or not within --timeout).
    """
    polling = watch or exit_when_healthy

    def show(health: ClusterHealth) -> None:
        if as_json:
            typer.echo(json.dumps(_as_dict(health), separators=(",", ":") if watch else None))
        else:
            if watch:
                typer.echo(f"--- {datetime.now(UTC).strftime('%H:%M:%S')}")
            typer.echo(render(health))

    async def go() -> bool:
        deadline = time.monotonic() + timeout if timeout > 0 else None
        admin = Admin(bootstrap, **client_options())
        healthy = False  # as last answered
        try:
            while True:
                try:
                    await admin.start()  # (again after a failed connect: the node restarts)
                    health = await admin.cluster_health()
                except (LaminarError, ConnectionError, OSError) as exc:
                    if not polling:
                        raise
                    typer.echo(f"not answered: {exc}", err=True)
                    healthy = False
                else:
                    healthy = health.healthy
                    if watch or not polling or healthy:
                        show(health)
                    if (healthy and exit_when_healthy) or not polling:
                        return healthy
                if deadline is not None and time.monotonic() >= deadline:
                    if not healthy:
                        typer.echo(f"not healthy within {timeout:g} s", err=True)
                    return healthy
                await asyncio.sleep(interval)
        finally:
            await admin.close()

    if not run(go):
        raise typer.Exit(UNHEALTHY)


def _as_dict(health: ClusterHealth) -> dict[str, object]:
    shown = asdict(health)
    shown["out_of_sync"] = {str(n): c for n, c in health.out_of_sync.items()}
    return shown


def render(health: ClusterHealth) -> str:
    """Aligned ``name: value`` lines, the verdict first."""

    def nodes(ids: tuple[int, ...]) -> str:
        return " ".join(map(str, ids)) or "-"

    def parts(count: int, named: tuple[tuple[str, int], ...]) -> str:
        shown = " ".join(f"{topic}/{partition}" for topic, partition in named) or "-"
        return f"{shown} ..." if count > len(named) else shown

    verdict = "yes" if health.healthy else f"no ({', '.join(health.reasons)})"
    lagging = " ".join(f"{n}:{c}" for n, c in sorted(health.out_of_sync.items())) or "-"
    faults = " ".join(
        f"{f.topic}/{f.partition}@{f.node_id} ({f.state})" for f in health.replica_faults
    )
    rows = [
        ("healthy", verdict),
        ("metadata leader", str(health.metadata_leader) if health.metadata_leader else "none"),
        ("nodes", nodes(health.nodes)),
        ("nodes down", nodes(health.nodes_down)),
        ("nodes not answering", nodes(health.nodes_not_answering)),
        ("partitions", str(health.partitions)),
        (
            f"leaderless ({health.leaderless_count})",
            parts(health.leaderless_count, health.leaderless),
        ),
        (
            f"under-replicated ({health.under_replicated_count})",
            parts(health.under_replicated_count, health.under_replicated),
        ),
        ("replicas out of sync (node:count)", lagging),
        (f"replicas not serving ({health.replica_faults_count})", faults or "-"),
    ]
    width = max(len(name) for name, _ in rows) + 2
    return "\n".join(f"{name + ':':<{width}}{value}" for name, value in rows)
