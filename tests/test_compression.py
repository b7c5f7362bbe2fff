"""Compressed record batches without a node: every codec's round trip, Kafka clients' own
record builders and readers on both sides, and typed errors for corrupt or oversized data."""

from __future__ import annotations

import gzip
import random
import struct
import subprocess
import sys
from pathlib import Path

import cramjam
import crc32c
import pytest

from laminar.client import Producer
from laminar.errors import (
    CorruptBatchError,
    DecompressionLimitError,
    InvalidRequestError,
    UnsupportedCompressionError,
)
from laminar.segment import compression as codecs
from laminar.segment.batch import (
    HEADER_SIZE,
    build_batch,
    decode_into,
    decode_records,
    decompressed,
    read_header,
    verify_batch,
)

CODECS = sorted(codecs.CODECS.items(), key=lambda item: item[1])
KAFKA_HEADER = struct.Struct(">qiibIhiqqqhii")  # Kafka RecordBatch v2, 61 bytes
LAMINAR_HEADER = struct.Struct("<qqiIBBHiqqqhHii")
T = 1_700_000_000_000


def records(count: int = 300, seed: int = 1) -> list[tuple]:
    """Compressible records with keys, null values, headers and out-of-order timestamps."""
    rng = random.Random(seed)
    words = [rng.randbytes(4).hex().encode() for _ in range(40)]
    out = []
    for i in range(count):
        key = None if i % 7 == 0 else b"key-%d" % (i % 13)
        value = (
            None if i % 11 == 5 else b" ".join(rng.choice(words) for _ in range(rng.randrange(30)))
        )
        headers = [("trace", b"t-%d" % i), ("empty", None)] if i % 5 == 0 else []
        out.append((key, value, headers, T + i * 3 - (i % 4)))
    return out


def plain_tuples(batch: bytes) -> list[tuple]:
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decode_records(batch)]


def laminar_from_section(section: bytes, attributes: int, kafka_fields: tuple) -> bytes:
    """A laminar batch around a Kafka batch's records section (header converted, crc anew)."""
    _, _, _, _, _, _, last_delta, first_ts, max_ts, pid, epoch, seq, count = kafka_fields
    out = bytearray(HEADER_SIZE) + section
    LAMINAR_HEADER.pack_into(
        out, 0, 0, 0, len(out), 0, 1, 0, attributes, last_delta, first_ts, max_ts, pid, epoch,
        0, seq, count,
    )  # fmt: skip
    struct.pack_into("<I", out, 20, crc32c.crc32c(memoryview(out)[24:]))
    return bytes(out)


def kafka_from_laminar(batch: bytes) -> bytearray:
    """A Kafka RecordBatch v2 around a laminar batch's records section (crc32c anew)."""
    h = read_header(batch)
    section = batch[HEADER_SIZE:]
    out = bytearray(KAFKA_HEADER.size) + section
    KAFKA_HEADER.pack_into(
        out, 0, h.base_offset, len(out) - 12, 0, 2, 0, h.attributes, h.last_offset_delta,
        h.first_timestamp, h.max_timestamp, h.producer_id, h.producer_epoch, h.base_sequence,
        h.record_count,
    )  # fmt: skip
    struct.pack_into(">I", out, 17, crc32c.crc32c(memoryview(out)[21:]))
    return out


@pytest.mark.parametrize(("name", "codec"), CODECS)
def test_every_codec_round_trips_and_the_crc_covers_the_compressed_bytes(
    name: str, codec: int
) -> None:
    recs = records()
    plain = build_batch(recs)
    packed = build_batch(recs, compression=codec, producer_id=7, producer_epoch=0, base_sequence=3)
    h = verify_batch(packed)  # the node's whole check: header and crc only
    assert h.compression == codec and h.record_count == len(recs)
    assert len(packed) < len(plain) // 2
    assert h.crc == crc32c.crc32c(packed[24:])
    assert plain_tuples(packed) == plain_tuples(plain)
    inflated, inflated_header = decompressed(packed, h)
    assert inflated[HEADER_SIZE:] == plain[HEADER_SIZE:]
    assert inflated_header.compression == 0 and read_header(inflated) == inflated_header


@pytest.mark.parametrize(("name", "codec"), CODECS)
def test_a_section_that_does_not_shrink_is_sent_uncompressed(name: str, codec: int) -> None:
    recs = [(None, random.Random(2).randbytes(200), (), T)]
    batch = build_batch(recs, compression=codec)
    assert read_header(batch).compression == 0
    assert batch == build_batch(recs)


