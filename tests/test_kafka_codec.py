"""The Kafka codec without a node: every served API's request and response round-trips at
every served version, malformed input raises KafkaCodecError only, batch headers convert both
ways without touching records, and Kafka's sequence rules."""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar.errors import CorruptBatchError, LaminarError
from laminar.kafka import errors, records
from laminar.kafka.apis import SERVED
from laminar.kafka.codec import (
    VERSION_MAX,
    Array,
    KafkaCodecError,
    Prim,
    Struct,
    decode,
    decode_request_header,
    encode,
    encode_response,
    versions,
)
from laminar.kafka.server import flexible_of, unsupported_response
from laminar.node import sequences
from laminar.node.producers import ProducerTable
from laminar.segment import batch as lb

CASES = [
    (api, version, which)
    for api in sorted(SERVED.values(), key=lambda a: a.key)
    for version in range(api.min_version, api.max_version + 1)
    for which in ("request", "response")
]


def sample(s: Struct, version: int, flexible: bool, seed: int) -> dict[str, Any]:
    """A value for every field of ``s`` in ``version`` (non-default where possible)."""
    out: dict[str, Any] = {}
    for i, f in enumerate(s.fields):
        low, high = versions(f.versions)
        if not low <= version <= high:
            continue
        if f.tag is not None and not flexible:
            continue
        nlow, nhigh = versions(f.nullable)
        nullable = nlow <= version <= nhigh
        if nullable and (seed + i) % 3 == 0:
            out[f.name] = None
            continue
        out[f.name] = sample_value(f.type, version, flexible, seed + i)
    return out


def sample_value(t: Prim | Array | Struct, version: int, flexible: bool, seed: int) -> Any:
    if isinstance(t, Array):
        return [sample_value(t.of, version, flexible, seed + k) for k in range(seed % 3 + 1)]
    if isinstance(t, Struct):
        return sample(t, version, flexible, seed)
    return {
        "int8": seed % 100 - 50,
        "int16": seed * 7 % 30000 - 100,
        "uint16": seed * 7 % 60000,
        "int32": seed * 100_003 - 5,
        "int64": seed * 10_000_000_019,
        "float64": seed / 3,
        "bool": bool(seed % 2),
        "uuid": bytes([seed % 256]) * 16,
        "string": f"s{seed}-é",
        "bytes": bytes(range(seed % 20)),
        "records": bytes(range(seed % 30)),
    }[t.name]


def normalise(s: Struct, value: dict[str, Any], version: int, flexible: bool) -> dict[str, Any]:
    """What a decode of ``value`` must give: fields of other versions at their defaults."""
    full = s.defaults(version, flexible)
    plan = s.plan(version, flexible)
    present = {f.name for f, _ in plan.regular} | {f.name for f, _ in plan.tagged.values()}
    for name, v in value.items():
        if name in present:
            full[name] = v
    for f in s.fields:
        v = full[f.name]
        if isinstance(v, memoryview):
            full[f.name] = bytes(v)
        elif isinstance(f.type, Struct) and isinstance(v, dict):
            full[f.name] = normalise(f.type, v, version, flexible)
        elif isinstance(f.type, Array) and isinstance(f.type.of, Struct) and v is not None:
            full[f.name] = [normalise(f.type.of, item, version, flexible) for item in v]
    return full


def plain(value: Any) -> Any:
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


@pytest.mark.parametrize(
    ("api", "version", "which"),
    CASES,
    ids=[f"{a.name}-v{v}-{w}" for a, v, w in CASES],
)
def test_round_trip_every_api_and_version(api: Any, version: int, which: str) -> None:
    schema = api.request if which == "request" else api.response
    flexible = api.flexible(version)
    for seed in (1, 2, 3):
        value = sample(schema, version, flexible, seed)
        data = bytes(encode(schema, value, version, flexible))
        decoded = decode(schema, memoryview(data), 0, version, flexible)
        assert plain(decoded) == normalise(schema, value, version, flexible)
        # every strict prefix is malformed, and says so with the codec's own error
        for cut in range(len(data)):
            with pytest.raises(KafkaCodecError):
                decode(schema, memoryview(data[:cut]), 0, version, flexible)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(CASES))
