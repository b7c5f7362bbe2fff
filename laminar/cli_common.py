"""What every command module shares and that imports no client: the one-line error for a
mistake the user can fix, and the parsing of sizes and durations. ``laminar node start`` runs
with this alone (``cli_node.py``)."""

from __future__ import annotations

from typing import NoReturn

import typer


class UserError(Exception):
    """A mistake the user can fix; printed as one line, no traceback."""


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


DURATION_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """'500ms', '30s', '15m', '12h', '7d' or plain milliseconds -> ms; UserError otherwise."""
    text = text.strip().lower()
    for unit in sorted(DURATION_UNITS, key=len, reverse=True):
        number = text.removesuffix(unit)
        if number != text:
            break
    else:
        unit, number = "ms", text
    try:
        value = float(number)
    except ValueError:
        raise UserError(
            f"{text!r} is not a duration (examples: 500ms, 30s, 15m, 12h, 7d)"
        ) from None
    if value < 0:
        raise UserError(f"duration {text!r} is negative")
    return int(value * DURATION_UNITS[unit])


def parse_retention(text: str) -> int:
    """A retention option: a duration, or 'forever' (-1, the wire's keep-forever value)."""
    if text.strip().lower() in ("forever", "infinite", "none", "-1"):
        return -1
    value = parse_duration_ms(text)
    if value == 0:
        raise UserError("retention must be positive (or 'forever')")
    return value


def parse_size(text: str) -> int:
    """'512', '64k', '16MiB', '1g' -> bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    cleaned = text.strip().lower().removesuffix("ib").removesuffix("b")
    multiplier = 1
    if cleaned and cleaned[-1] in units:
        multiplier = units[cleaned[-1]]
        cleaned = cleaned[:-1]
    try:
        value = int(float(cleaned) * multiplier)
    except ValueError:
        raise UserError(f"{text!r} is not a size (examples: 1048576, 64k, 16MiB, 1g)") from None
    if value <= 0:
        raise UserError(f"size {text!r} must be positive")
    return value
