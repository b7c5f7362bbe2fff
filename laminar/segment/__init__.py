"""Storage: the record batch format and the segmented partition log."""

from laminar.segment.batch import (
    ATTR_CONTROL,
    HEADER_SIZE,
    MAGIC,
    BatchHeader,
    Record,
    build_batch,
    control_batch,
    decode_records,
    is_control,
    iter_batches,
    read_header,
    stamp,
    verify_batch,
)
from laminar.segment.log import LogConfig, PartitionLog
from laminar.segment.slice import LogSlice

__all__ = [
    "ATTR_CONTROL",
    "HEADER_SIZE",
    "MAGIC",
    "BatchHeader",
    "LogConfig",
    "LogSlice",
    "PartitionLog",
    "Record",
    "build_batch",
    "control_batch",
    "decode_records",
    "is_control",
    "iter_batches",
    "read_header",
    "stamp",
    "verify_batch",
]
