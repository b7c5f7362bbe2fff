"""The Kafka listener's node options."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar.node.config import NodeConfig
from laminar.tls import SecurityConfig


def test_kafka_advertise_defaults_to_the_listen_address(tmp_path: Path) -> None:
    config = NodeConfig(1, tmp_path, kafka_listen="127.0.0.1:9094")
    assert config.kafka_advertise == "127.0.0.1:9094"
    open_port = SecurityConfig(insecure=True)  # a plain port on every interface
    config = NodeConfig(
        1, tmp_path, kafka_listen="0.0.0.0:9094", kafka_advertise="h:9094", security=open_port
    )
    assert config.kafka_advertise == "h:9094"
    with pytest.raises(ValueError, match="Kafka port"):
        NodeConfig(1, tmp_path, kafka_listen="0.0.0.0:9094", kafka_advertise="h:9094")
    assert NodeConfig(1, tmp_path).kafka_listen == ""


def test_kafka_listen_on_every_interface_needs_an_advertised_address(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="kafka-advertise"):
        NodeConfig(1, tmp_path, kafka_listen="0.0.0.0:9094")
    with pytest.raises(ValueError):
        NodeConfig(1, tmp_path, kafka_listen="127.0.0.1:9094", kafka_advertise="no-port")
