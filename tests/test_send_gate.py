"""The node's bound on entries queued toward a peer (``laminar.node.send_gate``)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from laminar.node import send_gate
from laminar.node.send_gate import BACKLOG_BYTES, RESUME_BYTES, PeerBacklog


def test_the_gate_holds_groups_past_the_backlog_and_resumes_them_once_drained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unsent = {2: 0, 3: 0}
    backlog = PeerBacklog(lambda peer: unsent[peer])
    one, two = object(), object()  # (stand-ins for replicas: the backlog only keeps them)
    gate_one, gate_two = backlog.gate(cast(Any, one)), backlog.gate(cast(Any, two))
    assert gate_one.open(2)
    gate_one.sent(2, BACKLOG_BYTES - 1)  # this drain's outbox counts before it is handed over
    assert gate_two.open(2)
    gate_two.sent(2, 1)
    assert not gate_one.open(2) and not gate_two.open(2)
    assert gate_one.open(3)  # another peer is not held back
    backlog.handed_over()
    unsent[2] = BACKLOG_BYTES  # now in the connection, not yet taken by the kernel
    assert not gate_one.open(2)
    assert backlog.resumable() == [] and backlog.streaming(2) and not backlog.streaming(3)
    unsent[2] = RESUME_BYTES - 1
    assert backlog.resumable() == [(2, [one, two])]  # in the order they were held
    assert backlog.resumable() == []
    assert backlog.streaming(2)  # caught up on lately: no leadership handed to it yet
    now = send_gate.time.monotonic()
    monkeypatch.setattr(send_gate.time, "monotonic", lambda: now + send_gate.STREAMING_S)
    assert not backlog.streaming(2)
