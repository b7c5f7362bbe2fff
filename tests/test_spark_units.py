"""Spark source pieces that need neither a Spark session nor a cluster: decoding, options,
offset JSON, read limits, range splitting and data-loss rules."""

from __future__ import annotations

import itertools
import json
import random
import struct
import time

import crc32c
import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from laminar.errors import CorruptBatchError
from laminar.segment import varint
from laminar.segment.batch import build_batch, control_batch, decode_records, stamp
from spark_source import decode as decode_module
from spark_source import source as source_module
from spark_source.cluster_io import Snapshot
from spark_source.decode import decode_chunk
from spark_source.options import OptionError, parse_options
from spark_source.planning import (
    DataLossError,
    Replica,
    check_start,
    from_json,
    rate_limit,
    split_ranges,
    to_json,
)
from spark_source.schema import arrow_schema, spark_schema
from spark_source.source import LaminarStreamReader

PLAIN = arrow_schema(spark_schema(False))
WITH_HEADERS = arrow_schema(spark_schema(True))


def stamped(records: list, base_offset: int) -> bytes:
    batch = bytearray(build_batch(records))
    stamp(batch, base_offset, 1)
    return bytes(batch)


def random_records(rng: random.Random, count: int) -> list:
    """Keys, values and headers of many sizes (1- to 3-byte varints), some null."""
    records = []
    for i in range(count):
        key = None if rng.random() < 0.3 else rng.randbytes(rng.choice([0, 1, 7, 70, 300]))
        value = None if rng.random() < 0.1 else rng.randbytes(rng.choice([0, 5, 100, 9000]))
        headers = [(f"h{j}", None if j == 1 else rng.randbytes(j * 40)) for j in range(i % 3)]
        records.append((key, value, headers, 1_700_000_000_000 + i * rng.choice([1, 90, 20_000])))
    return records


def test_decode_matches_reference_decoder_for_random_batches() -> None:
    rng = random.Random(7)
    buf = b""
    offset = 100
    for size in (1, 5, 64, 200):
        buf += stamped(random_records(rng, size), offset)
        offset += size
    chunk = decode_chunk(buf, "t", 3, 100, offset, WITH_HEADERS)
    assert chunk.next_offset == offset
    from_view = decode_chunk(memoryview(buf), "t", 3, 100, offset, WITH_HEADERS)  # as fetched
    assert from_view.batch is not None and from_view.batch.equals(chunk.batch)
    assert chunk.batch is not None
    assert chunk.batch.schema.equals(WITH_HEADERS)
    rows = chunk.batch.to_pylist()
    expected = []
    position = 0
    while position < len(buf):
        length = struct.unpack_from("<i", buf, position + 16)[0]
        expected += decode_records(buf[position : position + length])
        position += length
    assert len(rows) == len(expected) == 270
    for row, record in zip(rows, expected, strict=True):
        assert row["offset"] == record.offset
        assert row["key"] == record.key
        assert row["value"] == record.value
        assert row["topic"] == "t" and row["partition"] == 3 and row["timestampType"] == 0
        assert round(row["timestamp"].timestamp() * 1000) == record.timestamp
        assert [(h["key"], h["value"]) for h in row["headers"]] == list(record.headers)


def mixed_records(rng: random.Random, count: int) -> list:
    """Records as an application sends them: keys of 8-36 bytes (some null), 0-3 headers
    (a null header value now and then), values of many sizes (a few null or 9,000 bytes)."""
    records = []
    for i in range(count):
        key = None if rng.random() < 0.1 else rng.randbytes(rng.randrange(8, 37))
        value = rng.randbytes(rng.choice([0, 20, 90, 200, 700, 2048, 9000, rng.randrange(300)]))
        if rng.random() < 0.02:
            value = None
        names = rng.sample(["trace-id", "content-type", "source", "ünïcode"], rng.randrange(4))
        headers = [
            (n, None if rng.random() < 0.05 else rng.randbytes(rng.randrange(33))) for n in names
        ]
        records.append((key, value, headers, 1_700_000_000_000 + i * rng.choice([0, 1, 90])))
    return records


