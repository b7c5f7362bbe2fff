"""Logging for the client library and the Spark source: through the standard ``logging``
module, under the ``laminar`` logger, never printed by the library itself.

A library must leave output to the application: ``structlog.get_logger`` would print to stdout
unless the application configured structlog, so library modules take their logger from
``get_logger`` here instead. Calls keep structlog's style (``log.warning("batch failed",
error=...)``); a record's message is the event followed by its fields (``batch failed
error='...'``). Nothing is emitted unless the application configures ``logging`` (a
``NullHandler`` on ``laminar`` keeps Python's last-resort handler from writing warnings to
stderr), and a call below the logger's level costs no formatting.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

ROOT = "laminar"
logging.getLogger(ROOT).addHandler(logging.NullHandler())


def _message(_logger: Any, _method: str, event: dict[str, Any]) -> str:
    text = str(event.pop("event", ""))
    fields = " ".join(f"{key}={value!r}" for key, value in event.items())
    return f"{text} {fields}" if fields else text


def get_logger(module: str) -> Any:
    """The logger of library module ``module`` (its ``__name__``), under ``laminar``."""
    name = module if module == ROOT or module.startswith(ROOT + ".") else f"{ROOT}.{module}"
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=[structlog.stdlib.filter_by_level, _message],
        wrapper_class=structlog.stdlib.BoundLogger,
    )
