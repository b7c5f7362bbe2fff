"""The boot marker (``laminar.node.boot``): a restart trusts its logs' tails as written only
in the boot the node last started in, with every replica it found opened."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar.node import boot


def test_only_a_marker_of_this_boot_means_the_same_boot(tmp_path: Path) -> None:
    assert not boot.same_boot(tmp_path)  # a first start
    boot.note_boot(tmp_path)
    assert boot.same_boot(tmp_path)
    (tmp_path / boot.MARKER).write_bytes(b"an-id-of-another-boot")  # the machine rebooted
    assert not boot.same_boot(tmp_path)


def test_without_a_boot_id_every_start_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(boot, "BOOT_ID", tmp_path / "no-such-file")
    boot.note_boot(tmp_path)
    assert not (tmp_path / boot.MARKER).exists()
    assert not boot.same_boot(tmp_path)
