"""Reading group members' event logs (tests/group_worker.py) and checking them.

Each check returns a list of human-readable violations (empty: fine), naming the partition,
the members and the times involved, so a failing test says what went wrong where.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Event = dict[str, Any]


def read_events(path: Path) -> list[Event]:
    """Every complete line of a worker's log (a SIGKILL may tear the last one)."""
    events: list[Event] = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        return events
    for line in text.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def owned_now(events: Iterable[Event]) -> set[int]:
    """The partitions a member owns after ``events`` (by its own listener calls)."""
    owned: set[int] = set()
    for event in events:
        if event["ev"] == "assigned":
            owned |= set(event["tps"])
        elif event["ev"] in ("revoked", "lost"):
            owned -= set(event["tps"])
    return owned


def processed_times(events: Iterable[Event], partition: int, after: float) -> list[float]:
    """Times of the member's record batches holding ``partition``, after ``after``."""
    return [
        e["t"]
        for e in events
        if e["ev"] == "records" and e["t"] > after and any(r[0] == partition for r in e["recs"])
    ]


def ok_commits(events: Iterable[Event], after: float = 0.0) -> dict[int, set[int]]:
    """Offsets each partition was successfully committed at by this member, after ``after``."""
    out: dict[int, set[int]] = defaultdict(set)
    for e in events:
        if e["ev"] == "commit" and e["ok"] and e["t"] > after:
            for p, offset in e["offsets"].items():
                out[int(p)].add(offset)
    return out


@dataclass
class Interval:
    """One member's ownership of one partition, from its assigned event to its end."""

    member: str
    partition: int
    start: float
    end: float = float("inf")
    how: str = "open"
    """revoked (handshake), lost, killed, or open (log ended while owning)."""
    first_offset: int | None = None
    last_commit: int | None = None
    """Highest offset this member committed for the partition during the interval."""
    failed_commits: int = 0

    def __str__(self) -> str:
        return (
            f"{self.member} p{self.partition} [{self.start:.3f}, {self.end:.3f}] {self.how} "
            f"(first offset {self.first_offset}, last commit {self.last_commit})"
        )


@dataclass
class Member:
    """What the checks need to know about one member process (one life)."""

    name: str
    events: list[Event]
    killed_at: float | None = None
    pauses: list[tuple[float, float]] = field(default_factory=list)
    """(stopped, continued) times of SIGSTOP pauses."""


@dataclass
class History:
    intervals: dict[int, list[Interval]]
    """Per partition, every member's ownership intervals."""
    processed: dict[tuple[int, int], list[tuple[float, str, Interval | None, int]]]
    """(partition, offset) -> [(time, member, interval, seq)] in time order."""
    violations: list[str]


def build_history(members: Iterable[Member]) -> History:
    """Ownership intervals and processing occurrences; records processed outside an interval,
    or a partition assigned twice without an end in between, are violations."""
    intervals: dict[int, list[Interval]] = defaultdict(list)
    processed: dict[tuple[int, int], list[tuple[float, str, Interval | None, int]]] = defaultdict(
        list
    )
    violations: list[str] = []
    for member in members:
        open_: dict[int, Interval] = {}
        last_records: dict[int, float] = {}
        for e in member.events:
            kind, t = e["ev"], e["t"]
            if kind == "assigned":
                for p in e["tps"]:
                    if p in open_:
                        violations.append(f"{member.name}: p{p} assigned again at {t:.3f}")
                        continue
                    open_[p] = Interval(member.name, p, t)
                    intervals[p].append(open_[p])
            elif kind in ("revoked", "lost"):
                for p in e["tps"]:
                    interval = open_.pop(p, None)
                    if interval is None:
                        violations.append(f"{member.name}: p{p} {kind} at {t:.3f}, not owned")
                        continue
                    interval.end, interval.how = t, kind
                    if kind == "lost":
                        # Taken away while the process was stopped: it owned (read) nothing
                        # since it was stopped, whatever it noticed afterwards.
                        for stopped, continued in member.pauses:
                            if (
                                interval.start < stopped
                                and continued <= t
                                and last_records.get(p, 0.0) <= stopped
                            ):
                                interval.end = stopped
                                break
            elif kind == "records":
                for p, offset, seq in e["recs"]:
                    interval = open_.get(p)
                    if interval is None:
                        violations.append(
                            f"{member.name}: processed p{p}@{offset} at {t:.3f} without owning it"
                        )
                    elif interval.first_offset is None:
                        interval.first_offset = offset
                    processed[(p, offset)].append((t, member.name, interval, seq))
                    last_records[p] = t
            elif kind == "commit":
                for key, offset in e["offsets"].items():
                    interval = open_.get(int(key))
                    if interval is None:
                        continue
                    if e["ok"]:
                        interval.last_commit = max(interval.last_commit or 0, offset)
                    else:
                        interval.failed_commits += 1
        end = member.killed_at
        for interval in open_.values():
            if end is not None:
                interval.end, interval.how = end, "killed"
            else:
                interval.end = member.events[-1]["t"] if member.events else interval.start
    for spans in intervals.values():
        spans.sort(key=lambda i: i.start)
    for seen in processed.values():
        seen.sort(key=lambda o: o[0])
    return History(dict(intervals), dict(processed), violations)


def overlapping_owners(history: History) -> list[str]:
    """Check 1: no two members own a partition at the same time."""
    out = []
    for p, spans in sorted(history.intervals.items()):
        for a, b in itertools.pairwise(spans):
            if a.end > b.start:
                out.append(f"p{p}: {a} overlaps {b} by {a.end - b.start:.3f}s")
    return out


