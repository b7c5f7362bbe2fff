"""Gossip keyring: authenticates (HMAC-SHA256) or encrypts (AES-GCM) every SWIM datagram.

As in memberlist, a keyring holds several keys: every key is accepted, the first one is used to
send. Rotation without downtime: add the new key everywhere (second position), then make it
first everywhere, then remove the old one. A keyring given as a file (one base64 key per line)
is re-read when the file changes, so the steps need no restart.

A sealed datagram is ``b"LG" + version + mode`` followed by, for mode 1 (HMAC), the frame and a
32-byte HMAC-SHA256 over header and frame, or for mode 2 (AES-GCM), a 12-byte random nonce and
the encrypted frame with its 16-byte tag (header as associated data). A datagram that is not
sealed with one of the keys raises ``ProtocolError``; the driver drops and counts it.

Replays are not detected here: a captured datagram re-sent later carries the incarnations it
had, and SWIM ignores news older than what a member already knows (only the member itself
raises its incarnation). A replay within the same incarnation repeats news already known.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Sequence
from pathlib import Path

import structlog

from laminar.errors import ProtocolError

log = structlog.get_logger(__name__)

MAGIC = b"LG"
VERSION = 1
MODE_HMAC = 1
MODE_AES_GCM = 2
TAG_BYTES = 32
NONCE_BYTES = 12
OVERHEAD = 4 + max(TAG_BYTES, NONCE_BYTES + 16)
"""Bytes a sealed datagram adds to the frame it carries."""
MIN_KEY_BYTES = 16


def parse_key(text: str) -> bytes:
    """A base64 key of 16, 24 or 32 bytes (AES-128/192/256; any of them for HMAC)."""
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a gossip key is base64 (e.g. `openssl rand -base64 32`)") from None
    if len(key) not in (16, 24, 32):
        raise ValueError(f"a gossip key is 16, 24 or 32 bytes, not {len(key)}")
    return key


def read_key_file(path: Path) -> list[bytes]:
    """Keys of a keyring file: one base64 key per line, first used to send; # comments."""
    lines = path.read_text().splitlines()
    return [parse_key(line) for line in lines if line.strip() and not line.startswith("#")]


class Keyring:
    """The keys a node accepts gossip under, and how it seals its own datagrams."""

    def __init__(
        self, keys: Sequence[bytes] = (), *, encrypt: bool = False, path: Path | None = None
    ) -> None:
        self.encrypt = encrypt
        self.path = path
        self._mtime: float | None = None
        self._keys: list[bytes] = []
        self._aead: list[object] = []
        self.install([*keys, *(read_key_file(path) if path else [])])
        if path is not None:
            self._mtime = path.stat().st_mtime

    @property
    def keys(self) -> list[bytes]:
        return list(self._keys)

    def install(self, keys: Sequence[bytes]) -> None:
        """Replace the keys (first one sends); at least one is needed."""
        if not keys:
            raise ValueError("a gossip keyring needs at least one key")
        for key in keys:
            if len(key) < MIN_KEY_BYTES:
                raise ValueError(f"a gossip key is at least {MIN_KEY_BYTES} bytes")
        self._aead = []
        if self.encrypt:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            self._aead = [AESGCM(key) for key in keys]
        self._keys = list(keys)

    def reload_if_changed(self) -> bool:
        """Re-read the keyring file if it changed; a broken file keeps the old keys."""
        if self.path is None:
            return False
        try:
            mtime = self.path.stat().st_mtime
            if mtime == self._mtime:
                return False
            self._mtime = mtime
            self.install(read_key_file(self.path))
        except (OSError, ValueError) as exc:
            log.warning("gossip keyring not reloaded", path=str(self.path), error=str(exc))
            return False
        log.info("gossip keyring reloaded", path=str(self.path), keys=len(self._keys))
        return True

    def seal(self, frame: bytes) -> bytes:
        if self.encrypt:
            header = MAGIC + bytes((VERSION, MODE_AES_GCM))
            nonce = os.urandom(NONCE_BYTES)
            return header + nonce + self._aead[0].encrypt(nonce, frame, header)  # type: ignore[attr-defined]
        header = MAGIC + bytes((VERSION, MODE_HMAC))
        tag = hmac.new(self._keys[0], header + frame, hashlib.sha256).digest()
        return header + frame + tag

    def open(self, data: bytes) -> bytes:
        """The frame inside a sealed datagram; ProtocolError unless one of our keys sealed it."""
        if len(data) < 4 or data[:2] != MAGIC or data[2] != VERSION:
            raise ProtocolError("gossip datagram is not sealed with a cluster key")
        header, mode = data[:4], data[3]
        if mode == MODE_HMAC:
            if len(data) < 4 + TAG_BYTES:
                raise ProtocolError("sealed gossip datagram too short")
            body, tag = data[4:-TAG_BYTES], data[-TAG_BYTES:]
            for key in self._keys:
                expected = hmac.new(key, header + body, hashlib.sha256).digest()
                if hmac.compare_digest(expected, tag):
                    return body
            raise ProtocolError("gossip datagram fails authentication (unknown key or forged)")
        if mode == MODE_AES_GCM:
            if len(data) < 4 + NONCE_BYTES + 16:
                raise ProtocolError("encrypted gossip datagram too short")
            nonce, sealed = data[4 : 4 + NONCE_BYTES], data[4 + NONCE_BYTES :]
            aeads = self._aead or self._aeads_for_open()
            from cryptography.exceptions import InvalidTag

            for aead in aeads:
                try:
                    return aead.decrypt(nonce, sealed, header)  # type: ignore[attr-defined]
                except InvalidTag:
                    continue
            raise ProtocolError("encrypted gossip datagram fails authentication")
        raise ProtocolError(f"unknown gossip seal mode {mode}")

    def _aeads_for_open(self) -> list[object]:
        """An HMAC-sending keyring still reads encrypted datagrams (while a cluster switches
        encryption on node by node)."""
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aead = [AESGCM(key) for key in self._keys if len(key) in (16, 24, 32)]
        return self._aead
