"""The record batch format: layout, round trips, and every rejected input."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar.errors import BatchTooLargeError, CorruptBatchError
from laminar.segment import batch as batch_module
from laminar.segment import varint
from laminar.segment.batch import (
    ATTR_CONTROL,
    HEADER_SIZE,
    MAGIC,
    Record,
    build_batch,
    control_batch,
    decode_into,
    decode_records,
    is_control,
    iter_batches,
    read_header,
    stamp,
    verify_batch,
)


def _recrc(buf: bytearray) -> bytearray:
    struct.pack_into("<I", buf, 20, crc32c.crc32c(bytes(buf[24:])))
    return buf


def test_header_layout_matches_the_spec() -> None:
    b = build_batch(
        [(b"k", b"v", [("h", b"1")], 1_000), (None, b"w", (), 1_005)],
        producer_id=7,
        producer_epoch=3,
        base_sequence=11,
    )
    (base, term, length, crc) = struct.unpack_from("<qqiI", b, 0)
    assert (base, term, length) == (0, 0, len(b))
    assert crc == crc32c.crc32c(b[24:])
    magic, res, attrs, lod, first, mx, pid, epoch, res2, seq, count = struct.unpack_from(
        "<BBHiqqqhHii", b, 24
    )
    assert (magic, res, attrs, lod, first, mx) == (MAGIC, 0, 0, 1, 1_000, 1_005)
    assert (pid, epoch, res2, seq, count) == (7, 3, 0, 11, 2)
    # first record: length varint then attributes 0, ts delta 0, offset delta 0, key len 1
    assert b[HEADER_SIZE + 1 : HEADER_SIZE + 6] == bytes([0, 0, 0, 2, ord("k")])


def test_round_trip_with_stamp() -> None:
    recs = [
        (b"key", b"value", [("a", b"x"), ("b", None)], 5_000),
        (None, None, (), 4_990),
        (b"", b"\x00" * 300, (), 5_300),
    ]
    buf = bytearray(build_batch(recs))
    stamp(buf, 1_000, 9)
    h = verify_batch(buf)  # stamping leaves the crc valid
    assert (h.base_offset, h.term, h.last_offset, h.record_count) == (1_000, 9, 1_002, 3)
    assert (h.first_timestamp, h.max_timestamp) == (5_000, 5_300)
    assert decode_records(buf) == [
        Record(1_000, 5_000, b"key", b"value", (("a", b"x"), ("b", None))),
        Record(1_001, 4_990, None, None, ()),
        Record(1_002, 5_300, b"", b"\x00" * 300, ()),
    ]


def test_control_batch() -> None:
    b = control_batch(3, b"payload", 77)
    h = verify_batch(b)
    assert is_control(h) and h.attributes == ATTR_CONTROL
    (rec,) = decode_records(b)
    assert rec.key == struct.pack(">H", 3) and rec.value == b"payload" and rec.timestamp == 77
    assert not is_control(verify_batch(build_batch([(None, b"x", (), 1)])))


def test_empty_batch_is_refused() -> None:
    with pytest.raises(ValueError):
        build_batch([])


def _set_counts(buf: bytearray, last_offset_delta: int, count: int) -> bytearray:
    struct.pack_into("<i", buf, 28, last_offset_delta)
    struct.pack_into("<i", buf, 64, count)
    return buf


def _good() -> bytearray:
    return bytearray(build_batch([(b"k", b"v" * 50, (), 10), (b"k2", b"v", (), 11)]))


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda b: b.__setitem__(slice(40, 41), b"\xff"), "crc32c mismatch"),
        (lambda b: struct.pack_into("<i", b, 16, len(b) + 1), "does not match"),
        (lambda b: _recrc(struct.pack_into("<B", b, 24, 2) or b), "magic"),
        (lambda b: _recrc(struct.pack_into("<H", b, 26, 5) or b), "compression codec 5"),
        (lambda b: _recrc(struct.pack_into("<H", b, 26, 0x22) or b), "control batch is never"),
        (lambda b: _recrc(struct.pack_into("<H", b, 26, 1 << 9) or b), "attribute bits"),
        (lambda b: _recrc(struct.pack_into("<B", b, 25, 1) or b), "reserved"),
        (lambda b: _recrc(struct.pack_into("<i", b, 64, 0) or b), "record_count"),
        (lambda b: _recrc(struct.pack_into("<i", b, 28, 5) or b), "last_offset_delta"),
        (lambda b: _recrc(_set_counts(b, 99, 100)), "cannot fit"),
        (lambda b: _recrc(struct.pack_into("<q", b, 40, 0) or b), "max_timestamp"),
    ],
)
def test_verify_rejects_each_defect(mutate, needle: str) -> None:  # type: ignore[no-untyped-def]
    buf = _good()
    mutate(buf)
    with pytest.raises(CorruptBatchError, match=needle):
        verify_batch(buf)


def test_verify_rejects_short_and_oversize() -> None:
    with pytest.raises(CorruptBatchError, match="shorter"):
        verify_batch(b"\x00" * 20)
    buf = _good()
    with pytest.raises(BatchTooLargeError):
        verify_batch(buf, max_batch_bytes=len(buf) - 1)
    assert verify_batch(buf, max_batch_bytes=len(buf)).batch_length == len(buf)
    with pytest.raises(CorruptBatchError, match="does not match"):
        verify_batch(buf[:-1])


def test_read_header_errors() -> None:
    buf = _good()
    with pytest.raises(CorruptBatchError):
        read_header(buf[:67])
    bad = bytearray(buf)
    struct.pack_into("<i", bad, 16, 10)
    with pytest.raises(CorruptBatchError, match="shorter than the header"):
        read_header(bad)
    bad = bytearray(buf)
    bad[24] = 9
    with pytest.raises(CorruptBatchError, match="magic"):
        read_header(bad)


def test_iter_batches_stops_at_partial_tail() -> None:
    a, b = _good(), bytearray(build_batch([(None, b"z" * 1000, (), 1)]))
    stream = bytes(a + b + b[:500])
    got = list(iter_batches(stream))
    assert [p for p, _ in got] == [0, len(a)]
    assert got[1][1].batch_length == len(b)
    assert list(iter_batches(stream[:30])) == []


def test_decode_rejects_malformed_records() -> None:
    buf = _good()
    buf[HEADER_SIZE] = 0x7F  # record length far beyond the batch
    with pytest.raises(CorruptBatchError):
        decode_records(buf)


@pytest.mark.parametrize("value", [0, 1, -1, 63, -64, 64, 8191, 16384, -(2**63), 2**63 - 1])
def test_varint_round_trip(value: int) -> None:
    enc = varint.encode(value)
    assert varint.decode(enc, 0, len(enc)) == (value, len(enc))


def test_varint_truncated() -> None:
    with pytest.raises(CorruptBatchError):
        varint.decode(b"\x80\x80", 0, 2)


record = st.tuples(
    st.one_of(st.none(), st.binary(max_size=40)),
    st.one_of(st.none(), st.binary(max_size=20_000)),
    st.lists(
        st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=3
    ),
    st.integers(min_value=0, max_value=2**41),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(record, min_size=1, max_size=20), st.integers(0, 2**40), st.integers(0, 2**20))
def test_round_trip_property(recs: list, base: int, term: int) -> None:  # type: ignore[type-arg]
    buf = bytearray(build_batch(recs))
    stamp(buf, base, term)
    h = verify_batch(buf)
    assert h.record_count == len(recs)
    assert h.max_timestamp == max(r[3] for r in recs)
    out = decode_records(buf)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in out] == [
        (base + i, ts, k, v, tuple(hs)) for i, (k, v, hs, ts) in enumerate(recs)
    ]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.one_of(st.none(), st.binary(max_size=20_000)), st.integers(-3, 20_000)),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 2**41),
    st.sampled_from((1, 3, 300, 9000)),
)
def test_plain_records_encode_as_the_general_path_does(
    values: list[tuple[bytes | None, int]], ts: int, least: int
) -> None:
    """Unkeyed, header-less records take a faster loop (``send_many``'s shape): its bytes are
    the general loop's, with runs of one timestamp and timestamps out of order too, and past
    the 64- and 8,192-record steps of the offset delta's varint (its table grows as batches
    do)."""
    if least > 3:  # many records: small values keep the batch small
        values = [(None if v is None else v[:3], step) for v, step in values]
    values = values * -(-least // len(values))
    records = [(None, v, (), ts + step // 4) for v, step in values]
    fast = build_batch(records)
    assert batch_module._plain(records)
    general: list[bytes | bytearray] = []
    max_ts = batch_module._add_records(records, records[0][3], general)
    assert read_header(fast).max_timestamp == max_ts == max(r[3] for r in records)
    assert fast[HEADER_SIZE:] == b"".join(general)
    out = decode_records(bytearray(fast))
    assert [(r.offset, r.timestamp, r.key, r.value) for r in out] == [
        (i, t, None, v) for i, (_k, v, _h, t) in enumerate(records)
    ]


def test_records_that_are_not_plain_take_the_general_loop() -> None:
    """A key (even an empty one) or a header keeps the general encoding."""
    plain = [(None, b"v", (), 5), (None, None, (), 6)]
    assert batch_module._plain(plain)
    for other in ((b"", b"v", (), 5), (None, b"v", (("h", None),), 5)):
        records = [*plain, other]
        assert not batch_module._plain(records)
        out = decode_records(bytearray(build_batch(records)))
        assert (out[-1].key, out[-1].value, out[-1].headers) == (other[0], other[1], other[2])


@given(
    st.integers(1, 40),
    st.data(),
)
@settings(max_examples=60, deadline=None)
def test_decoding_a_window_of_a_batch_gives_exactly_those_records(
    count: int, data: st.DataObject
) -> None:
    records = [
        (b"k%d" % i, b"v" * (i * 7), [("h", b"%d" % i)] if i % 3 else (), i) for i in range(count)
    ]
    buf = bytearray(build_batch(records))
    stamp(buf, 100, 1)
    header = read_header(buf)
    lo = data.draw(st.integers(100, 100 + count))
    hi = data.draw(st.integers(lo, 100 + count + 2))
    out: list[tuple[int, bytes | None]] = []
    decode_into(bytes(buf), header, lambda o, _t, _k, v, _h: (o, v), out, lo, hi)
    assert out == [(100 + i, b"v" * (i * 7)) for i in range(count) if lo <= 100 + i < hi]


def test_two_byte_varints_read_inline_decode_like_the_long_form() -> None:
    """Offset deltas past 63, value lengths of 64..8191 and timestamp deltas of two bytes (the
    decoder reads them inline) decode as written, whole and as a window; a two-byte value
    length running past its record is refused."""
    sizes = (0, 63, 64, 100, 8191, 8192)
    records = [
        (None, b"v" * sizes[i % len(sizes)], (), 1_000_000 + (i * 37) % 9000) for i in range(300)
    ]
    buf = bytearray(build_batch(records))
    stamp(buf, 5, 1)
    out = decode_records(buf)
    assert [(r.offset, r.timestamp, r.value) for r in out] == [
        (5 + i, ts, v) for i, (_k, v, _h, ts) in enumerate(records)
    ]
    window: list[tuple[int, bytes | None]] = []
    decode_into(bytes(buf), read_header(buf), lambda o, _t, _k, v, _h: (o, v), window, 105, 250)
    assert window == [(5 + i, records[i][1]) for i in range(100, 245)]
    one = bytearray(build_batch([(None, b"x" * 100, (), 0)]))
    value_at = one.index(b"x" * 100) - 2  # the two-byte length of the value
    assert one[value_at] >= 0x80
    one[value_at + 1] += 1  # 128 bytes more than the record holds
    with pytest.raises(CorruptBatchError):
        decode_records(one)
