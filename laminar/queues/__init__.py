"""Queue consumption (share groups): the sans-I/O share-partition state machine and its records.

Nothing in this package does I/O, reads a clock or draws randomness: the node feeds it the
partition's end, skips and delays, member requests and the time, appends the records it emits to
the partition's log and releases each reply once the records before it are durable (see
``partition``).
"""

from laminar.queues.partition import (
    Acknowledgement,
    DeadLetter,
    Delivery,
    Receipt,
    ShareConfig,
    SharePartition,
    ShareView,
)
from laminar.queues.records import Record, ShareState, decode, encode, replay, snapshot

__all__ = [
    "Acknowledgement",
    "DeadLetter",
    "Delivery",
    "Receipt",
    "Record",
    "ShareConfig",
    "SharePartition",
    "ShareState",
    "ShareView",
    "decode",
    "encode",
    "replay",
    "snapshot",
]
