"""Run one node in the foreground: uvloop, structured logs, graceful stop on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
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
    await node.stop()


def run(config: NodeConfig) -> None:
    configure_logging(config.log_format, config.log_level)
    uvloop.run(serve(config))
