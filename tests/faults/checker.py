"""What the clients saw against what the cluster holds after healing: the safety checks.

* lost: an acknowledged value is not in the log;
* moved: an acknowledged value is in the log at another partition/offset than acknowledged;
* duplicate: a value is in the log more than once (idempotent producers: never);
* phantom: a value in the log that no producer ever sent;
* order: offsets within a partition not strictly increasing;
* dirty_read: a consumer was served a record that is not at that offset in the final log;
* divergence: two replicas serve different bytes below the high watermark.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

Placed = tuple[int, int]  # (partition, offset)


@dataclass
class History:
    """Everything the client workers logged."""

    sent: set[str] = field(default_factory=set)
    acked: dict[str, Placed] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    consumed: list[tuple[int, int, str]] = field(default_factory=list)

    @property
    def indeterminate(self) -> set[str]:
        return self.sent - self.acked.keys()


def read_history(producer_logs: list[Path], consumer_logs: list[Path]) -> History:
    history = History()
    for path in producer_logs:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ")
            if parts[0] == "S" and len(parts) == 2:
                history.sent.add(parts[1])
            elif parts[0] == "A" and len(parts) == 4:
                history.acked[parts[1]] = (int(parts[2]), int(parts[3]))
            elif parts[0] == "E" and len(parts) >= 2:
                history.failed.add(parts[1])
            # a torn last line (worker killed mid-write) is skipped: its value stays "sent"
    for path in consumer_logs:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ")
            if parts[0] == "R" and len(parts) == 4:
                history.consumed.append((int(parts[1]), int(parts[2]), parts[3]))
    return history


@dataclass
class Verdict:
    acked: int
    indeterminate: int
    records_in_log: int
    indeterminate_written: int
    anomalies: list[str]  # the first ``limit``, then a line counting all of them by kind
    anomaly_count: int


def check(
    history: History,
    logs: dict[int, list[tuple[int, str]]],
    divergences: list[str],
    limit: int = 20,
) -> Verdict:
    """``logs``: partition -> [(offset, value)] as read back from the healed cluster."""
    anomalies: list[str] = []
    where: dict[str, list[Placed]] = {}
    for partition, records in sorted(logs.items()):
        previous = -1
        for offset, value in records:
            if offset <= previous:
                anomalies.append(f"order: partition {partition} offset {offset} after {previous}")
            previous = offset
            where.setdefault(value, []).append((partition, offset))
    counts = Counter({value: len(places) for value, places in where.items()})
    for value, count in counts.items():
        if count > 1:
            anomalies.append(f"duplicate: {value!r} at {where[value]}")
        if value not in history.sent:
            anomalies.append(f"phantom: {value!r} at {where[value]} was never sent")
    for value, placed in sorted(history.acked.items(), key=lambda item: item[1]):
        places = where.get(value)
        if not places:
            anomalies.append(f"lost: {value!r} acknowledged at {placed}")
        elif placed not in places:
            anomalies.append(f"moved: {value!r} acknowledged at {placed}, found at {places}")
    final = {(p, offset): value for p, records in logs.items() for offset, value in records}
    for partition, offset, value in history.consumed:
        if final.get((partition, offset)) != value:
            anomalies.append(
                f"dirty_read: consumer saw {value!r} at {(partition, offset)}, "
                f"final log has {final.get((partition, offset))!r}"
            )
    anomalies.extend(divergences)
    kinds = Counter(a.split(":", 1)[0] for a in anomalies)
    shown = anomalies[:limit]
    if len(anomalies) > limit:
        shown.append(f"... {len(anomalies)} anomalies in all: {dict(kinds)}")
    return Verdict(
        acked=len(history.acked),
        indeterminate=len(history.indeterminate),
        records_in_log=len(final),
        indeterminate_written=sum(1 for v in history.indeterminate if v in where),
        anomalies=shown,
        anomaly_count=len(anomalies),
    )
