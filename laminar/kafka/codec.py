"""A compact schema language for Kafka's binary protocol, and one generic encoder/decoder.

Every request and response body is a ``Struct`` of ``Field``s. A field names the versions it
exists in (``"3+"``, ``"0-5"``), the versions it may be null in, and, for flexible versions,
an optional tag (tagged fields travel in the struct's tag buffer and are left out when they
hold their default). Whether a version is *flexible* (compact strings/arrays/bytes with
unsigned-varint lengths, a tag buffer after every struct) is a property of the API, passed in.

Decoded values are plain dicts keyed by snake_case field names; a field absent from a version
decodes as its default. Encoding takes the same dicts; a missing key encodes as the default.
Any malformed input raises ``KafkaCodecError`` (never IndexError or struct.error), so the
listener can close that one connection.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from laminar.errors import ProtocolError

VERSION_MAX = 0x7FFF


class KafkaCodecError(ProtocolError):
    """A request could not be decoded (truncated, a length out of bounds, bad utf-8...)."""


def versions(spec: str | None) -> tuple[int, int]:
    """'3+' -> (3, max), '0-5' -> (0, 5), '2' -> (2, 2), None/'none' -> empty range."""
    if spec is None or spec == "none":
        return (1, 0)
    if spec.endswith("+"):
        return (int(spec[:-1]), VERSION_MAX)
    low, _, high = spec.partition("-")
    return (int(low), int(high or low))


# --- primitive readers and writers ------------------------------------------------------------

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")


def read_uvarint(buf: memoryview | bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise KafkaCodecError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise KafkaCodecError("varint is too long")


def write_uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


@dataclass(frozen=True, slots=True)
class Prim:
    """A fixed-size or length-prefixed primitive type."""

    name: str
    default: Any


INT8 = Prim("int8", 0)
INT16 = Prim("int16", 0)
UINT16 = Prim("uint16", 0)
INT32 = Prim("int32", 0)
INT64 = Prim("int64", 0)
FLOAT64 = Prim("float64", 0.0)
BOOL = Prim("bool", False)
UUID = Prim("uuid", bytes(16))
STRING = Prim("string", "")
BYTES = Prim("bytes", b"")
RECORDS = Prim("records", None)
"""Record batches: bytes on the wire; decoded as a memoryview of the request (no copy),
encoded from bytes or a list of buffers (the batches of a fetch)."""

_FIXED: dict[str, struct.Struct] = {
    "int8": _I8,
    "int16": _I16,
    "uint16": _U16,
    "int32": _I32,
    "int64": _I64,
    "float64": _F64,
}


@dataclass(frozen=True, slots=True)
class Array:
    of: Prim | Struct


@dataclass(slots=True)
class Field:
    name: str
    type: Prim | Array | Struct
    versions: str = "0+"
    nullable: str | None = None
    tag: int | None = None
    default: Any = None

    def __post_init__(self) -> None:
        if self.default is None and self.tag is None and isinstance(self.type, Prim):
            self.default = self.type.default


def F(
    name: str,
    type_: Prim | Array | Struct,
    versions: str = "0+",
    *,
    nullable: str | None = None,
    tag: int | None = None,
    default: Any = None,
) -> Field:
    return Field(name, type_, versions, nullable, tag, default)


@dataclass(slots=True)
class _Plan:
    """A struct's fields as one version sees them."""

    regular: list[tuple[Field, bool]]  # (field, nullable in this version)
    tagged: dict[int, tuple[Field, bool]]


@dataclass(slots=True)
class Struct:
    fields: Sequence[Field]
    _plans: dict[tuple[int, bool], _Plan] = field(default_factory=dict, repr=False)

    def plan(self, version: int, flexible: bool) -> _Plan:
        key = (version, flexible)
        plan = self._plans.get(key)
        if plan is None:
            regular: list[tuple[Field, bool]] = []
            tagged: dict[int, tuple[Field, bool]] = {}
            for f in self.fields:
                low, high = versions(f.versions)
                if not low <= version <= high:
                    continue
                nlow, nhigh = versions(f.nullable)
                nullable = nlow <= version <= nhigh
                if f.tag is not None:
                    if flexible:
                        tagged[f.tag] = (f, nullable)
                else:
                    regular.append((f, nullable))
            plan = self._plans[key] = _Plan(regular, tagged)
        return plan

    def defaults(self, version: int, flexible: bool) -> dict[str, Any]:
        """Every field of this version at its default (for building replies)."""
        return {f.name: _default(f) for f in self.fields}