class Spy:
    """Calls the real ``_decode_scattered`` and notes whether it decoded (True) or left the
    records to the parser (False)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.decoded: list[bool] = []
        real = decode_module._decode_scattered

        def spy(*args: object) -> object:
            result = real(*args)  # type: ignore[arg-type]
            self.decoded.append(result is not None)
            return result

        monkeypatch.setattr(decode_module, "_decode_scattered", spy)


def test_decode_of_a_large_mixed_batch_is_vectorised_and_matches_reference_decoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spy = Spy(monkeypatch)
    rng = random.Random(11)
    buf = stamped(mixed_records(rng, 2_000), 500) + stamped(mixed_records(rng, 700), 2_500)
    expected = reference_rows(buf, 600, 3_100)
    fetched = bytearray(buf)  # as a fetch frame, which is reused once decoded
    chunk = decode_chunk(memoryview(fetched), "t", 0, 600, 3_100, WITH_HEADERS)
    assert spy.decoded == [True]  # both batches in one vectorised group
    fetched[:] = bytes(len(fetched))  # the decoded columns hold copies, not views of the frame
    assert chunk.batch is not None and chunk.batch.schema.equals(WITH_HEADERS)
    rows = [
        (r["offset"], r["key"], r["value"], round(r["timestamp"].timestamp() * 1000), r["headers"])
        for r in chunk.batch.to_pylist()
    ]
    assert rows == [
        (o, k, v, t, [{"key": hk, "value": hv} for hk, hv in h]) for o, k, v, t, h in expected
    ]
    plain = decode_chunk(buf, "t", 0, 600, 3_100, PLAIN)
    assert plain.batch is not None and spy.decoded == [True, True]
    assert plain.batch.equals(chunk.batch.drop_columns(["headers"]))


def test_decode_of_runs_parsed_and_vectorised_batches_together_matches_reference() -> None:
    rng = random.Random(5)
    parts = [
        mixed_records(rng, 150),  # vectorised
        [(None, b"v" * 100, [], 1_000 + i) for i in range(100)],  # runs
        mixed_records(rng, 3),  # parsed: too few
        [(None, b"w" * 100, [], 1_000 + i) for i in range(50)],
        mixed_records(rng, 70),  # these two vectorised together
        mixed_records(rng, 60),
    ]
    buf = b""
    offset = 0
    for records in parts:
        buf += stamped(records, offset)
        offset += len(records)
    zipped = bytearray(build_batch(mixed_records(rng, 130), compression=1))  # gzip
    stamp(zipped, offset, 1)
    buf += bytes(zipped) + stamped(mixed_records(rng, 10), offset + 130)  # then 10 parsed
    offset += 140
    for start, end in ((0, offset), (150, offset - 20), (260, 330)):
        assert decoded_rows(buf, start, end) == reference_rows(buf, start, end)
        chunk = decode_chunk(buf, "t", 0, start, end, PLAIN)
        assert chunk.batch is not None
        assert [(r["offset"], r["key"], r["value"]) for r in chunk.batch.to_pylist()] == [
            row[:3] for row in reference_rows(buf, start, end)
        ]


def resealed(batch: bytearray) -> bytes:
    """The batch with its crc32c made right again: only its record structure is wrong, as a
    buggy producer would send it."""
    struct.pack_into("<I", batch, 20, crc32c.crc32c(bytes(batch[24:])))
    return bytes(batch)


def record_starts(batch: bytes) -> list[int]:
    """Where each record of an uncompressed batch starts (at its length varint)."""
    starts = []
    position = 68
    while position < len(batch):
        starts.append(position)
        length, body = varint.decode(batch, position, len(batch))
        position = body + length
    return starts


def assert_same_error(buf: bytes) -> None:
    """decode_chunk fails on ``buf`` exactly as the log's own decoder does."""
    with pytest.raises(CorruptBatchError) as reference:
        decode_records(buf)
    for schema in (WITH_HEADERS, PLAIN):
        with pytest.raises(CorruptBatchError) as decoded:
            decode_chunk(buf, "t", 0, 0, 10_000, schema)
        assert str(decoded.value) == str(reference.value)


