"""Source options, with the names Spark's Kafka source users already know.

Parsed once into a frozen dataclass so a bad option fails the query at planning time with a
message naming it, and so readers (which Spark pickles to executors) carry plain values only.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

from laminar.client.connection import Credentials, credentials_of
from laminar.client.types import DEFAULT_BOOTSTRAP, parse_bootstrap
from laminar.tls import client_context

EARLIEST = -2
LATEST = -1

DEFAULT_FETCH_BYTES = 8 * 1024 * 1024
"""Large enough that per-request costs vanish against the bytes; a task holds about three
fetches' worth of frames (two windows ahead, one being decoded)."""

OffsetSpec = str | dict[str, dict[int, int]]
"""'earliest', 'latest', or {topic: {partition: offset}} with -2 earliest and -1 latest."""


class OptionError(ValueError):
    """An option is missing, malformed or contradicts another one."""


@dataclass(frozen=True, slots=True)
class SourceOptions:
    bootstrap: tuple[str, ...]
    topics: tuple[str, ...]
    """Subscribed topics (``topic``/``subscribe``); empty when ``assign`` is used."""
    assign: tuple[tuple[str, int], ...]
    """Fixed (topic, partition) pairs from ``assign``; empty when subscribing."""
    starting: OffsetSpec | None
    ending: OffsetSpec
    starting_timestamp: int | None
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay_ms: int
    fail_on_data_loss: bool
    include_headers: bool
    min_partitions: int | None
    max_records_per_partition: int
    fetch_max_bytes: int
    prefetch_windows: int
    request_timeout_ms: int
    read_retry_timeout_ms: int
    group_id: str | None = None
    """``groupId``: after each micro-batch, its end offsets become this consumer group's
    committed offsets, so `laminar group describe` shows the query's lag (Spark's checkpoint
    stays the source of truth)."""
    tls_ca: str | None = None
    """``tlsCa``: connect with TLS, trusting nodes signed by this CA file (PEM)."""
    tls_cert: str | None = None
    """``tlsCert``/``tlsKey``: client certificate and key, for nodes requiring one."""
    tls_key: str | None = None
    user: str | None = None
    """``user``/``password``: authenticate (SCRAM-SHA-256) on a cluster with users."""
    password: str | None = field(default=None, repr=False)

    def credentials(self) -> Credentials | None:
        return credentials_of(self.user, self.password)

    def login(self) -> dict[str, str | None]:
        """``username``/``password`` keyword arguments of the client classes."""
        return {"username": self.user, "password": self.password}

    def ssl_context(self) -> ssl.SSLContext | None:
        """Built where it is used (driver, each executor): contexts do not pickle."""
        if self.tls_ca is None:
            return None
        return client_context(self.tls_ca, self.tls_cert, self.tls_key)

    @property
    def topic_names(self) -> tuple[str, ...]:
        """Every topic the query reads, subscribed or assigned."""
        if self.topics:
            return self.topics
        return tuple(sorted({topic for topic, _ in self.assign}))


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {key.lower(): value for key, value in options.items()}


def _int(opts: dict[str, str], name: str, default: int | None, *, minimum: int) -> int | None:
    raw = opts.get(name.lower())
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise OptionError(f"option {name} must be >= {minimum}, got {value}")
    return value


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name} must be true or false, got {raw!r}")


def _topics(raw: str) -> tuple[str, ...]:
    topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
    if not topics:
        raise OptionError("option subscribe/topic names no topic")
    return topics


def _assign(raw: str) -> tuple[tuple[str, int], ...]:
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f'option assign must be JSON like {{"t": [0, 1]}}: {exc}') from None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError('option assign must be a JSON object like {"t": [0, 1]}')
    pairs: set[tuple[str, int]] = set()
    for topic, partitions in parsed.items():
        if not isinstance(partitions, list) or not all(
            isinstance(p, int) and p >= 0 for p in partitions
        ):
            raise OptionError(f"option assign: partitions of {topic!r} must be a list of ints")
        pairs.update((topic, p) for p in partitions)
    return tuple(sorted(pairs))