def unprocessed(history: History, acked: Mapping[int, tuple[int, int]]) -> list[str]:
    """Check 5a: every acknowledged record (seq -> (partition, offset)) processed, with its
    value; and every processed record is one that was produced there."""
    out = []
    for seq, (p, offset) in sorted(acked.items()):
        seen = history.processed.get((p, offset))
        if not seen:
            out.append(f"seq {seq} at p{p}@{offset} acknowledged but never processed")
        elif any(s != seq for _, _, _, s in seen):
            out.append(f"p{p}@{offset}: expected seq {seq}, processed {[s for *_, s in seen]}")
    return out


def unjustified_duplicates(history: History) -> tuple[list[str], int]:
    """Check 5b: a record processed more than once was, every time but the last, processed by
    a member that then lost the partition without a handshake (killed, lost, fenced), at or
    after that member's last successful commit of the partition (its first offset of that
    ownership if it committed nothing). Returns (violations, duplicated records)."""
    out = []
    duplicates = 0
    for (p, offset), seen in sorted(history.processed.items()):
        if len(seen) < 2:
            continue
        duplicates += 1
        for t, name, interval, _ in seen[:-1]:
            if interval is None:
                continue  # already reported as processed without owning
            bound = interval.last_commit
            if bound is None:
                bound = interval.first_offset if interval.first_offset is not None else 0
            if interval.how in ("killed", "lost") and offset >= bound:
                continue
            if sum(1 for _, _, i, _ in seen if i is interval) > 1:
                why = "twice within one ownership"
            elif interval.how not in ("killed", "lost"):
                why = (
                    f"ownership ended by {interval.how} ({interval.failed_commits} failed commits)"
                )
            else:
                why = f"below the member's last commit {bound}"
            out.append(
                f"p{p}@{offset} processed {len(seen)} times "
                f"({', '.join(f'{n}@{s:.3f}' for s, n, _, _ in seen)}): first by {name} at "
                f"{t:.3f}, {why}; interval {interval}"
            )
    return out, duplicates


def committed_went_back(samples: list[tuple[float, dict[int, int]]]) -> list[str]:
    """Check 4: per partition, polled committed offsets never decrease."""
    out = []
    last: dict[int, tuple[float, int]] = {}
    for t, offsets in samples:
        for p, offset in offsets.items():
            before = last.get(p)
            if before is not None and offset < before[1]:
                out.append(
                    f"p{p}: committed {before[1]} at {before[0]:.3f}, then {offset} at {t:.3f}"
                )
            if before is None or offset >= before[1]:
                last[p] = (t, offset)
    return out


def never_released(history: History) -> list[str]:
    """Members that stopped cleanly ran their revoke listener: no ownership is left open."""
    return [str(i) for spans in history.intervals.values() for i in spans if i.how == "open"]


def committed_beyond_processed(
    samples: list[tuple[float, dict[int, int]]], history: History
) -> list[str]:
    """A committed offset is never ahead of what some member had processed by then (members
    commit only what they processed, and log it first)."""
    processed = sorted(
        (t, p, offset) for (p, offset), seen in history.processed.items() for t, *_ in seen
    )
    out = []
    done: dict[int, int] = {}
    i = 0
    for t, offsets in samples:
        while i < len(processed) and processed[i][0] <= t:
            _, p, offset = processed[i]
            done[p] = max(done.get(p, -1), offset)
            i += 1
        for p, offset in offsets.items():
            if offset > done.get(p, -1) + 1:
                out.append(f"p{p}: committed {offset} at {t:.3f}, processed up to {done.get(p)}")
    return out


def timeline(members: Iterable[Member], since: float = 0.0, limit: int = 60) -> str:
    """Assignment events of every member since ``since``, for failure messages."""
    rows = []
    for m in members:
        for e in m.events:
            if e["t"] >= since and e["ev"] in ("assigned", "revoked", "lost", "ready", "closed"):
                rows.append((e["t"], f"{e['t']:.3f} {m.name:>8} {e['ev']} {e.get('tps', '')}"))
            if e["ev"] == "commit" and not e["ok"] and e["t"] >= since:
                rows.append((e["t"], f"{e['t']:.3f} {m.name:>8} commit failed {e['error']}"))
        if m.killed_at is not None and m.killed_at >= since:
            rows.append((m.killed_at, f"{m.killed_at:.3f} {m.name:>8} SIGKILL"))
    rows.sort()
    return "\n".join(r for _, r in rows[-limit:])


def commits_without_owning(events: list[dict], owned_before: set[int]) -> list[dict]:
    """Successful commits of partitions the member did not own (by its own log) when it
    started the commit; it owned ``owned_before`` before ``events``."""
    owned = set(owned_before)
    out = []
    timeline = sorted(
        [(e["t"], 1, e) for e in events if e["ev"] in ("assigned", "revoked", "lost")]
        + [(e["t0"], 0, e) for e in events if e["ev"] == "commit" and e["ok"]],
        key=lambda x: (x[0], x[1]),
    )
    for _, _, e in timeline:
        if e["ev"] == "assigned":
            owned |= set(e["tps"])
        elif e["ev"] in ("revoked", "lost"):
            owned -= set(e["tps"])
        elif {int(p) for p in e["offsets"]} - owned:
            out.append(e)
    return out


def records_after(events: list[dict], after: float) -> list[list[int]]:
    """[partition, offset, seq] of every record processed after ``after``, in order."""
    return [r for e in events if e["ev"] == "records" and e["t"] > after for r in e["recs"]]