def test_a_mixed_record_that_lies_about_its_length_gets_the_parsers_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spy = Spy(monkeypatch)
    records = mixed_records(random.Random(3), 300)
    records[120] = (b"key", b"v" * 100, [("trace-id", b"abc")], 1_700_000_000_000)
    batch = bytearray(stamped(records, 0))
    record = record_starts(bytes(batch))[120]
    # length, attributes, timestamp and offset deltas (0, 120), key, value, one header
    assert batch[record : record + 2] == varint.encode(
        1 + 1 + 2 + 1 + 3 + 2 + 100 + 1 + 1 + 8 + 1 + 3
    )
    # its length says one byte more: the walk no longer ends at the batch's end
    longer = bytearray(batch)
    longer[record] += 2
    assert_same_error(resealed(longer))
    # its length is the largest 10-byte varint (the walk then passes int64)
    huge = bytearray(batch)
    huge[record : record + 10] = b"\xfe" + b"\xff" * 8 + b"\x01"  # 2**63 - 1
    assert varint.decode(huge, record, len(huge))[0] == 2**63 - 1
    assert_same_error(resealed(huge))
    # its value's length says one byte less: the records still add up, the fields do not
    shorter = bytearray(batch)
    value_length = record + 2 + 1 + 1 + 2 + 1 + 3
    assert shorter[value_length : value_length + 2] == varint.encode(100)
    shorter[value_length] -= 2
    assert_same_error(resealed(shorter))
    # its header count says 2: the second header runs past the record
    count = value_length + 2 + 100
    assert batch[count] == varint.encode(1)[0]
    more = bytearray(batch)
    more[count] = varint.encode(2)[0]
    assert_same_error(resealed(more))
    assert spy.decoded == [False] * 4  # the vectorised path found each defect, and left it


def test_damaged_mixed_batches_decode_or_fail_exactly_as_the_parser_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Bytes of the records changed at random (crc made right again): whatever the parser
    # makes of each, rows or an error, the decoder makes the same.
    spy = Spy(monkeypatch)
    rng = random.Random(21)
    whole = stamped(mixed_records(rng, 120), 0)
    starts = record_starts(whole)
    failures = 0
    for _ in range(400):
        batch = bytearray(whole)
        for _ in range(rng.choice([1, 1, 2, 4])):
            # mostly the first bytes of a record: its length, deltas, key and value lengths
            at = rng.choice(starts) + rng.randrange(12) if rng.random() < 0.8 else -1
            at = at if 68 <= at < len(batch) else rng.randrange(68, len(batch))
            batch[at] = rng.choice([0, 1, 2, 0x7F, 0x80, 0xFF, batch[at] ^ 1, rng.randrange(256)])
        damaged = resealed(batch)
        try:  # all rows: a damaged offset delta may put a record anywhere
            expected = reference_rows(damaged, -(2**62), 2**62)
        except CorruptBatchError:
            assert_same_error(damaged)
            failures += 1
            continue
        assert decoded_rows(damaged, -(2**62), 2**62) == expected
    assert 50 < failures < 390  # both outcomes were exercised, on both paths
    assert spy.decoded.count(True) > 50 and spy.decoded.count(False) > 50


def test_many_scattered_batches_are_walked_together_and_match_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fetch of many scattered batches finds their records' starts one record of every batch
    # per numpy step; a batch holding a record of 8 KiB or more (a 3-byte length) is walked
    # alone, and one whose lengths do not add up is left to the parser, which names it.
    spy = Spy(monkeypatch)
    together: list[int] = []
    real_walk = decode_module._walk_together

    def walk_spy(data: object, firsts: list[int], counts: list[int]) -> object:
        together.append(len(firsts))
        return real_walk(data, firsts, counts)  # type: ignore[arg-type]

    monkeypatch.setattr(decode_module, "_walk_together", walk_spy)
    rng = random.Random(17)
    batches = []
    offset = 0
    for i in range(48):
        records = mixed_records(rng, rng.randrange(10, 40))
        if i % 8:  # 9,000-byte values in every eighth batch only
            records = [(k, v and v[:2048], h, t) for k, v, h, t in records]
        batches.append(stamped(records, offset))
        offset += len(records)
    buf = b"".join(batches)
    long_records = sum(  # batches with a record of 8 KiB or more (9,000-byte values)
        any(varint.decode(batch, at, len(batch))[0] >= 8192 for at in record_starts(batch))
        for batch in batches
    )
    assert decoded_rows(buf, 0, offset) == reference_rows(buf, 0, offset)
    assert together == [48] and spy.decoded == [True]
    assert long_records == 6

    broken = bytearray(batches[20])
    broken[record_starts(bytes(broken))[5]] += 2  # its length says one byte more
    damaged = resealed(broken)
    with pytest.raises(CorruptBatchError) as reference:
        decode_records(damaged)
    with pytest.raises(CorruptBatchError) as decoded:
        decode_chunk(
            b"".join(batches[:20]) + damaged + b"".join(batches[21:]),
            "t",
            0,
            0,
            offset,
            WITH_HEADERS,
        )
    assert str(decoded.value) == str(reference.value)
    assert spy.decoded[1:] == [True]  # the 20 batches before it, vectorised, then the error


