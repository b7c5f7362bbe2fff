"""CLI option parsing and output formatting (no cluster needed)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from laminar.cli import (
    format_record,
    format_retention,
    format_size,
    parse_header,
    parse_start,
    render_table,
)
from laminar.cli_common import UserError, parse_duration_ms, parse_retention, parse_size
from laminar.client import ConsumerRecord

LAMINAR = str(Path(sys.executable).with_name("laminar"))


def test_parse_start() -> None:
    assert parse_start("earliest") == ("earliest", -2)
    assert parse_start("latest") == ("latest", -1)
    assert parse_start("42") == ("offset", 42)
    assert parse_start("@1700000000000") == ("timestamp", 1_700_000_000_000)
    assert parse_start("2023-11-14T22:13:20Z") == ("timestamp", 1_700_000_000_000)
    assert parse_start("2023-11-14T22:13:20") == ("timestamp", 1_700_000_000_000)  # UTC
    assert parse_start("-15m", now_ms=1_000_000_000) == ("timestamp", 1_000_000_000 - 900_000)
    for bad in ("yesterday", "-x", "@abc", ""):
        with pytest.raises(UserError, match="--from"):
            parse_start(bad)


def test_parse_durations_sizes_headers() -> None:
    assert parse_duration_ms("500ms") == 500
    assert parse_duration_ms("30s") == 30_000
    assert parse_duration_ms("1.5h") == 5_400_000
    assert parse_duration_ms("7d") == 7 * 86_400_000
    assert parse_duration_ms("250") == 250
    with pytest.raises(UserError, match="not a duration"):
        parse_duration_ms("soon")
    assert parse_retention("forever") == -1
    assert parse_retention("12h") == 43_200_000
    with pytest.raises(UserError, match="positive"):
        parse_retention("0")
    assert parse_size("64k") == 65_536
    assert parse_size("16MiB") == 16 << 20
    assert parse_size("1g") == 1 << 30
    assert parse_size("4096") == 4096
    with pytest.raises(UserError, match="not a size"):
        parse_size("big")
    assert parse_header("trace=abc=1") == ("trace", b"abc=1")
    with pytest.raises(UserError, match="NAME=VALUE"):
        parse_header("novalue")
    assert format_retention(None) == "node default"
    assert format_retention(-1) == "forever"
    assert format_retention(604_800_000) == "7d"
    assert [format_size(n) for n in (64 << 20, 1 << 30, 1536, 4096)] == [
        "64MiB",
        "1GiB",
        "1536B",
        "4KiB",
    ]
    assert parse_size(format_size(64 << 20)) == 64 << 20


def test_record_formats_and_tables() -> None:
    record = ConsumerRecord(
        "t", 2, 17, 1_700_000_000_123, b"k", b"caf\xc3\xa9 \xff", (("h", b"v"),)
    )
    assert format_record(record, "value") == "café \\xff"
    assert format_record(record, "text") == "2:17\t2023-11-14T22:13:20.123Z\tk\tcafé \\xff"
    data = json.loads(format_record(record, "json"))
    assert data == {
        "topic": "t",
        "partition": 2,
        "offset": 17,
        "timestamp": 1_700_000_000_123,
        "key": "k",
        "value": "café \\xff",
        "headers": {"h": "v"},
    }
    nulls = ConsumerRecord("t", 0, 0, 0, None, None)
    assert format_record(nulls, "text").split("\t")[2:] == ["-", ""]
    assert render_table([["A", "BB"], ["ccc", "d"]]) == "A    BB\nccc  d"


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LAMINAR, *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def test_user_mistakes_give_one_line_errors() -> None:
    # Nothing listens on port 1: a clear error naming the cause, no traceback.
    result = run_cli("topic", "list", "--bootstrap", "127.0.0.1:1")
    assert result.returncode == 1
    assert result.stderr.startswith("error: cannot reach any node of 127.0.0.1:1")
    assert "connection refused" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr
    checks = [
        (["consume", "t", "--from", "yesterday"], "error: --from 'yesterday' is not"),
        (["consume", "t", "--format", "xml"], "error: --format must be"),
        (["produce", "t", "--value", "a", "--file", "x"], "error: give either --value or --file"),
        (["produce", "t", "--acks", "two"], "error: --acks must be one of"),
        (["produce", "t", "-H", "bad", "--value", "v"], "error: header 'bad' is not NAME=VALUE"),
        (
            ["topic", "list", "--bootstrap", "nonsense"],
            "error: address 'nonsense' is not host:port",
        ),
        (
            ["topic", "create", "x", "--retention", "soon", "-b", "127.0.0.1:1"],
            "error: 'soon' is not a duration",
        ),
        (
            ["node", "start", "--node-id", "1", "--data-dir", "/tmp/x", "--peers", "1=oops"],
            "error: address 'oops' is not host:port",
        ),
        (
            ["node", "start", "--node-id", "4", "--data-dir", "/tmp/x", "--peers", "1=a:1,2=a:2"],
            "error: --peers does not list this node (4)",
        ),
    ]
    for args, expected in checks:
        result = run_cli(*args)
        assert result.returncode == 1, (args, result.stderr)
        assert result.stderr.startswith(expected), (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)


def test_help_lists_every_command() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("dev", "produce", "consume", "node", "topic", "cluster"):
        assert command in result.stdout
    topic_help = run_cli("topic", "--help").stdout
    for command in ("create", "list", "describe", "delete"):
        assert command in topic_help
    module = subprocess.run(
        [sys.executable, "-m", "laminar", "cluster", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert module.returncode == 0 and "status" in module.stdout


def test_dev_refuses_ports_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [LAMINAR, "dev", "--base-port", str(port), "--nodes", "1"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1
    # the peer port next to it may be taken too (by another test's process): named as well
    assert result.stderr.startswith(f"error: 127.0.0.1:{port}")
    assert "already in use" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / ".laminar").exists()  # nothing started, nothing written
