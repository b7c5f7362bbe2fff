"""Run one node in the foreground: uvloop, structured logs, graceful stop on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import signal
import sys

import structlog
import uvloop

from laminar.node.config import NodeConfig
from laminar.node.node import Node


def configure_logging(log_format: str = "console", level: str = "info") -> None:
    """structlog to stderr, JSON lines or human-readable console."""
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if log_format == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


async def serve(config: NodeConfig) -> None:
    """Run until SIGTERM or SIGINT, then flush and close everything."""
    node = Node(config)
    await node.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    structlog.get_logger(__name__).info("shutting down", node_id=config.node_id)
    await node.shutdown()


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> None:
    """Have glibc keep freed memory for reuse instead of returning it to the kernel at once.

    Every fetch reads several MiB of batches into a new buffer. By default glibc maps blocks
    that large afresh and unmaps them when freed, so each fetch page-faults on every 4 KiB it
    fills: a third of a node's CPU while serving reads on this machine. A node's heap peaks
    at a few fetches in flight, so keeping that much around costs little. Elsewhere (musl,
    macOS) there is no mallopt and nothing changes.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 64 << 20)  # blocks below 64 MiB come from the heap
    mallopt(_M_TRIM_THRESHOLD, 256 << 20)  # which keeps up to 256 MiB free before trimming


def tune_gc() -> None:
    """Collect the old generation rarely, and never walk what start-up left behind.

    A node holds many long-lived objects (queue state keeps a slot per offset in flight, plus
    its lock heap), and the share-fetch path allocates a few tuples per offset. With CPython's
    defaults (700, 10, 10) full collections came every few hundred milliseconds under a share
    group's load and took a fifth of the partition leader's CPU (0.28 s of 2 s in
    ``bench/queue_bench.py`` with 300,000 messages). Reference cycles are still collected,
    just less often; young objects as cheaply as before.
    """
    gc.freeze()  # modules, schemas, config: never garbage, never walked again
    gc.set_threshold(20_000, 20, 20)


def raise_open_files_limit() -> None:
    """Raise the soft open-files limit to the hard one, as far as the process may: the node's
    budget of open log files (``segment/descriptors.py``) is half the soft limit, so a node
    hosting thousands of replicas keeps more of them open, and reopens fewer."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 1 << 20 if hard == resource.RLIM_INFINITY else hard  # (fs.nr_open's default)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def run(config: NodeConfig) -> None:
    tune_gc()
    keep_freed_memory()
    raise_open_files_limit()
    configure_logging(config.log_format, config.log_level)
    uvloop.run(serve(config))
