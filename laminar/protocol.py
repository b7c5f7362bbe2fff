"""Client and peer protocol helpers: frame kinds, message codecs and typed errors on the wire.

The schemas live in laminar/schema/*.capnp (client.capnp for clients, cluster.capnp between
nodes). A Cap'n Proto reader must not outlive the buffer it reads, so decoders here copy the
message into a fresh (8-byte-aligned) ``bytes`` and hand back readers tied to it.
"""

from __future__ import annotations

from typing import Any

from laminar import schemas
from laminar.errors import (
    ERRORS_BY_CODE,
    LaminarError,
    NotLeaderError,
    OffsetOutOfRangeError,
    ProtocolError,
)

API_VERSION = 1

KIND_REQUEST = 1
KIND_RESPONSE = 2
KIND_PEER = 3
KIND_SWIM = 0x53  # one SWIM datagram (laminar/membership/codec.py)

CLIENT_CRC_COVERS_PAYLOAD = False
"""Client frames carry only record batches as payload, each checked by its own crc32c, so
their frame crc leaves the payload out (laminar/framing.py)."""

ACKS_ALL = -1
ACKS_LEADER = 1
ACKS_NONE = 0
ACKS_BY_NAME = {"all": ACKS_ALL, "leader": ACKS_LEADER, "none": ACKS_NONE}

EARLIEST = -2
LATEST = -1
MAX_NODE_ID = 2**32 - 1  # node ids are UInt32 in every client and peer message

client_schema: Any = schemas.load("client")
cluster_schema: Any = schemas.load("cluster")


def fill_error(builder: Any, error: BaseException) -> None:
    """Write ``error`` into an Error struct builder (unknown exceptions become code 1)."""
    code = error.code if isinstance(error, LaminarError) else LaminarError.code
    builder.code = code
    builder.message = str(error) or type(error).__name__
    if isinstance(error, NotLeaderError):
        builder.leaderId = error.leader_id
        builder.leaderAddress = error.leader_address
    elif isinstance(error, OffsetOutOfRangeError):
        builder.logStart = error.start
        builder.logEnd = error.end


def read_error(reader: Any) -> LaminarError | None:
    """Turn an Error struct reader back into the typed exception (None when code is 0)."""
    code = reader.code
    if code == 0:
        return None
    cls = ERRORS_BY_CODE.get(code, LaminarError)
    message = reader.message
    if cls is NotLeaderError:
        return NotLeaderError(message, reader.leaderId, reader.leaderAddress)
    if cls is OffsetOutOfRangeError:
        error = OffsetOutOfRangeError(-1, reader.logStart, reader.logEnd)
        error.args = (message,)
        return error
    return cls(message)


TRAVERSALS_PER_WORD = 4
"""How many times over a decoded message may be read (Cap'n Proto's traversal limit)."""


def decode(struct_type: Any, message: bytes | bytearray | memoryview) -> Any:
    """Decode an unpacked message; ProtocolError on any malformed input."""
    data = schemas.aligned(message)
    try:
        # traversal_limit protects against amplification; nesting_limit against deep recursion.
        # Every read of a pointer field counts again, and handlers read a few fields of each
        # list element more than once: a produce of a batch per partition to 400 partitions
        # went past a limit of one message's size.
        context = struct_type.from_bytes(
            data,
            traversal_limit_in_words=TRAVERSALS_PER_WORD * (len(data) // 8) + 1024,
            nesting_limit=16,
        )
        reader = context.__enter__()
    except Exception as exc:  # pycapnp raises KjException or ValueError on garbage
        raise ProtocolError(f"malformed message: {str(exc).splitlines()[0]}") from None
    return _Kept(reader, data)


def request_body(request: Any) -> tuple[str, Any]:
    """A decoded Request's body: (union member name, its reader); ProtocolError if the union
    cannot be read (e.g. a discriminant no schema version defines)."""
    try:
        which = request.body.which()
        return which, getattr(request.body, which)
    except Exception as exc:  # pycapnp: KjException
        raise ProtocolError(f"malformed request body: {str(exc).splitlines()[0]}") from None


class _Kept:
    """A reader plus the bytes it points into, so the buffer lives as long as the reader."""

    __slots__ = ("_data", "_reader")

    def __init__(self, reader: Any, data: bytes) -> None:
        self._reader = reader
        self._data = data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)

    @property
    def reader(self) -> Any:
        return self._reader