def _default(f: Field) -> Any:
    if isinstance(f.type, Array):
        return [] if f.default is None else list(f.default)
    if isinstance(f.type, Struct) and f.default is None:
        return None
    return f.default


# --- decoding ---------------------------------------------------------------------------------


class Reader:
    """Reads one message body; ``flexible`` selects compact encodings and tag buffers."""

    __slots__ = ("buf", "flexible", "pos", "version")

    def __init__(
        self, buf: memoryview, pos: int = 0, flexible: bool = False, version: int = 0
    ) -> None:
        self.buf = buf
        self.pos = pos
        self.flexible = flexible
        self.version = version

    def fixed(self, s: struct.Struct) -> Any:
        pos = self.pos
        if pos + s.size > len(self.buf):
            raise KafkaCodecError("message is truncated")
        self.pos = pos + s.size
        return s.unpack_from(self.buf, pos)[0]

    def length(self, nullable_ok: bool, wide: bool = False) -> int:
        """A string/bytes/array length; -1 means null."""
        if self.flexible:
            n, self.pos = read_uvarint(self.buf, self.pos)
            n -= 1
        else:
            n = self.fixed(_I32 if wide else _I16)
        if n < -1 or (n == -1 and not nullable_ok):
            raise KafkaCodecError(f"invalid length {n}")
        return n

    def raw(self, n: int) -> memoryview:
        pos = self.pos
        if n < 0 or pos + n > len(self.buf):
            raise KafkaCodecError(f"length {n} runs past the end of the message")
        self.pos = pos + n
        return self.buf[pos : pos + n]

    def string(self, nullable: bool) -> str | None:
        n = self.length(nullable)
        if n < 0:
            return None
        try:
            return str(self.raw(n), "utf-8")
        except UnicodeDecodeError as exc:
            raise KafkaCodecError("string is not utf-8") from exc

    def value(self, t: Prim | Array | Struct, nullable: bool) -> Any:
        if isinstance(t, Prim):
            s = _FIXED.get(t.name)
            if s is not None:
                return self.fixed(s)
            name = t.name
            if name == "string":
                return self.string(nullable)
            if name == "bool":
                return bool(self.raw(1)[0])
            if name == "uuid":
                return bytes(self.raw(16))
            # bytes, records
            n = self.length(nullable or name == "records", wide=True)
            if n < 0:
                return None
            data = self.raw(n)
            return data if name == "records" else bytes(data)
        if isinstance(t, Array):
            n = self.length(nullable, wide=True)
            if n < 0:
                return None
            if n > len(self.buf) - self.pos:  # each element takes at least one byte
                raise KafkaCodecError(f"array of {n} elements cannot fit in the message")
            of = t.of
            return [self.value(of, False) for _ in range(n)]
        if nullable and self.fixed(_I8) < 0:  # a nullable struct's presence marker
            return None
        return self.struct(t)

    def struct(self, s: Struct) -> dict[str, Any]:
        plan = s.plan(self.version, self.flexible)
        out: dict[str, Any] = {}
        for f in s.fields:
            if f.name not in out:
                out[f.name] = _default(f)
        for f, nullable in plan.regular:
            out[f.name] = self.value(f.type, nullable)
        if self.flexible:
            self.tags(plan, out)
        return out

    def tags(self, plan: _Plan, out: dict[str, Any]) -> None:
        count, self.pos = read_uvarint(self.buf, self.pos)
        for _ in range(count):
            tag, self.pos = read_uvarint(self.buf, self.pos)
            size, self.pos = read_uvarint(self.buf, self.pos)
            body = self.raw(size)
            known = plan.tagged.get(tag)
            if known is None:
                continue  # unknown tags are skipped, as the protocol requires
            f, nullable = known
            out[f.name] = Reader(body, 0, True, self.version).value(f.type, nullable)


def decode(s: Struct, buf: memoryview, pos: int, version: int, flexible: bool) -> dict[str, Any]:
    """Decode one body of ``s`` at ``version`` (trailing bytes are ignored)."""
    reader = Reader(buf, pos, flexible, version)
    try:
        out = reader.struct(s)
    except KafkaCodecError:
        raise
    except (IndexError, struct.error, ValueError, TypeError) as exc:
        raise KafkaCodecError(f"malformed message: {exc}") from None
    # Bytes after the body are ignored, as Kafka's brokers do: librdkafka's Metadata v12
    # request for all topics carries a few more than the schema has.
    return out


