"""Automatic splits and merges, sans-I/O: load samples in, ``begin_split``/``begin_merge`` out.

A range topic may carry a policy (``--auto-split-above``, ``--auto-merge-below``, both in
bytes/s, ``--auto-window``, ``--max-partitions``). The metadata leader samples how many bytes
each active partition's log holds, about once a second (``service.py`` asks every node for the
partitions it leads), and hands the samples to ``AutoScaler``. A partition whose write rate over
the last window is above the split threshold is split (the hottest first) while the topic has
fewer active partitions than its maximum; two adjacent sibling partitions (children of one
split) whose rates over the window are both below the merge threshold are merged. A partition
younger than a window has no rate yet, and after each operation the topic waits a window, so
decisions always rest on a full window of the new layout (no flapping), one operation at a time.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_PARTITIONS = 64


@dataclass(frozen=True, slots=True)
class Policy:
    split_above: int
    """Bytes/s; 0: never split automatically."""
    merge_below: int
    """Bytes/s; 0: never merge automatically."""
    window_ms: int
    max_partitions: int
    """Active partitions at most (splits stop there)."""


def policy_of(settings: Any) -> Policy | None:
    """A topic's automatic policy, or None (not a range topic, or neither threshold set)."""
    if settings.partitioning != "range" or not (
        settings.auto_split_above or settings.auto_merge_below
    ):
        return None
    return Policy(
        settings.auto_split_above,
        settings.auto_merge_below,
        settings.auto_window_ms,
        settings.max_partitions or DEFAULT_MAX_PARTITIONS,
    )


@dataclass(frozen=True, slots=True)
class PartitionView:
    """What a decision needs of one partition."""

    partition: int
    state: str
    range_start: int
    parents: tuple[int, ...]


class AutoScaler:
    """Keeps each partition's recent (time, bytes) samples and decides operations."""

    def __init__(self) -> None:
        self._samples: dict[tuple[str, int], deque[tuple[int, int]]] = {}
        self._quiet_until: dict[str, int] = {}

    def observe(self, now_ms: int, topic: str, partition: int, log_bytes: int) -> None:
        samples = self._samples.setdefault((topic, partition), deque())
        samples.append((now_ms, log_bytes))

    def rate(self, topic: str, partition: int, now_ms: int, window_ms: int) -> float | None:
        """Bytes/s written over the last ``window_ms`` (None: not sampled for a window yet).
        A log that shrank (retention) counts as no writes."""
        samples = self._samples.get((topic, partition))
        if not samples:
            return None
        horizon = now_ms - window_ms
        base = None
        for sample in samples:
            if sample[0] <= horizon:
                base = sample
            else:
                break
        latest = samples[-1]
        if base is None or latest[0] <= base[0]:
            return None
        return max(0, latest[1] - base[1]) * 1000 / (latest[0] - base[0])

    def decide(
        self,
        now_ms: int,
        topics: Iterable[tuple[str, Policy, list[PartitionView], bool]],
    ) -> list[dict[str, Any]]:
        """Commands to begin, for ``(topic, policy, partitions, operation open)`` tuples."""
        commands: list[dict[str, Any]] = []
        for name, policy, partitions, busy in topics:
            active = sorted(
                (p for p in partitions if p.state == "active"), key=lambda p: p.range_start
            )
            self._prune(name, {p.partition for p in active}, now_ms - 2 * policy.window_ms)
            if busy or now_ms < self._quiet_until.get(name, 0):
                continue
            rates = {
                p.partition: self.rate(name, p.partition, now_ms, policy.window_ms) for p in active
            }
            command = self._split(name, policy, rates, len(active)) or self._merge(
                name, policy, rates, active
            )
            if command is not None:
                commands.append(command)
                self._quiet_until[name] = now_ms + policy.window_ms
        return commands

    @staticmethod
    def _split(
        name: str, policy: Policy, rates: dict[int, float | None], active: int
    ) -> dict[str, Any] | None:
        if not policy.split_above or active >= policy.max_partitions:
            return None
        hot = [
            (rate, p) for p, rate in rates.items() if rate is not None and rate > policy.split_above
        ]
        if not hot:
            return None
        _rate, partition = max(hot)
        return {"op": "begin_split", "name": name, "partition": partition, "at": None}

    @staticmethod
    def _merge(
        name: str, policy: Policy, rates: dict[int, float | None], active: list[PartitionView]
    ) -> dict[str, Any] | None:
        if not policy.merge_below:
            return None
        for low, high in itertools.pairwise(active):
            siblings = low.parents and low.parents == high.parents and len(low.parents) == 1
            cold = all(
                (r := rates[p.partition]) is not None and r < policy.merge_below
                for p in (low, high)
            )
            if siblings and cold:
                return {
                    "op": "begin_merge",
                    "name": name,
                    "partitions": [low.partition, high.partition],
                }
        return None

    def _prune(self, topic: str, active: set[int], older_than: int) -> None:
        for key in [k for k in self._samples if k[0] == topic and k[1] not in active]:
            del self._samples[key]
        for partition in active:
            samples = self._samples.get((topic, partition))
            # keep one sample at or before the horizon: the base of the next rate
            while samples and len(samples) > 1 and samples[1][0] <= older_than:
                samples.popleft()

    def forget(self, topics: set[str]) -> None:
        """Drop the state of topics that are gone."""
        for key in [k for k in self._samples if k[0] not in topics]:
            del self._samples[key]
        for name in [n for n in self._quiet_until if n not in topics]:
            del self._quiet_until[name]