@pytest.mark.parametrize(
    ("counts", "steps"),
    [
        ([700] * 31, 700),  # a producer's fetch: all together
        ([1, *[660] * 30], 660),
        ([5_000, *[40] * 30], 40),  # the long batch alone, the others together
        ([1_000], 0),  # one batch: alone
        ([300, 30, 30], 0),
    ],
)
def test_batches_are_walked_together_for_as_many_steps_as_is_cheapest(
    counts: list[int], steps: int
) -> None:
    assert decode_module._lockstep_steps(counts) == steps


def test_a_long_batch_among_short_ones_is_walked_alone_and_all_match_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spy = Spy(monkeypatch)
    together: list[list[int]] = []
    real_walk = decode_module._walk_together

    def walk_spy(data: object, firsts: list[int], counts: list[int]) -> object:
        together.append(counts)
        return real_walk(data, firsts, counts)  # type: ignore[arg-type]

    monkeypatch.setattr(decode_module, "_walk_together", walk_spy)
    rng = random.Random(23)
    sizes = [25] * 12 + [1_500] + [rng.randrange(5, 30) for _ in range(12)]
    batches = []
    offset = 0
    for size in sizes:
        records = [(k, v and v[:700], h, t) for k, v, h, t in mixed_records(rng, size)]
        batches.append(stamped(records, offset))
        offset += size
    buf = b"".join(batches)
    assert decoded_rows(buf, 0, offset) == reference_rows(buf, 0, offset)
    assert together == [[size for size in sizes if size < 1_500]] and spy.decoded == [True]