# --- encoding ---------------------------------------------------------------------------------


class Writer:
    __slots__ = ("flexible", "out", "version")

    def __init__(self, out: bytearray, version: int, flexible: bool) -> None:
        self.out = out
        self.version = version
        self.flexible = flexible

    def length(self, n: int, wide: bool = False) -> None:
        if self.flexible:
            write_uvarint(self.out, n + 1)
        else:
            self.out += (_I32 if wide else _I16).pack(n)

    def value(self, t: Prim | Array | Struct, v: Any, nullable: bool, name: str) -> None:
        out = self.out
        if isinstance(t, Prim):
            s = _FIXED.get(t.name)
            if s is not None:
                out += s.pack(v)
                return
            tn = t.name
            if tn == "bool":
                out.append(1 if v else 0)
                return
            if tn == "uuid":
                if len(v) != 16:
                    raise ValueError(f"{name}: a uuid is 16 bytes")
                out += v
                return
            if v is None:
                if not nullable and tn != "records":
                    raise ValueError(f"{name} is not nullable in version {self.version}")
                self.length(-1, wide=tn != "string")
                return
            if tn == "string":
                data = v.encode()
                self.length(len(data))
                out += data
                return
            if isinstance(v, list):  # records given as buffers to concatenate
                self.length(sum(len(c) for c in v), wide=True)
                for chunk in v:
                    out += chunk
                return
            self.length(len(v), wide=True)
            out += v
            return
        if isinstance(t, Array):
            if v is None:
                if not nullable:
                    raise ValueError(f"{name} is not nullable in version {self.version}")
                self.length(-1, wide=True)
                return
            self.length(len(v), wide=True)
            of = t.of
            for item in v:
                self.value(of, item, False, name)
            return
        if nullable:
            if v is None:
                out += _I8.pack(-1)
                return
            out += _I8.pack(1)
        self.struct(t, v)

    def struct(self, s: Struct, v: dict[str, Any]) -> None:
        plan = s.plan(self.version, self.flexible)
        for f, nullable in plan.regular:
            self.value(f.type, v[f.name] if f.name in v else _default(f), nullable, f.name)
        if self.flexible:
            present = [
                (tag, f, nullable)
                for tag, (f, nullable) in sorted(plan.tagged.items())
                if f.name in v and v[f.name] != _default(f)
            ]
            write_uvarint(self.out, len(present))
            for tag, f, nullable in present:
                body = bytearray()
                Writer(body, self.version, True).value(f.type, v[f.name], nullable, f.name)
                write_uvarint(self.out, tag)
                write_uvarint(self.out, len(body))
                self.out += body


def encode(
    s: Struct, value: dict[str, Any], version: int, flexible: bool, out: bytearray | None = None
) -> bytearray:
    out = bytearray() if out is None else out
    Writer(out, version, flexible).struct(s, value)
    return out


# --- headers ----------------------------------------------------------------------------------

_REQUEST_HEAD = struct.Struct(">hhi")


@dataclass(slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int = 0


def decode_request_header(
    buf: memoryview, flexible_of: Callable[[int, int], bool | None]
) -> RequestHeader:
    """Header v1 (v2 adds a tag buffer when ``flexible_of(key, version)`` says so).

    ``flexible_of`` returns None for an API/version this node does not serve: the body offset
    is then only a guess, and the caller answers UNSUPPORTED_VERSION without reading the body.
    """
    if len(buf) < _REQUEST_HEAD.size + 2:
        raise KafkaCodecError("request is shorter than its header")
    key, version, correlation = _REQUEST_HEAD.unpack_from(buf, 0)
    reader = Reader(buf, _REQUEST_HEAD.size)
    client_id = reader.string(True)  # a plain (non-compact) string even in header v2
    if flexible_of(key, version):
        reader.flexible = True
        reader.tags(_Plan([], {}), {})
    return RequestHeader(key, version, correlation, client_id, reader.pos)


def encode_response(
    correlation_id: int,
    s: Struct,
    body: dict[str, Any],
    version: int,
    flexible: bool,
    header_v1: bool,
) -> bytearray:
    """The size-prefixed frame of a response: size, correlation id, [tag buffer], body."""
    out = bytearray(8)
    _I32.pack_into(out, 4, correlation_id)
    if header_v1:
        out.append(0)  # empty tag buffer
    encode(s, body, version, flexible, out)
    _I32.pack_into(out, 0, len(out) - 4)
    return out
