"""The PySpark Python Data Source ``laminar``: batch and streaming reads of laminar topics.

The driver plans offset ranges per partition (``partitions``); executors read them
(``read``) from the partition's replicas. Offsets are JSON {topic: {partition: next_offset}}
with sorted string keys, as Spark compares offsets as text.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from laminar.client.log import get_logger
from laminar.errors import LaminarError
from spark_source.cluster_io import (
    Snapshot,
    commit_group_offsets,
    read_range,
    resolve_spec,
    snapshot,
)
from spark_source.options import SourceOptions, parse_options
from spark_source.planning import (
    LaminarInputPartition,
    Offsets,
    check_start,
    from_json,
    hold_children,
    rate_limit,
    split_ranges,
    to_json,
)
from spark_source.schema import arrow_schema, spark_schema

log = get_logger(__name__)


class LaminarDataSource(DataSource):
    """``spark.read.format("laminar")`` / ``spark.readStream.format("laminar")``."""

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(options)  # type: ignore[arg-type]
        self.parsed = parse_options(options)

    @classmethod
    def name(cls) -> str:
        return "laminar"

    def schema(self) -> StructType:
        return spark_schema(self.parsed.include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        return LaminarBatchReader(self.parsed, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LaminarStreamReader(self.parsed, schema)


def _input_partitions(
    ranges: dict[tuple[str, int], tuple[int, int]], snap: Snapshot, options: SourceOptions
) -> list[LaminarInputPartition]:
    pieces = split_ranges(ranges, options.max_records_per_partition, options.min_partitions)
    return [
        LaminarInputPartition(i, tp[0], tp[1], lo, hi, snap.replicas.get(tp, ()))
        for i, (tp, lo, hi) in enumerate(pieces)
    ]


def _read(
    partition: InputPartition, options: SourceOptions, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, LaminarInputPartition):
        raise TypeError(f"laminar source cannot read {partition!r}")
    return read_range(partition, options, schema)


class LaminarBatchReader(DataSourceReader):
    """Batch query: startingOffsets (default earliest) to endingOffsets (default latest)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.arrow = arrow_schema(schema)

    def partitions(self) -> list[InputPartition]:
        options = self.options
        starting = options.starting if options.starting is not None else "earliest"
        if starting == "latest":
            raise ValueError(
                "laminar source: startingOffsets=latest is not allowed in a batch query"
            )
        snap, at_time = snapshot(options, options.starting_timestamp)
        if options.starting_timestamp is not None:
            starts = {tp: at_time[tp] if at_time[tp] >= 0 else snap.latest[tp] for tp in at_time}
        else:
            starts = resolve_spec("startingOffsets", starting, snap, "earliest")
        ends = resolve_spec("endingOffsets", options.ending, snap, "latest")
        ranges: dict[tuple[str, int], tuple[int, int]] = {}
        for tp in sorted(snap.replicas):
            start, end = starts[tp], ends[tp]
            if end > snap.latest[tp]:
                raise ValueError(
                    f"laminar source: endingOffsets {tp[0]}/{tp[1]}={end} is past the "
                    f"partition's committed end {snap.latest[tp]}"
                )
            if start > end:
                raise ValueError(
                    f"laminar source: {tp[0]}/{tp[1]} starts at {start} after its end {end}"
                )
            start = min(end, check_start(tp, start, snap.earliest[tp], options.fail_on_data_loss))
            ranges[tp] = (start, end)
        parts = _input_partitions(ranges, snap, options)
        if not parts:  # Spark needs at least one partition; this one reads nothing
            return [LaminarInputPartition(0, "", 0, 0, 0, ())]
        return list(parts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.options, self.arrow)


class LaminarStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch streaming with read limits, Trigger.AvailableNow and data-loss checks.

    The instance lives in one long-running driver-side Python process for the whole query,
    so it may remember the AvailableNow target and the last trigger time; it holds no
    connections between calls.
    """

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.arrow = arrow_schema(schema)
        self._target: Offsets | None = None
        self._latest: Offsets | None = None
        self._last_batch_ms = time.monotonic() * 1000
        self._committed: dict[str, dict[str, int]] | None = None

    def initialOffset(self) -> dict[str, dict[str, int]]:
        options = self.options
        snap, at_time = snapshot(options, options.starting_timestamp)
        if options.starting_timestamp is not None:
            starts = {tp: at_time[tp] if at_time[tp] >= 0 else snap.latest[tp] for tp in at_time}
        else:
            spec = options.starting if options.starting is not None else "latest"
            starts = resolve_spec("startingOffsets", spec, snap, "latest")
        return to_json(starts)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        snap, _ = snapshot(self.options)
        self._target = dict(snap.latest)
        log.debug("available-now target", target=to_json(self._target))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict[str, dict[str, int]]:
        begin = from_json(start)
        snap, _ = snapshot(self.options)
        # New partitions (not in start) are read from their earliest offset.
        base = {tp: begin.get(tp, snap.earliest[tp]) for tp in snap.latest}
        if not self.options.fail_on_data_loss:
            base = {tp: max(offset, snap.earliest[tp]) for tp, offset in base.items()}
        latest = {tp: max(base[tp], snap.latest[tp]) for tp in snap.latest}
        if self._target is not None:
            latest = {
                tp: max(base[tp], min(offset, self._target[tp]))
                for tp, offset in latest.items()
                if tp in self._target
            }
        if snap.lineage:
            latest = hold_children(base, latest, snap.lineage)
        self._latest = dict(snap.latest)
        available = sum(latest[tp] - base[tp] for tp in latest)
        if self._too_few(limit, available):
            return start
        end = rate_limit(base, latest, limit.max_rows) if isinstance(limit, ReadMaxRows) else latest
        # Partitions the query already tracks but no longer sees keep their offset.
        merged = {**{tp: offset for tp, offset in begin.items() if tp not in end}, **end}
        if merged != begin:
            self._last_batch_ms = time.monotonic() * 1000
        return to_json(merged)

    def _too_few(self, limit: ReadLimit, available: int) -> bool:
        """minOffsetsPerTrigger: wait for more data, but no longer than maxTriggerDelay."""
        if isinstance(limit, ReadAllAvailable) or self._target is not None:
            return False
        minimum = limit.min_rows if isinstance(limit, ReadMinRows) else None
        if minimum is None:
            minimum = self.options.min_offsets_per_trigger
        if minimum is None or available >= minimum:
            return False
        waited = time.monotonic() * 1000 - self._last_batch_ms
        return waited < self.options.max_trigger_delay_ms

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return None if self._latest is None else to_json(self._latest)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin, finish = from_json(start), from_json(end)
        if begin == finish:
            return []
        snap, _ = snapshot(self.options)
        ranges: dict[tuple[str, int], tuple[int, int]] = {}
        for tp in sorted(finish):
            stop = finish[tp]
            first = begin.get(tp)
            if tp not in snap.earliest:
                if first is not None and first < stop:
                    check_start(tp, first, stop, self.options.fail_on_data_loss)
                continue
            if first is None:  # a partition that appeared since the last batch
                first = min(stop, snap.earliest[tp])
            log_start = min(stop, snap.earliest[tp])
            first = check_start(tp, first, log_start, self.options.fail_on_data_loss)
            if first < stop:
                ranges[tp] = (first, stop)
        return list(_input_partitions(ranges, snap, self.options))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.options, self.arrow)

    def commit(self, end: dict) -> None:
        # Spark's checkpoint is the record of progress; with groupId the end offsets are also
        # stored as the group's committed offsets, for lag monitoring. Repeating a commit
        # changes nothing, and a failed one only leaves the group's view behind: it is logged,
        # never raised (the query must not fail over a monitoring write).
        self._committed = end
        if self.options.group_id is None:
            return
        try:
            commit_group_offsets(self.options, from_json(end))
        except (LaminarError, ConnectionError, OSError) as exc:
            log.warning(
                "could not store the micro-batch's offsets as group offsets",
                group=self.options.group_id,
                error=str(exc),
            )

    def stop(self) -> None:
        self._target = None
