"""Has the machine rebooted since the node last started on its data directory?

After a process dies (SIGKILL, a crash) the kernel's page cache still holds every write the
process completed, so a restart in the same boot finds each log exactly as it was written: at
most the last batch is cut short, by a write the death interrupted. Only a power cut or a
kernel crash (a new boot) can leave an unsynced tail holding garbage. So recovery on the same
boot walks the batch headers after a log's last index entry instead of reading and crc-checking
every byte there (``PartitionLog.open(same_boot=True)``); reads still check each batch the
first time they serve it. At 10,000 partitions holding 10 GiB that read was the whole restart.

The node notes the boot it runs in once the replicas it found are open (a restart killed while
still checking them must check them again); a marker from another boot, or none, means check.
"""

from __future__ import annotations

from pathlib import Path

from laminar.segment.fileio import write_atomic

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
MARKER = "boot-id"


def current_boot() -> bytes | None:
    """This boot's id (Linux), or None where the kernel does not tell."""
    try:
        boot = BOOT_ID.read_bytes().strip()
    except OSError:
        return None
    return boot or None


def same_boot(data_dir: Path) -> bool:
    """Whether the node last started on ``data_dir`` in this boot, with its replicas opened."""
    boot = current_boot()
    if boot is None:
        return False
    try:
        return (data_dir / MARKER).read_bytes() == boot
    except OSError:
        return False


def note_boot(data_dir: Path) -> None:
    """Record this boot for the next start."""
    boot = current_boot()
    if boot is not None:
        write_atomic(data_dir / MARKER, boot)