@pytest.mark.parametrize("name", [b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"ab\xf4\x90\x80\x80"])
def test_a_header_key_that_is_not_utf8_gets_the_parsers_error(
    name: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # not UTF-8: a stray byte, an overlong "/", a UTF-16 surrogate, a code point past U+10FFFF
    spy = Spy(monkeypatch)
    records = mixed_records(random.Random(9), 150)
    records[70] = (b"key", b"value", [("x" * len(name), b"v")], 1_700_000_000_000)
    batch = bytearray(stamped(records, 0))
    at = batch.index(b"x" * len(name) + b"\x02v")
    batch[at : at + len(name)] = name
    assert_same_error(resealed(batch))
    assert spy.decoded == [False, False]  # the vectorised path's UTF-8 check caught it


def test_decode_of_runs_of_same_size_records_matches_reference_decoder() -> None:
    # Same-size records are located by Arrow kernels; varint widths change at offset delta 64
    # and an odd record sits in the middle, so runs end and the Python walk takes over.
    records = [(None, b"v%05d" % i + b"x" * 94, [], 1_000 + i // 100) for i in range(9000)]
    records[150] = (b"key", b"odd one", [("h", b"x")], 1_001)
    buf = stamped(records, 0) + stamped(records[:40], 9000)
    chunk = decode_chunk(buf, "t", 0, 0, 9040, PLAIN)
    assert chunk.batch is not None and chunk.next_offset == 9040
    from_view = decode_chunk(memoryview(buf), "t", 0, 0, 9040, PLAIN)
    assert from_view.batch is not None and from_view.batch.equals(chunk.batch)
    expected = decode_records(buf[: len(buf) - len(stamped(records[:40], 9000))])
    expected += decode_records(stamped(records[:40], 9000))
    rows = chunk.batch.to_pylist()
    assert [(r["offset"], r["key"], r["value"]) for r in rows] == [
        (e.offset, e.key, e.value) for e in expected
    ]
    assert [round(r["timestamp"].timestamp() * 1000) for r in rows] == [
        e.timestamp for e in expected
    ]


def reference_rows(buf: bytes, start: int, end: int) -> list[tuple]:
    """(offset, key, value, timestamp, headers) of [start, end) by the log's own decoder."""
    rows = []
    position = 0
    while position + 68 <= len(buf):
        length = struct.unpack_from("<i", buf, position + 16)[0]
        if position + length > len(buf):
            break
        for r in decode_records(buf[position : position + length]):
            if start <= r.offset < end:
                rows.append((r.offset, r.key, r.value, r.timestamp, list(r.headers)))
        position += length
    return rows


def decoded_rows(buf: bytes, start: int, end: int) -> list[tuple]:
    chunk = decode_chunk(memoryview(buf), "t", 0, start, end, WITH_HEADERS)
    if chunk.batch is None:
        return []
    assert chunk.batch.schema.equals(WITH_HEADERS)
    return [
        (
            r["offset"],
            r["key"],
            r["value"],
            round(r["timestamp"].timestamp() * 1000),
            [(h["key"], h["value"]) for h in r["headers"]],
        )
        for r in chunk.batch.to_pylist()
    ]


def family(rng: random.Random, count: int) -> list:
    """Records as one producer makes them: mostly one shape, with the widths of the timestamp
    and offset deltas growing as the batch goes on, and now and then an odd one."""
    key = rng.choice([None, b"", b"k" * rng.choice([1, 8, 200])])
    size = rng.choice([0, 1, 60, 100, 20_000]) if count <= 64 else rng.choice([0, 1, 60, 100])
    step = rng.choice([0, 1, 3, 40, 9_000])
    odd_rate = rng.choice([0.0, 0.0, 0.01])
    records = []
    for i in range(count):
        value = None if size == 0 and rng.random() < 0.5 else bytes([i % 251]) * size
        headers = []
        if rng.random() < odd_rate:  # an odd record: another size, or headers
            value = b"odd"
            headers = [("h", b"x")] if rng.random() < 0.5 else []
        records.append((key, value, headers, 1_700_000_000_000 + i * step))
    return records


@pytest.mark.parametrize("seed", range(40))
def test_decode_of_producer_like_batches_matches_reference_decoder(seed: int) -> None:
    rng = random.Random(seed)
    buf = b""
    offset = rng.randrange(0, 10_000)
    first = offset
    for _ in range(rng.randrange(1, 5)):
        count = rng.choice([1, 15, 16, 17, 64, 65, 300, 9_000])
        if rng.random() < 0.1:
            count = min(count, 3)
        buf += stamped(family(rng, count), offset)
        offset += count
    start = rng.randrange(first, offset)
    end = rng.randrange(start + 1, offset + 2)
    assert decoded_rows(buf, start, end) == reference_rows(buf, start, end), f"seed {seed}"


def test_a_record_that_lies_about_its_length_is_rejected_even_inside_a_run() -> None:
    records = [(None, b"v" * 20, [], 5)] * 40
    batch = bytearray(stamped(records, 0))
    # record 30's value length varint says 19 instead of 20 (its bytes stay): re-crc the batch
    # so that only the record structure is wrong, as a buggy producer would send it
    size = (len(batch) - 68) // 40  # length, attributes, two deltas, key, value length, 20, 0
    record = 68 + 30 * size
    assert batch[record + 5] == 40
    batch[record + 5] = 38
    struct.pack_into("<I", batch, 20, crc32c.crc32c(bytes(batch[24:])))
    with pytest.raises(CorruptBatchError):
        decode_records(bytes(batch))
    with pytest.raises(CorruptBatchError):
        decode_chunk(bytes(batch), "t", 0, 0, 40, PLAIN)


def test_decode_keeps_only_the_requested_range_and_skips_control_batches() -> None:
    first = stamped([(None, b"a%d" % i, [], 10 + i) for i in range(10)], 0)
    control = bytearray(control_batch(1, b"noop", 50))
    stamp(control, 10, 1)
    second = stamped([(b"k", b"b%d" % i, [], 60 + i) for i in range(10)], 11)
    buf = first + bytes(control) + second
    chunk = decode_chunk(buf, "t", 0, 5, 15, PLAIN)
    assert chunk.batch is not None
    assert chunk.batch.column("offset").to_pylist() == [5, 6, 7, 8, 9, 11, 12, 13, 14]
    assert chunk.batch.column("value").to_pylist()[-1] == b"b3"
    assert chunk.next_offset == 21  # the whole second batch was walked
    assert chunk.batch.schema.equals(PLAIN)


def test_decode_of_only_a_control_batch_advances_without_rows() -> None:
    control = bytearray(control_batch(1, b"noop", 50))
    stamp(control, 7, 1)
    chunk = decode_chunk(bytes(control), "t", 0, 7, 100, PLAIN)
    assert chunk.batch is None
    assert chunk.next_offset == 8


def test_decode_stops_at_a_partial_trailing_batch() -> None:
    whole = stamped([(None, b"x", [], 1)] * 3, 0)
    partial = stamped([(None, b"y", [], 1)] * 3, 3)[:-5]
    chunk = decode_chunk(whole + partial, "t", 0, 0, 100, PLAIN)
    assert chunk.batch is not None and chunk.batch.num_rows == 3
    assert chunk.next_offset == 3


def test_decode_rejects_a_batch_with_a_bad_crc() -> None:
    buf = bytearray(stamped([(None, b"payload", [], 1)], 0))
    buf[-2] ^= 0xFF
    with pytest.raises(CorruptBatchError, match=r"crc32c mismatch .*, in the batch at offset 0"):
        decode_chunk(bytes(buf), "t", 0, 0, 10, PLAIN)


def test_decoded_timestamps_are_utc_microseconds() -> None:
    chunk = decode_chunk(stamped([(None, b"v", [], 1_234_567)], 0), "t", 0, 0, 1, PLAIN)
    assert chunk.batch is not None
    column = chunk.batch.column("timestamp")
    assert column.type == pa.timestamp("us", tz="UTC")
    assert column.cast(pa.int64()).to_pylist() == [1_234_567_000]


def test_options_follow_kafka_names_and_defaults() -> None:
    options = parse_options(
        {
            "subscribe": "a, b,a",
            "bootstrap": "127.0.0.1:1,127.0.0.1:2",
            "startingOffsets": '{"a": {"0": 5, "1": -2}}',
            "MaxOffsetsPerTrigger": "100",
            "failOnDataLoss": "false",
            "includeHeaders": "true",
        }
    )
    assert options.topics == ("a", "b")
    assert options.bootstrap == ("127.0.0.1:1", "127.0.0.1:2")
    assert options.starting == {"a": {0: 5, 1: -2}}
    assert options.ending == "latest"
    assert options.max_offsets_per_trigger == 100
    assert options.fail_on_data_loss is False
    assert options.include_headers is True
    assigned = parse_options({"assign": '{"t": [2, 0]}'})
    assert assigned.assign == (("t", 0), ("t", 2)) and assigned.topic_names == ("t",)
    assert parse_options({"topic": "t"}).fail_on_data_loss is True


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of"),
        ({"topic": "a", "assign": '{"a": [0]}'}, "exactly one of"),
        ({"topic": "a", "startingOffsets": "{nope"}, "startingOffsets must be earliest"),
        ({"topic": "a", "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger must be >= 1"),
        ({"topic": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss must be true or false"),
        ({"topic": "a", "bootstrap": "nohost"}, "bootstrap"),
        ({"topic": "a", "endingOffsets": "earliest"}, "endingOffsets=earliest"),
        (
            {"topic": "a", "minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"},
            "minOffsetsPerTrigger must not be larger",
        ),
    ],
)
def test_bad_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_options(options)


def test_offset_json_has_sorted_string_keys_and_round_trips() -> None:
    offsets = {("b", 10): 5, ("a", 2): 7, ("b", 2): 1, ("a", 0): 3}
    encoded = to_json(offsets)
    assert json.dumps(encoded) == '{"a": {"0": 3, "2": 7}, "b": {"10": 5, "2": 1}}'
    assert from_json(encoded) == offsets
    assert json.dumps(to_json(dict(reversed(list(offsets.items()))))) == json.dumps(encoded)


def test_rate_limit_is_proportional_to_lag_and_exact() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 50}
    latest = {("t", 0): 900, ("t", 1): 190, ("t", 2): 60}
    end = rate_limit(start, latest, 100)
    read = {tp: end[tp] - start[tp] for tp in start}
    assert sum(read.values()) == 100
    assert read == {("t", 0): 90, ("t", 1): 9, ("t", 2): 1}
    assert rate_limit(start, latest, 10_000) == latest
    # A new partition (absent from start) counts from its latest: no lag, nothing read.
    assert rate_limit({("t", 0): 0}, {("t", 0): 10, ("t", 9): 4}, 5) == {("t", 0): 5, ("t", 9): 4}


def test_rate_limit_never_exceeds_the_cap_and_always_progresses() -> None:
    rng = random.Random(3)
    for _ in range(300):
        parts = rng.randint(1, 6)
        start = {("t", p): rng.randint(0, 50) for p in range(parts)}
        latest = {tp: offset + rng.randint(0, 40) for tp, offset in start.items()}
        cap = rng.randint(1, 60)
        end = rate_limit(start, latest, cap)
        lag = sum(latest[tp] - start[tp] for tp in start)
        taken = sum(end[tp] - start[tp] for tp in start)
        assert taken == min(cap, lag)
        assert all(start[tp] <= end[tp] <= latest[tp] for tp in start)


def test_split_ranges_caps_piece_size_and_reaches_min_partitions() -> None:
    ranges = {("t", 0): (0, 2500), ("t", 1): (10, 10), ("t", 2): (100, 600)}
    pieces = split_ranges(ranges, 1000, None)
    assert [(tp[1], lo, hi) for tp, lo, hi in pieces] == [
        (0, 0, 833),
        (0, 833, 1666),
        (0, 1666, 2500),
        (2, 100, 600),
    ]
    many = split_ranges(ranges, 10_000, 6)
    assert len(many) >= 6
    for tp, (lo, hi) in ranges.items():
        covered = sorted((a, b) for t, a, b in many if t == tp)
        if hi > lo:
            assert covered[0][0] == lo and covered[-1][1] == hi
            assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))


def test_check_start_fails_or_skips_on_deleted_offsets() -> None:
    assert check_start(("t", 1), 40, 30, True) == 40
    assert check_start(("t", 1), 10, 30, False) == 30
    with pytest.raises(DataLossError) as info:
        check_start(("t", 1), 10, 30, True)
    message = str(info.value)
    assert "'t' partition 1" in message and "[10, 30)" in message
    assert "failOnDataLoss=false" in message


# --- driver-side planning of the stream reader, with the cluster snapshot stubbed out -------


class FakeCluster:
    """Stands in for spark_source.source.snapshot: offsets the test sets, replicas fixed."""

    def __init__(self) -> None:
        self.earliest: dict[tuple[str, int], int] = {}
        self.latest: dict[tuple[str, int], int] = {}

    def snapshot(self, options, timestamp=None):
        replicas = {
            tp: (Replica(1, "127.0.0.1:1"), Replica(2, "127.0.0.1:2")) for tp in self.latest
        }
        return Snapshot(replicas, dict(self.earliest), dict(self.latest)), {}


@pytest.fixture
def fake_cluster(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    fake = FakeCluster()
    monkeypatch.setattr(source_module, "snapshot", fake.snapshot)
    return fake


def stream_reader(**options: str) -> LaminarStreamReader:
    parsed = parse_options({"subscribe": "t", "bootstrap": "127.0.0.1:1", **options})
    return LaminarStreamReader(parsed, spark_schema(False))


def test_stream_starts_latest_by_default_and_caps_batches_by_lag(fake_cluster: FakeCluster) -> None:
    fake_cluster.earliest = {("t", 0): 0, ("t", 1): 0}
    fake_cluster.latest = {("t", 0): 100, ("t", 1): 20}
    reader = stream_reader(maxOffsetsPerTrigger="30")
    assert reader.initialOffset() == {"t": {"0": 100, "1": 20}}
    start = {"t": {"0": 0, "1": 10}}
    assert reader.getDefaultReadLimit() == ReadMaxRows(30)
    end = reader.latestOffset(start, ReadMaxRows(30))
    assert end == {"t": {"0": 27, "1": 13}}  # lags 100 and 10 share the 30
    assert reader.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 100, "1": 20}}
    parts = reader.partitions(start, end)
    assert [(p.partition, p.start, p.end) for p in parts] == [(0, 0, 27), (1, 10, 13)]
    assert [r.node_id for r in parts[0].replicas] == [1, 2]
    assert reader.reportLatestOffset() == {"t": {"0": 100, "1": 20}}


