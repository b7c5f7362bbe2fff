"""The client library leaves output to the application: nothing on stdout or stderr unless the
application configures ``logging``, then records under ``laminar`` with the event's fields."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import logging, sys
from laminar.client import log as client_log
from spark_source import planning  # the Spark source logs the same way
if sys.argv[1] == "configured":
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
logger = client_log.get_logger("laminar.client.consumer")
logger.debug("not shown", error="x")
logger.warning("batch failed", error="node is not the leader", attempt=2)
client_log.get_logger("spark_source.source").warning("skipping", topic="t")
print("program output")
"""


def run(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_nothing_is_printed_unless_the_application_configures_logging() -> None:
    quiet = run("quiet")
    assert quiet.stdout == "program output\n"
    assert quiet.stderr == ""


def test_a_configured_application_gets_records_under_laminar_with_their_fields() -> None:
    loud = run("configured")
    assert loud.stdout == "program output\n"
    assert loud.stderr.splitlines() == [
        "laminar.client.consumer WARNING batch failed error='node is not the leader' attempt=2",
        "laminar.spark_source.source WARNING skipping topic='t'",
    ]