def test_compression_levels_are_checked_and_change_the_output() -> None:
    recs = records(2000)
    fast = build_batch(recs, compression=codecs.GZIP, compression_level=1)
    best = build_batch(recs, compression=codecs.GZIP, compression_level=9)
    assert len(best) < len(fast) and plain_tuples(best) == plain_tuples(fast)
    with pytest.raises(UnsupportedCompressionError):
        codecs.check_level(codecs.GZIP, 10)
    with pytest.raises(UnsupportedCompressionError):
        codecs.check_level(codecs.SNAPPY, 1)


def test_the_producer_option_is_validated_with_a_typed_error() -> None:
    for name in ("gzip", "snappy", "lz4", "zstd", None, "none"):
        Producer("127.0.0.1:1", compression=name)
    for bad in ("brotli", "GZIP", "", 3):
        with pytest.raises(UnsupportedCompressionError) as caught:
            Producer("127.0.0.1:1", compression=bad)  # type: ignore[arg-type]
        assert isinstance(caught.value, ValueError | InvalidRequestError)
    with pytest.raises(UnsupportedCompressionError):
        Producer("127.0.0.1:1", compression="zstd", compression_level=99)
    with pytest.raises(UnsupportedCompressionError):
        Producer("127.0.0.1:1", compression_level=3)


def test_the_node_check_accepts_kafka_codecs_and_refuses_others() -> None:
    batch = bytearray(build_batch(records(50), compression=codecs.ZSTD))
    for attributes, needle in ((5, "compression codec 5"), (0x24, "control batch")):
        bad = bytearray(batch)
        struct.pack_into("<H", bad, 26, attributes)
        struct.pack_into("<I", bad, 20, crc32c.crc32c(memoryview(bad)[24:]))
        with pytest.raises(CorruptBatchError, match=needle):
            verify_batch(bad)
    # Many tiny records compress below 7 bytes each: only the decompressed limit bounds them.
    tiny = build_batch([(None, b"", (), T)] * 5000, compression=codecs.ZSTD)
    assert verify_batch(tiny).record_count == 5000 and len(tiny) - HEADER_SIZE < 5000
    lying = bytearray(tiny)
    count = codecs.MAX_DECOMPRESSED_BYTES // 7 + 1
    struct.pack_into("<i", lying, 28, count - 1)
    struct.pack_into("<i", lying, 64, count)
    struct.pack_into("<I", lying, 20, crc32c.crc32c(memoryview(lying)[24:]))
    with pytest.raises(CorruptBatchError, match="cannot fit"):
        verify_batch(lying)


# -- Kafka clients' own builders and readers ----------------------------------------------------


def _kafka_records(count: int = 200) -> list[tuple]:
    return [(k, v, list(h), ts) for k, v, h, ts in records(count, seed=3)]


@pytest.mark.parametrize(("name", "codec"), CODECS)
def test_kafka_python_compressed_batches_decode_with_laminar(name: str, codec: int) -> None:
    default_records = pytest.importorskip("kafka.record.default_records")
    builder = default_records.DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    recs = _kafka_records()
    for offset, (key, value, headers, ts) in enumerate(recs):
        builder.append(offset, timestamp=ts, key=key, value=value, headers=headers)
    kafka_batch = bytes(builder.build())
    fields = KAFKA_HEADER.unpack_from(kafka_batch)
    assert fields[5] & 7 == codec  # kafka-python did compress
    batch = laminar_from_section(kafka_batch[KAFKA_HEADER.size :], fields[5], fields)
    verify_batch(batch)
    theirs = list(default_records.DefaultRecordBatch(bytearray(kafka_batch)))
    ours = decode_records(batch)
    assert [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in ours] == [
        (r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in theirs
    ]


@pytest.mark.parametrize(("name", "codec"), CODECS)
def test_laminar_compressed_sections_decode_with_kafka_python_and_aiokafka(
    name: str, codec: int
) -> None:
    kafka_records = pytest.importorskip("kafka.record.default_records")
    aiokafka_records = pytest.importorskip("aiokafka.record.default_records")
    recs = records(400, seed=4)
    batch = build_batch(recs, compression=codec)
    assert read_header(batch).compression == codec
    kafka_batch = kafka_from_laminar(batch)
    expected = [
        (r.offset, r.timestamp, r.key, r.value, [(k, v) for k, v in r.headers])
        for r in decode_records(batch)
    ]
    for reader in (kafka_records.DefaultRecordBatch, aiokafka_records.DefaultRecordBatch):
        theirs = reader(bytes(kafka_batch))
        assert theirs.validate_crc()
        got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in theirs]
        assert got == expected, reader