def test_new_partitions_are_read_from_earliest(fake_cluster: FakeCluster) -> None:
    fake_cluster.earliest = {("t", 0): 0, ("t", 1): 5}
    fake_cluster.latest = {("t", 0): 10, ("t", 1): 9}
    reader = stream_reader()
    end = reader.latestOffset({"t": {"0": 10}}, ReadAllAvailable())
    assert end == {"t": {"0": 10, "1": 9}}
    parts = reader.partitions({"t": {"0": 10}}, end)
    assert [(p.partition, p.start, p.end) for p in parts] == [(1, 5, 9)]


def test_available_now_stops_at_the_target(fake_cluster: FakeCluster) -> None:
    fake_cluster.earliest = {("t", 0): 0}
    fake_cluster.latest = {("t", 0): 50}
    reader = stream_reader(maxOffsetsPerTrigger="40")
    reader.prepareForTriggerAvailableNow()
    fake_cluster.latest = {("t", 0): 500}  # data arriving later is not part of this run
    first = reader.latestOffset({"t": {"0": 0}}, ReadMaxRows(40))
    assert first == {"t": {"0": 40}}
    second = reader.latestOffset(first, ReadMaxRows(40))
    assert second == {"t": {"0": 50}}
    assert reader.latestOffset(second, ReadMaxRows(40)) == second


