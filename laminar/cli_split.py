"""How the CLI shows key-range topics: ranges, the lineage tree, operations in progress
(``laminar topic describe``, ``laminar topic split|merge``, ``laminar cluster status``)."""

from __future__ import annotations

from laminar.client.descriptions import TopicDescription, TopicOperation
from laminar.splits.ranges import HASH_SPACE


def outcome(description: TopicDescription, done: str) -> str:
    if description.operation is not None:
        return f"{describe_operation(description.operation)}: still in progress"
    newest = description.partitions[-1]
    parents = [p for p in description.partitions if p.parents == newest.parents]
    return f"{done} into partitions {', '.join(str(p.partition) for p in parents)}"


def describe_operation(operation: TopicOperation) -> str:
    parents = ", ".join(map(str, operation.parents))
    children = ", ".join(map(str, operation.children))
    return f"{operation.topic}: {operation.kind} of {parents} into {children}"


def range_rows(description: TopicDescription) -> list[list[str]]:
    """One row per partition: its range (as fractions of the space too), state and seal."""
    rows = [["PARTITION", "STATE", "RANGE", "SHARE", "SEAL END"]]
    for p in description.partitions:
        share = (p.range_end - p.range_start) / HASH_SPACE
        rows.append(
            [
                str(p.partition),
                p.state,
                f"[{p.range_start:#010x}, {p.range_end:#011x})",
                f"{share:.1%}",
                str(p.seal_end) if p.state == "sealed" else "",
            ]
        )
    return rows


def lineage_tree(description: TopicDescription) -> list[str]:
    """The lineage as a tree: roots are the partitions the topic was created with; a merged
    child appears under each of its parents."""
    children: dict[int, list[int]] = {}
    for p in description.partitions:
        for parent in p.parents:
            children.setdefault(parent, []).append(p.partition)
    states = {p.partition: p.state for p in description.partitions}
    lines: list[str] = []

    def walk(partition: int, prefix: str, last: bool, root: bool) -> None:
        branch = "" if root else ("└─ " if last else "├─ ")
        lines.append(f"{prefix}{branch}{partition} ({states[partition]})")
        below = children.get(partition, [])
        deeper = prefix if root else prefix + ("   " if last else "│  ")
        for i, child in enumerate(below):
            walk(child, deeper, i == len(below) - 1, False)

    for p in description.partitions:
        if not p.parents:
            walk(p.partition, "  ", True, True)
    return lines


def describe_lines(description: TopicDescription) -> list[str]:
    """What ``topic describe`` adds for a range topic."""
    from laminar.cli import render_table  # the CLI imports this module

    lines = []
    if description.auto_split_above or description.auto_merge_below:
        lines += [
            f"  automatic:          split above {description.auto_split_above} B/s, merge below "
            f"{description.auto_merge_below} B/s over {description.auto_window_ms / 1000:g} s, "
            f"at most {description.max_partitions or 64} active partitions"
        ]
    lines += ["", "key ranges (crc32c of the key)", render_table(range_rows(description))]
    lines += ["", "lineage", *lineage_tree(description)]
    if description.operation is not None:
        lines += ["", f"in progress: {describe_operation(description.operation)}"]
    return lines


def status_lines(operations: tuple[TopicOperation, ...]) -> list[str]:
    """What ``cluster status`` adds while splits or merges are under way."""
    if not operations:
        return []
    from laminar.cli import render_table  # the CLI imports this module

    rows = [["TOPIC", "KIND", "PARENTS", "CHILDREN"]]
    rows += [
        [o.topic, o.kind, ",".join(map(str, o.parents)), ",".join(map(str, o.children))]
        for o in operations
    ]
    return ["", f"splits and merges in progress ({len(operations)})", render_table(rows)]
