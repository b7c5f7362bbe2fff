"""`laminar produce --delay`, `laminar consume --share-group` and `laminar queue describe` as
subprocesses against a real in-process node."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

import laminar.cli  # noqa: F401 - first, as the app loads it: cli_queue needs cli whole
from laminar.cli_queue import format_age
from tests.single_node import TOPIC, bootstrap
from tests.test_cli_commands import LAMINAR

__all__ = ["bootstrap"]  # the fixture

pytestmark = pytest.mark.timeout(90)


async def cli(address: str, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        LAMINAR,
        *args,
        "--bootstrap",
        address,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def partition_rows(out: str) -> list[list[str]]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("PARTITION"))
    return [line.split() for line in lines[start + 1 :] if line.strip()]


def test_ages_read_well() -> None:
    assert [format_age(ms) for ms in (0, 250, 12_500, 200_000, 18_120_000)] == [
        "-",
        "250ms",
        "12.5s",
        "3m20s",
        "5h02m",
    ]


async def test_share_group_commands(bootstrap: str) -> None:
    code, out, err = await cli(bootstrap, "produce", TOPIC, "--value", "v{i}", "-n", "5")
    assert code == 0, err
    # --release: printed, then given back (nothing consumed)
    code, out, err = await cli(
        bootstrap, "consume", TOPIC, "--share-group", "q", "--release", "--format", "value"
    )
    assert code == 0, err
    assert out.split() == ["v0", "v1", "v2", "v3", "v4"]
    code, out, err = await cli(bootstrap, "queue", "describe", "q", "--topic", TOPIC)
    assert code == 0, err
    assert "DEAD-LETTERED  0 (topic q.dlq)" in out
    ((partition, start, end, available, acquired, delayed, dead, oldest),) = partition_rows(out)
    assert (partition, available, acquired, delayed, dead) == ("0", "5", "0", "0", "0")
    assert int(end) > int(start) and oldest != "-"  # (queue state takes offsets too)
    # -n 2 acks two (each was delivered once before: count 2), the rest stays
    code, out, err = await cli(
        bootstrap, "consume", TOPIC, "-s", "q", "-n", "2", "--format", "json"
    )
    assert code == 0, err
    printed = [json.loads(line) for line in out.splitlines()]
    assert [(m["value"], m["delivery_count"]) for m in printed] == [("v0", 2), ("v1", 2)]
    code, out, err = await cli(bootstrap, "consume", TOPIC, "-s", "q", "--format", "value")
    assert code == 0 and out.split() == ["v2", "v3", "v4"], err
    code, out, err = await cli(bootstrap, "consume", TOPIC, "-s", "q", "--format", "value")
    assert code == 0 and out == "", err  # all acked
    code, out, err = await cli(bootstrap, "queue", "describe", "q", "-t", TOPIC, "--json")
    assert code == 0, err
    (row,) = json.loads(out)["partitions"]
    assert (row["available"], row["acquired"], row["start"]) == (0, 0, row["end"])
    assert row["oldest_unacked_ms"] == 0

    # --delay: not before its time
    sent = time.monotonic()
    code, out, err = await cli(bootstrap, "produce", TOPIC, "--value", "later", "--delay", "2s")
    assert code == 0, err
    code, out, err = await cli(
        bootstrap, "consume", TOPIC, "-s", "q", "-F", "-n", "1", "--format", "value"
    )
    assert code == 0 and out.split() == ["later"], err
    assert time.monotonic() - sent >= 2.0

    code, _, err = await cli(bootstrap, "consume", TOPIC, "-s", "q", "-g", "g")
    assert code == 1 and "do not mix" in err
    code, _, err = await cli(bootstrap, "consume", TOPIC, "-s", "q", "--from", "3")
    assert code == 1 and "earliest or latest" in err
    code, _, err = await cli(bootstrap, "produce", TOPIC, "--value", "x", "--delay", "soon")
    assert code == 1 and err.startswith("error: --delay")


async def test_queue_config_sets_shows_and_resets_a_groups_settings(bootstrap: str) -> None:
    code, out, err = await cli(bootstrap, "queue", "config", "c")
    assert code == 0, err
    assert "LOCK               30.0s  (default)" in out
    assert "DEAD-LETTER-TOPIC  c.dlq  (default)" in out
    code, out, err = await cli(
        bootstrap, "queue", "config", "c", "--lock", "2s", "--max-deliveries", "3",
        "--dead-letter-topic", "c-dead",
    )  # fmt: skip
    assert code == 0, err
    assert "LOCK               2.0s\n" in out + "\n" and "MAX-DELIVERIES     3\n" in out
    code, out, err = await cli(bootstrap, "queue", "describe", "c", "--topic", TOPIC)
    assert code == 0, err
    assert "(topic c-dead)" in out and "lock 2.0s, max deliveries 3 (set: " in out
    code, out, err = await cli(bootstrap, "queue", "config", "c", "--max-deliveries", "0")
    assert code == 1 and "max_deliveries must be between 1 and" in err
    assert "InvalidConfigError" in err
    code, out, err = await cli(bootstrap, "queue", "config", "c", "--reset", "lock", "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["lock_ms"], shown["max_deliveries"], shown["dead_letter_topic"]) == (
        30_000,
        3,
        "c-dead",
    )
    code, out, err = await cli(bootstrap, "queue", "config", "c", "--reset", "all", "--json")
    assert code == 0 and json.loads(out)["overridden"] == [], err
    code, out, err = await cli(bootstrap, "queue", "config", "c", "--reset", "colour")
    assert code == 1 and "--reset colour" in err
    code, out, err = await cli(bootstrap, "queue", "config", "c", "--lock", "1s", "--reset", "all")
    assert code == 1 and "--lock and --reset all do not mix" in err