def test_min_offsets_per_trigger_waits_until_max_trigger_delay(fake_cluster: FakeCluster) -> None:
    fake_cluster.earliest = {("t", 0): 0}
    fake_cluster.latest = {("t", 0): 5}
    reader = stream_reader(minOffsetsPerTrigger="10", maxTriggerDelay="200ms")
    assert reader.getDefaultReadLimit() == ReadMinRows(10)
    start = {"t": {"0": 0}}
    assert reader.latestOffset(start, ReadMinRows(10)) == start  # too few: wait
    fake_cluster.latest = {("t", 0): 12}
    assert reader.latestOffset(start, ReadMinRows(10)) == {"t": {"0": 12}}
    fake_cluster.latest = {("t", 0): 14}
    assert reader.latestOffset({"t": {"0": 12}}, ReadMinRows(10)) == {"t": {"0": 12}}
    time.sleep(0.25)  # waited longer than maxTriggerDelay: take what there is
    assert reader.latestOffset({"t": {"0": 12}}, ReadMinRows(10)) == {"t": {"0": 14}}


def test_planning_reports_retention_data_loss_or_skips(fake_cluster: FakeCluster) -> None:
    fake_cluster.earliest = {("t", 0): 40}
    fake_cluster.latest = {("t", 0): 90}
    start, end = {"t": {"0": 10}}, {"t": {"0": 90}}
    with pytest.raises(DataLossError, match=r"topic 't' partition 0: offsets \[10, 40\)"):
        stream_reader().partitions(start, end)
    parts = stream_reader(failOnDataLoss="false").partitions(start, end)
    assert [(p.start, p.end) for p in parts] == [(40, 90)]


