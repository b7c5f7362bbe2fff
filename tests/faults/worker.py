"""Client processes the harness runs (and SIGKILLs mid-request): a producer and a consumer.

Each logs what it saw, one line per event, with a plain write() straight to the file, so a line
is in the page cache before the worker acts on it and survives a SIGKILL of the worker (the
harness reads the files after the worker is gone; the machine itself never crashes, so fsync
would add nothing here):

    producer:  S <value>                 about to send (from now on: indeterminate)
               A <value> <partition> <offset>   acknowledged (acks=all)
               E <value> <error class>          failed (still indeterminate: may be written)
    consumer:  R <partition> <offset> <value>   a record a consumer was served

    python -m tests.faults.worker produce BOOTSTRAP TOPIC LOG TAG
    python -m tests.faults.worker consume BOOTSTRAP TOPIC LOG
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

from laminar.client import Consumer, Producer

CHUNK = 8
PAUSE = 0.05  # seconds between a lane's chunks: ~100 records/s per partition and worker


class _Log:
    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, line: str) -> None:
        os.write(self.fd, (line + "\n").encode())


async def produce(bootstrap: str, topic: str, log_path: Path, tag: str) -> None:
    log = _Log(log_path)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    producer = Producer(
        bootstrap,
        acks="all",
        idempotent=True,
        linger_ms=2,
        request_timeout_ms=3_000,
        delivery_timeout_ms=15_000,
        retries=100,
        metadata_timeout_ms=3_000,
    )
    while True:
        try:
            await producer.start()
            break
        except (ConnectionError, OSError):
            await asyncio.sleep(0.2)
    counter = iter(range(10**12))

    async def lane(partition: int) -> None:
        """One partition's writes: a stalled partition holds up only its own lane."""
        while not stop.is_set():
            values = [f"{tag}-{next(counter)}" for _ in range(CHUNK)]
            futures = []
            for value in values:
                log.write(f"S {value}")
                try:
                    futures.append(await producer.send(topic, value.encode(), partition=partition))
                except Exception as exc:  # every failure is logged, none hidden
                    futures.append(exc)
            for value, future in zip(values, futures, strict=True):
                if isinstance(future, Exception):
                    log.write(f"E {value} {type(future).__name__}")
                    continue
                try:
                    meta = await future
                except Exception as exc:
                    log.write(f"E {value} {type(exc).__name__}")
                else:
                    log.write(f"A {value} {meta.partition} {meta.offset}")
            await asyncio.sleep(PAUSE)

    while True:
        try:
            partitions = await producer.partitions_for(topic)
            break
        except Exception:  # the cluster may be down just now: try again
            await asyncio.sleep(0.2)
    await asyncio.gather(*(lane(p) for p in partitions))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(producer.close(), 20)


async def consume(bootstrap: str, topic: str, log_path: Path) -> None:
    log = _Log(log_path)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    while True:
        consumer = Consumer(bootstrap, auto_offset_reset="earliest", request_timeout_ms=3_000)
        try:
            await consumer.start()
            await consumer.subscribe(topic)
            break
        except Exception:  # the cluster may be down just now: try again
            await consumer.close()
            await asyncio.sleep(0.2)
    while not stop.is_set():
        try:
            records = await consumer.getmany(timeout_ms=200)
        except Exception as exc:  # a fault can fail a fetch; go on reading
            log.write(f"X {type(exc).__name__}")
            await asyncio.sleep(0.2)
            continue
        for record in records:
            value = (record.value or b"").decode()
            log.write(f"R {record.partition} {record.offset} {value}")
    await consumer.close()


def main(argv: list[str]) -> None:
    kind, bootstrap, topic, log_path = argv[:4]
    if kind == "produce":
        asyncio.run(produce(bootstrap, topic, Path(log_path), argv[4]))
    elif kind == "consume":
        asyncio.run(consume(bootstrap, topic, Path(log_path)))
    else:
        raise SystemExit(f"unknown worker kind {kind!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