@pytest.mark.parametrize(("name", "codec"), CODECS)
def test_aiokafka_compressed_batches_decode_with_laminar(name: str, codec: int) -> None:
    aiokafka_records = pytest.importorskip("aiokafka.record.default_records")
    builder = aiokafka_records.DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1 << 20)
    recs = _kafka_records()
    for offset, (key, value, headers, ts) in enumerate(recs):
        builder.append(offset, timestamp=ts, key=key, value=value, headers=headers)
    kafka_batch = bytes(builder.build())
    fields = KAFKA_HEADER.unpack_from(kafka_batch)
    assert fields[5] & 7 == codec
    batch = laminar_from_section(kafka_batch[KAFKA_HEADER.size :], fields[5], fields)
    assert [(r.key, r.value) for r in decode_records(batch)] == [(k, v) for k, v, _, _ in recs]


def _section_batch(codec: int, section: bytes, plain: bytes) -> bytes:
    h = read_header(plain)
    fields = (0, 0, 0, 2, 0, codec, h.last_offset_delta, h.first_timestamp, h.max_timestamp)
    return laminar_from_section(section, codec, (*fields, -1, -1, -1, h.record_count))


def test_other_writers_stream_variants_decode() -> None:
    """What librdkafka and others write: raw snappy, snappy-java framing with little-endian
    version fields (redpanda), gzip in two members, lz4 frames with content size and block
    checksums, zstd without a content size and in two frames."""
    plain = build_batch(records(500, seed=5))
    body = plain[HEADER_SIZE:]
    half = len(body) // 2
    xerial_le = codecs.XERIAL_MAGIC + struct.pack("<ii", 1, 1)
    blocks = b"".join(
        struct.pack(">i", len(c)) + bytes(c)
        for c in (
            cramjam.snappy.compress_raw(body[:half]),
            cramjam.snappy.compress_raw(body[half:]),
        )
    )
    lz4 = pytest.importorskip("lz4.frame")
    zstandard = pytest.importorskip("zstandard")
    streamer = zstandard.ZstdCompressor().compressobj()
    variants = [
        (codecs.SNAPPY, bytes(cramjam.snappy.compress_raw(body))),
        (codecs.SNAPPY, xerial_le + blocks),
        (codecs.GZIP, gzip.compress(body[:half]) + gzip.compress(body[half:])),
        (codecs.LZ4, lz4.compress(body, store_size=True, block_checksum=True)),
        (codecs.LZ4, lz4.compress(body, block_linked=True, content_checksum=True)),
        (codecs.ZSTD, streamer.compress(body) + streamer.flush()),
        (codecs.ZSTD, b"".join(map(bytes, map(cramjam.zstd.compress, (body[:half], body[half:]))))),
    ]  # fmt: skip
    for codec, section in variants:
        assert plain_tuples(_section_batch(codec, section, plain)) == plain_tuples(plain), codec


# -- corrupt and oversized data -----------------------------------------------------------------