def parse_offset_spec(name: str, raw: str) -> OffsetSpec:
    """'earliest' | 'latest' | JSON {topic: {partition: offset}}, checked."""
    lowered = raw.strip().lower()
    if lowered in ("earliest", "latest"):
        return lowered
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        raise OptionError(
            f"option {name} must be earliest, latest or JSON like "
            f'{{"topic": {{"0": 23, "1": -2}}}}, got {raw!r}'
        ) from None
    if not isinstance(parsed, dict):
        raise OptionError(f"option {name} must be a JSON object of topics")
    spec: dict[str, dict[int, int]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise OptionError(f"option {name}: {topic!r} must map partitions to offsets")
        spec[topic] = {}
        for partition, offset in partitions.items():
            try:
                number = int(partition)
            except ValueError:
                raise OptionError(f"option {name}: bad partition {partition!r}") from None
            if not isinstance(offset, int) or offset < EARLIEST:
                raise OptionError(
                    f"option {name}: offset of {topic}/{partition} must be an integer >= -2"
                )
            spec[topic][number] = offset
    return spec


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate Spark's option map (keys are case-insensitive, as in Spark)."""
    opts = _lower(options)
    given = [name for name in ("topic", "subscribe", "assign") if opts.get(name)]
    if len(given) != 1:
        raise OptionError(
            "give exactly one of the options topic/subscribe (comma list) or assign (JSON)"
            + (f"; got {', '.join(given)}" if given else "")
        )
    topics: tuple[str, ...] = ()
    assign: tuple[tuple[str, int], ...] = ()
    if given[0] == "assign":
        assign = _assign(opts["assign"])
    else:
        topics = _topics(opts[given[0]])
    try:
        bootstrap = tuple(parse_bootstrap(opts.get("bootstrap", DEFAULT_BOOTSTRAP)))
    except ValueError as exc:
        raise OptionError(f"option bootstrap: {exc}") from None
    starting = opts.get("startingoffsets")
    ending = parse_offset_spec("endingOffsets", opts.get("endingoffsets", "latest"))
    if ending == "earliest":
        raise OptionError("endingOffsets=earliest makes an empty query; use latest or JSON")
    max_offsets = _int(opts, "maxOffsetsPerTrigger", None, minimum=1)
    min_offsets = _int(opts, "minOffsetsPerTrigger", None, minimum=1)
    if bool(opts.get("tlscert")) != bool(opts.get("tlskey")):
        raise OptionError("options tlsCert and tlsKey go together")
    if opts.get("tlscert") and not opts.get("tlsca"):
        raise OptionError("option tlsCert needs tlsCa")
    if bool(opts.get("user")) != bool(opts.get("password")):
        raise OptionError("options user and password go together")
    if max_offsets is not None and min_offsets is not None and min_offsets > max_offsets:
        raise OptionError("minOffsetsPerTrigger must not be larger than maxOffsetsPerTrigger")
    return SourceOptions(
        bootstrap=bootstrap,
        topics=topics,
        assign=assign,
        starting=None if starting is None else parse_offset_spec("startingOffsets", starting),
        ending=ending,
        starting_timestamp=_int(opts, "startingTimestamp", None, minimum=0),
        max_offsets_per_trigger=max_offsets,
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay_ms=_duration_ms(opts.get("maxtriggerdelay", "15m")),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        include_headers=_bool(opts, "includeHeaders", False),
        min_partitions=_int(opts, "minPartitions", None, minimum=1),
        max_records_per_partition=_int(opts, "maxRecordsPerPartition", 1_000_000, minimum=1)
        or 1_000_000,
        fetch_max_bytes=_int(opts, "fetchMaxBytes", DEFAULT_FETCH_BYTES, minimum=1024)
        or DEFAULT_FETCH_BYTES,
        prefetch_windows=_int(opts, "prefetchWindows", 2, minimum=1) or 2,
        request_timeout_ms=_int(opts, "requestTimeoutMs", 30_000, minimum=100) or 30_000,
        read_retry_timeout_ms=_int(opts, "readRetryTimeoutMs", 60_000, minimum=0) or 0,
        group_id=opts.get("groupid") or None,
        tls_ca=opts.get("tlsca") or None,
        tls_cert=opts.get("tlscert") or None,
        tls_key=opts.get("tlskey") or None,
        user=opts.get("user") or None,
        password=opts.get("password") or None,
    )


_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}


def _duration_ms(raw: str) -> int:
    """'15m', '30s', '500ms' or a plain number of milliseconds."""
    text = raw.strip().lower()
    for unit in sorted(_UNITS_MS, key=len, reverse=True):
        if text.endswith(unit) and text[: -len(unit)].strip().isdigit():
            return int(text[: -len(unit)]) * _UNITS_MS[unit]
    if text.isdigit():
        return int(text)
    raise OptionError(f"option maxTriggerDelay must be a duration like 15m or 30s, got {raw!r}")
