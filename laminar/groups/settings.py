"""Node options for consumer groups (``laminar node start --group-...``)."""

from __future__ import annotations

from dataclasses import dataclass

from laminar.groups.classic import ClassicConfig
from laminar.groups.coordinator import CoordinatorConfig


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """Node options for consumer groups (``laminar node start --group-...``)."""

    partitions: int = 8
    replication_factor: int = 3
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    segment_bytes: int = 8 * 1024 * 1024
    checkpoint_min_records: int = 10_000
    request_timeout_ms: int = 10_000
    classic_initial_rebalance_delay_ms: int = 3_000
    classic_min_session_timeout_ms: int = 6_000
    classic_max_session_timeout_ms: int = 1_800_000

    def __post_init__(self) -> None:
        if self.partitions < 1 or self.replication_factor < 1:
            raise ValueError("the group topic needs at least one partition and one replica")
        self.coordinator_config()  # checks the timeouts

    def coordinator_config(self) -> CoordinatorConfig:
        return CoordinatorConfig(
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            offsets_retention_ms=self.offsets_retention_ms,
            rack_aware=True,  # without racks (no --rack) this changes nothing
            classic=ClassicConfig(
                min_session_timeout_ms=self.classic_min_session_timeout_ms,
                max_session_timeout_ms=self.classic_max_session_timeout_ms,
                initial_rebalance_delay_ms=self.classic_initial_rebalance_delay_ms,
            ),
        )