def test_garbage_raises_only_codec_errors(data: bytes, case: Any) -> None:
    api, version, which = case
    schema = api.request if which == "request" else api.response
    with contextlib.suppress(KafkaCodecError):
        decode(schema, memoryview(data), 0, version, api.flexible(version))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_request_headers_raise_only_codec_errors(data: bytes) -> None:
    with contextlib.suppress(KafkaCodecError):
        decode_request_header(memoryview(data), flexible_of)


def test_request_header_versions() -> None:
    # v1 (Metadata v1 is not flexible): key, version, correlation, client id
    v1 = struct.pack(">hhih", 3, 1, 77, 3) + b"abc" + b"BODY"
    h = decode_request_header(memoryview(v1), flexible_of)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (3, 1, 77, "abc")
    assert v1[h.body_offset :] == b"BODY"
    # v2 (Metadata v9 is flexible): a tag buffer follows the (non-compact) client id
    v2 = struct.pack(">hhih", 3, 9, 78, -1) + b"\x01\x05\x02xy" + b"BODY"
    h = decode_request_header(memoryview(v2), flexible_of)
    assert (h.correlation_id, h.client_id, v2[h.body_offset :]) == (78, None, b"BODY")
    # an unserved version: the header is read as v1 and nothing more
    h = decode_request_header(memoryview(struct.pack(">hhih", 3, 999, 5, 0)), flexible_of)
    assert (h.api_version, h.correlation_id) == (999, 5)


def test_response_headers() -> None:
    api_versions, metadata = SERVED[18], SERVED[3]
    body = {"error_code": 0, "api_keys": [], "throttle_time_ms": 0}
    # ApiVersions v3 is flexible but its response header stays v0 (no tag buffer)
    out = encode_response(
        9, api_versions.response, body, 3, True, api_versions.response_header_v1(3)
    )
    assert struct.unpack_from(">ii", out) == (len(out) - 4, 9)
    assert out[8:] == encode(api_versions.response, body, 3, True)
    assert metadata.response_header_v1(9) and not metadata.response_header_v1(8)
    out = encode_response(9, metadata.response, {}, 9, True, True)
    assert out[8] == 0  # the empty tag buffer of header v1


def test_unsupported_api_versions_answer() -> None:
    out = unsupported_response(42, 18)
    size, correlation, code, count = struct.unpack_from(">iihi", out)
    assert (size, correlation, code, count) == (
        len(out) - 4,
        42,
        errors.UNSUPPORTED_VERSION,
        len(SERVED),
    )
    keys = [struct.unpack_from(">hhh", out, 14 + 6 * i) for i in range(count)]
    assert keys == sorted((a.key, a.min_version, a.max_version) for a in SERVED.values())


def test_versions_spec() -> None:
    assert versions("3+") == (3, VERSION_MAX)
    assert versions("0-5") == (0, 5)
    assert versions("7") == (7, 7)
    low, high = versions(None)
    assert low > high


# record batches --------------------------------------------------------------------------------


def kafka_crc_ok(kbatch: bytes) -> bool:
    (crc,) = struct.unpack_from(">I", kbatch, 17)
    return crc == crc32c.crc32c(kbatch[21:])