@pytest.mark.parametrize(("name", "codec"), CODECS)
def test_corrupt_compressed_records_are_a_typed_error(name: str, codec: int) -> None:
    plain = build_batch(records(100))
    good = codecs.compress(codec, plain[HEADER_SIZE:])
    flipped = bytearray(good)
    flipped[len(flipped) // 2] ^= 0x5A
    sections = [b"\x00" * 40, good[: len(good) // 2], good + b"junk"]
    if codec in (codecs.GZIP, codecs.LZ4):  # checksummed streams (snappy and zstd as Kafka
        sections.append(bytes(flipped))  # writes them are not: the batch crc is the check)
    for section in sections:
        batch = _section_batch(codec, section, plain)
        verify_batch(batch)  # a node stores it: the crc is right
        with pytest.raises(CorruptBatchError):
            decompressed(batch, read_header(batch))
        with pytest.raises(CorruptBatchError):
            decode_records(batch)
    wrong = codecs.compress(codec, plain[HEADER_SIZE:-3])  # inflates, but the records do not
    with pytest.raises(CorruptBatchError, match="record"):
        decode_records(_section_batch(codec, wrong, plain))


@pytest.mark.parametrize(("name", "codec"), CODECS)
def test_a_decompression_bomb_is_refused_with_a_typed_error(name: str, codec: int) -> None:
    plain = build_batch([(None, bytes(1 << 20), (), T)])
    batch = build_batch([(None, bytes(1 << 20), (), T)], compression=codec)
    assert len(batch) < len(plain) // 20
    header = read_header(batch)
    with pytest.raises(DecompressionLimitError):
        decompressed(batch, header, limit=512 * 1024)
    out: list = []
    with pytest.raises(DecompressionLimitError):
        decode_into(batch, header, lambda *r: r, out, limit=512 * 1024)
    # The lz4 and zstd bounds come from block sizes: exact up to one block.
    inflated = decompressed(batch, header, limit=len(plain) + (128 << 10))[0]
    assert inflated[HEADER_SIZE:] == plain[HEADER_SIZE:]


def test_the_default_limit_refuses_a_bomb_before_inflating_it() -> None:
    """80 MiB of zeros in a zstd frame of a few KiB or in lz4 blocks: the block walk refuses
    them up front; a raw snappy block says its size first."""
    section = bytes(cramjam.zstd.compress(bytes(80 << 20)))
    assert len(section) < 16 << 10
    plain = build_batch([(None, b"x", (), T)])
    batch = _section_batch(codecs.ZSTD, section, plain)
    with pytest.raises(DecompressionLimitError, match="more than 67108864"):
        decode_records(batch)
    snappy_bomb = b"\x80\x80\x80\x80\x08" + b"\x00" * 16  # a raw block declaring 2 GiB
    with pytest.raises(DecompressionLimitError):
        decode_records(_section_batch(codecs.SNAPPY, snappy_bomb, plain))
    lz4_bomb = codecs.compress(codecs.LZ4, bytes(80 << 20))
    assert len(lz4_bomb) < 1 << 20
    with pytest.raises(DecompressionLimitError):
        decode_records(_section_batch(codecs.LZ4, lz4_bomb, plain))


def test_librdkafka_reads_laminar_sections_and_laminar_reads_librdkafkas() -> None:
    """Through librdkafka's mock broker, in a process of its own (tests/librdkafka_interop.py)."""
    pytest.importorskip("confluent_kafka")
    pytest.importorskip("aiokafka")
    script = Path(__file__).with_name("librdkafka_interop.py")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    lines = [line for line in done.stdout.splitlines() if "->" in line]
    assert done.returncode == 0 and len(lines) == 8, done.stdout + done.stderr[-2000:]
    assert all(line.endswith(": ok") for line in lines)


def test_a_share_consumer_inflates_a_batch_once_for_its_many_fetches() -> None:
    from laminar.client.decoding import InflatedBatches

    cache = InflatedBatches(entries=2)
    batches = [build_batch(records(100, seed=s), compression=codecs.LZ4) for s in range(3)]
    headers = [read_header(b) for b in batches]
    first = cache.get("t/0", batches[0], headers[0])
    assert cache.get("t/0", batches[0], headers[0]) is first
    assert cache.get("t/1", batches[0], headers[0]) is not first  # another partition
    cache.get("t/0", batches[1], headers[1])
    cache.get("t/0", batches[2], headers[2])
    assert cache.get("t/0", batches[0], headers[0]) is not first  # evicted, inflated again
    plain = build_batch(records(10))
    assert cache.get("t/0", plain, read_header(plain))[0] is plain


def test_dead_letters_of_a_batch_that_does_not_decode_are_copied_as_placeholders() -> None:
    from laminar.queues.partition import DeadLetter
    from laminar.queues.service import DLQ_HEADER, _records_or_placeholders

    plain = build_batch(records(5))
    batch = _section_batch(codecs.ZSTD, b"\x28\xb5\x2f\xfd" + b"\x00" * 30, plain)
    letters = {o: DeadLetter(o, 3, "rejected") for o in (1, 3, 99)}
    copies = _records_or_placeholders(batch, letters)
    assert [(r.offset, r.key, r.value) for r in copies] == [(1, None, None), (3, None, None)]
    assert all(r.headers[0][0] == DLQ_HEADER + "error" for r in copies)
    assert [r.value for r in _records_or_placeholders(plain, letters)] == [
        r.value for r in decode_records(plain)
    ]


def test_a_frame_claiming_a_huge_content_size_is_refused_before_decoding() -> None:
    """zstd and lz4 decoders may size their buffers by a frame's declared content size."""
    plain = build_batch([(None, b"x", (), T)])
    # zstd: single segment, 8-byte content size of 1 TiB, one raw block of one byte, last.
    zstd_frame = struct.pack("<IB", 0xFD2FB528, 0xE0) + struct.pack("<Q", 1 << 40)
    zstd_frame += bytes([0x09, 0x00, 0x00]) + b"x"
    # lz4: content size 1 TiB, one uncompressed block of one byte, end mark.
    lz4_frame = struct.pack("<IBB", 0x184D2204, 0x68, 0x40) + struct.pack("<Q", 1 << 40)
    lz4_frame += b"\x00" + struct.pack("<I", 0x80000001) + b"x" + b"\x00" * 4
    for codec, section in ((codecs.ZSTD, zstd_frame), (codecs.LZ4, lz4_frame)):
        with pytest.raises(DecompressionLimitError):
            decode_records(_section_batch(codec, section, plain))