def test_large_ranges_are_split_into_several_tasks(fake_cluster: FakeCluster) -> None:
    fake_cluster.earliest = {("t", 0): 0}
    fake_cluster.latest = {("t", 0): 2500}
    reader = stream_reader(maxRecordsPerPartition="1000")
    parts = reader.partitions({"t": {"0": 0}}, {"t": {"0": 2500}})
    assert [(p.start, p.end) for p in parts] == [(0, 833), (833, 1666), (1666, 2500)]
    assert [p.index for p in parts] == [0, 1, 2]


def test_children_are_planned_only_after_their_parents_are_finished() -> None:
    from spark_source.planning import Lineage, hold_children

    lineage = {
        ("t", 0): Lineage("sealed", (), 10),
        ("t", 1): Lineage("sealed", (0,), 6),
        ("t", 2): Lineage("active", (0,), -1),
        ("t", 3): Lineage("pending", (1,), -1),
        ("h", 0): Lineage("active", (), -1),
    }
    latest = {("t", 0): 12, ("t", 1): 7, ("t", 2): 5, ("t", 3): 0, ("h", 0): 9}
    # parent 0 not finished yet: its children stay where they are
    base = {("t", 0): 4, ("t", 1): 0, ("t", 2): 0, ("t", 3): 0, ("h", 0): 0}
    assert hold_children(base, latest, lineage) == {**latest, ("t", 1): 0, ("t", 2): 0}
    # the previous batch ended at 0's seal end: 1 and 2 are planned, 3 still pending
    base = {**base, ("t", 0): 10}
    assert hold_children(base, latest, lineage) == latest
    # a parent the query does not read holds nothing back
    assert hold_children({("t", 2): 0}, {("t", 2): 5}, lineage) == {("t", 2): 5}