def test_batch_headers_convert_both_ways() -> None:
    native = bytearray(
        lb.build_batch(
            [
                (b"k1", b"v1", [("h", b"x")], 1_700_000_000_000),
                (None, b"v2", [], 1_700_000_000_005),
                (b"k3", None, [("a", None)], 1_700_000_000_002),
            ],
            producer_id=123456789,
            producer_epoch=3,
            base_sequence=40,
        )
    )
    lb.stamp(native, 1000, 7)
    chunks: list[bytes | memoryview] = []
    size = records.to_kafka(bytes(native), chunks)
    kbatch = b"".join(bytes(c) for c in chunks)
    assert size == len(kbatch) == len(native) - lb.HEADER_SIZE + records.K_HEADER_SIZE
    assert kafka_crc_ok(kbatch)
    f = struct.unpack_from(">qiibIhiqqqhii", kbatch)
    assert f[0] == 1000 and f[1] == len(kbatch) - 12 and f[2] == 7 and f[3] == 2
    assert f[5:] == (0, 2, 1_700_000_000_000, 1_700_000_000_005, 123456789, 3, 40, 3)
    assert kbatch[61:] == native[lb.HEADER_SIZE :]  # records untouched
    back = records.to_laminar(memoryview(kbatch))
    lb.verify_batch(back)
    assert back[16:] == native[16:]  # all but the stamp the leader writes
    assert [r.value for r in lb.decode_records(back)] == [b"v1", b"v2", None]


def test_control_batches_go_out_as_commit_markers() -> None:
    control = bytearray(lb.control_batch(1, b"raft noop or queue state" * 10, 0))
    lb.stamp(control, 50, 2)
    plain_batch = bytearray(lb.build_batch([(None, b"after", [], 5)]))
    lb.stamp(plain_batch, 51, 2)
    chunks: list[bytes | memoryview] = []
    records.to_kafka(bytes(control + plain_batch), chunks)
    first = bytes(chunks[0]) + bytes(chunks[1])
    assert kafka_crc_ok(first)
    (base, _len, _epoch, _magic, _crc, attributes, lod) = struct.unpack_from(">qiibIhi", first)
    assert base == 50 and lod == 0 and attributes & records.K_ATTR_CONTROL
    # the record's key: version 0, type 1 (COMMIT)
    assert records._CONTROL_RECORD[5:9] == b"\x00\x00\x00\x01"
    assert struct.unpack_from(">q", bytes(chunks[2]))[0] == 51


def test_corrupt_kafka_batches_are_refused() -> None:
    native = bytearray(lb.build_batch([(b"k", b"v", [], 1)]))
    chunks: list[bytes | memoryview] = []
    records.to_kafka(bytes(native), chunks)
    kbatch = bytearray(b"".join(bytes(c) for c in chunks))
    kbatch[-1] ^= 1
    with pytest.raises(CorruptBatchError):
        records.to_laminar(memoryview(kbatch))
    kbatch[-1] ^= 1
    kbatch[16] = 1  # magic 1
    with pytest.raises(CorruptBatchError):
        list(records.iter_kafka_batches(memoryview(kbatch)))
    with pytest.raises(CorruptBatchError):
        list(records.iter_kafka_batches(memoryview(bytes(kbatch[:-3]))))


# sequences -------------------------------------------------------------------------------------


def header(producer_id: int, epoch: int, sequence: int, count: int) -> lb.BatchHeader:
    data = lb.build_batch(
        [(None, b"x", [], 0)] * count,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
    )
    return lb.read_header(data)


def test_kafka_sequence_rules() -> None:
    table = ProducerTable()
    first = header(9, 0, 0, 5)
    assert sequences.check(table, first) is None
    table.record(first, 10, 14)
    assert sequences.check(table, header(9, 0, 0, 5)).base_offset == 10  # a retry
    with pytest.raises(LaminarError) as info:
        sequences.check(table, header(9, 0, 6, 1))  # a gap
    assert errors.code_of(info.value) == errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert sequences.check(table, header(9, 0, 5, 2)) is None  # the next one
    with pytest.raises(LaminarError) as info:
        sequences.check(table, header(9, 1, 3, 1))  # a new epoch must start at 0
    assert errors.code_of(info.value) == errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    bumped = header(9, 1, 0, 1)
    assert sequences.check(table, bumped) is None
    table.record(bumped, 20, 20)
    with pytest.raises(LaminarError) as info:
        sequences.check(table, header(9, 0, 5, 1))  # the old epoch is fenced
    assert errors.code_of(info.value) == errors.INVALID_PRODUCER_EPOCH
    assert sequences.check(table, header(-1, -1, -1, 1)) is None  # not idempotent
