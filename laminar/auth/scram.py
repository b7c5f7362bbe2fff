"""SASL SCRAM-SHA-256 (RFC 5802, RFC 7677), sans-I/O: bytes in, bytes out.

The same exchange serves the native port (carried in ``saslAuthenticate`` requests) and the
Kafka port (SaslAuthenticate). The server only ever holds a ``ScramCredential`` (salt,
iterations, StoredKey, ServerKey): the password never leaves the client, and a stolen
credential does not let anyone log in (it lacks ClientKey). No channel binding (``n,,`` /
``y,,``): TLS, when on, protects the connection itself.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from laminar.errors import AuthenticationError

MECHANISM = "SCRAM-SHA-256"
MIN_ITERATIONS = 4096
"""RFC 7677's minimum, and Kafka's."""
DEFAULT_ITERATIONS = 4096
MAX_ITERATIONS = 1 << 20
"""A server-chosen iteration count a client agrees to compute (a hostile server must not make
the client spin for minutes)."""
NONCE_BYTES = 24


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What a server stores for one user (RFC 5802 section 3)."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "salt": _b64(self.salt),
            "iterations": self.iterations,
            "stored_key": _b64(self.stored_key),
            "server_key": _b64(self.server_key),
        }

    @classmethod
    def from_json(cls, value: Any) -> ScramCredential:
        """InvalidRequestError-free: AuthenticationError for anything malformed, since a
        credential only ever comes from a client or the metadata log."""
        try:
            credential = cls(
                base64.b64decode(value["salt"], validate=True),
                int(value["iterations"]),
                base64.b64decode(value["stored_key"], validate=True),
                base64.b64decode(value["server_key"], validate=True),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise AuthenticationError(f"malformed SCRAM credential: {exc}") from None
        credential.check()
        return credential

    def check(self) -> None:
        """Refuse credentials no client could have made honestly."""
        if not MIN_ITERATIONS <= self.iterations <= MAX_ITERATIONS:
            raise AuthenticationError(
                f"SCRAM iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}"
            )
        if not 8 <= len(self.salt) <= 64:
            raise AuthenticationError("a SCRAM salt is 8 to 64 bytes")
        if len(self.stored_key) != 32 or len(self.server_key) != 32:
            raise AuthenticationError("SCRAM-SHA-256 keys are 32 bytes")


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)


def make_credential(
    password: str, *, salt: bytes | None = None, iterations: int = DEFAULT_ITERATIONS
) -> ScramCredential:
    """Derive a stored credential from a password (on the client, or the node for its own
    internal user); a fresh random salt unless one is given."""
    if not password:
        raise ValueError("the password must not be empty")
    salt = os.urandom(16) if salt is None else salt
    return credential_from_salted(salt, iterations, salted_password(password, salt, iterations))


def credential_from_salted(salt: bytes, iterations: int, salted: bytes) -> ScramCredential:
    """The stored credential from a SaltedPassword (what Kafka's AlterUserScramCredentials
    sends); AuthenticationError if it is out of bounds."""
    client_key = _hmac(salted, b"Client Key")
    credential = ScramCredential(
        salt, iterations, hashlib.sha256(client_key).digest(), _hmac(salted, b"Server Key")
    )
    credential.check()
    return credential


Lookup = Callable[[str], ScramCredential | None]


class ScramServer:
    """One server side of an exchange: ``step`` takes the client-first message and answers
    server-first, then takes client-final and answers server-final; ``username`` is set once
    ``done``. Any failure raises AuthenticationError and the exchange cannot continue."""

    def __init__(self, lookup: Lookup, *, nonce: str | None = None) -> None:
        self._lookup = lookup
        self._nonce = nonce or _nonce()
        self._stage = 0
        self._credential: ScramCredential | None = None
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2 = ""
        self._user = ""
        self.username: str | None = None
        """The authenticated user (None until ``done``)."""

    @property
    def done(self) -> bool:
        return self.username is not None

    def step(self, token: bytes) -> bytes:
        try:
            if self._stage == 0:
                return self._first(token)
            if self._stage == 1:
                return self._final(token)
        except AuthenticationError:
            self._stage = 3
            raise
        raise AuthenticationError("the SCRAM exchange is over")

    def _first(self, token: bytes) -> bytes:
        text = _text(token)
        gs2_flag, sep, rest = text.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not sep or not sep2 or gs2_flag not in ("n", "y"):
            raise AuthenticationError(
                "malformed SCRAM client-first message (channel binding is not supported)"
            )
        if authzid and not authzid.startswith("a="):
            raise AuthenticationError("malformed SCRAM authzid")
        attrs = _attributes(bare)
        if "m" in attrs:
            raise AuthenticationError("SCRAM extensions (m=) are not supported")
        user = _unescape(attrs.get("n", ""))
        client_nonce = attrs.get("r", "")
        if not user or not client_nonce:
            raise AuthenticationError("SCRAM client-first message lacks a user or a nonce")
        if authzid and _unescape(authzid[2:]) != user:
            raise AuthenticationError("SCRAM authzid must be the user itself")
        credential = self._lookup(user)
        if credential is None:
            raise AuthenticationError(
                f"authentication failed for user {user!r}: unknown user or wrong password"
            )
        self._user, self._credential = user, credential
        self._gs2 = f"{gs2_flag},{authzid},"
        self._client_first_bare = bare
        nonce = client_nonce + self._nonce
        self._server_first = f"r={nonce},s={_b64(credential.salt)},i={credential.iterations}"
        self._stage = 1
        return self._server_first.encode()

    def _final(self, token: bytes) -> bytes:
        assert self._credential is not None
        text = _text(token)
        without_proof, sep, proof_part = text.rpartition(",p=")
        if not sep:
            raise AuthenticationError("SCRAM client-final message lacks a proof")
        attrs = _attributes(without_proof)
        if attrs.get("c") != _b64(self._gs2.encode()):
            raise AuthenticationError("SCRAM channel binding data does not match")
        if attrs.get("r") != _attributes(self._server_first)["r"]:
            raise AuthenticationError("SCRAM nonce does not match")
        try:
            proof = base64.b64decode(proof_part, validate=True)
        except ValueError:
            raise AuthenticationError("SCRAM proof is not base64") from None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = _hmac(self._credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise AuthenticationError("SCRAM proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(
            hashlib.sha256(client_key).digest(), self._credential.stored_key
        ):
            raise AuthenticationError(
                f"authentication failed for user {self._user!r}: unknown user or wrong password"
            )
        self._stage = 2
        self.username = self._user
        return f"v={_b64(_hmac(self._credential.server_key, auth_message))}".encode()


class ScramClient:
    """The client side: ``first()``, then ``final(server_first)``, then ``verify(server_final)``
    (which proves the server knew the user's credential)."""

    def __init__(self, username: str, password: str, *, nonce: str | None = None) -> None:
        if not username or not password:
            raise ValueError("SCRAM needs a user name and a password")
        self.username = username
        self._password = password
        self._nonce = nonce or _nonce()
        self._bare = f"n={_escape(username)},r={self._nonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self._bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = _text(server_first)
        attrs = _attributes(text)
        if "e" in attrs:
            raise AuthenticationError(f"server refused SCRAM: {attrs['e']}")
        nonce = attrs.get("r", "")
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise AuthenticationError("server's SCRAM nonce does not extend the client's")
        try:
            salt = base64.b64decode(attrs["s"], validate=True)
            iterations = int(attrs["i"])
        except (KeyError, ValueError):
            raise AuthenticationError("malformed SCRAM server-first message") from None
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise AuthenticationError(f"server asks for {iterations} SCRAM iterations")
        salted = salted_password(self._password, salt, iterations)
        client_key = _hmac(salted, b"Client Key")
        without_proof = f"c={_b64(b'n,,')},r={nonce}"
        auth_message = f"{self._bare},{text},{without_proof}".encode()
        signature = _hmac(hashlib.sha256(client_key).digest(), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = _hmac(_hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={_b64(proof)}".encode()

    def verify(self, server_final: bytes) -> None:
        attrs = _attributes(_text(server_final))
        if "e" in attrs:
            raise AuthenticationError(f"server refused SCRAM: {attrs['e']}")
        try:
            signature = base64.b64decode(attrs.get("v", ""), validate=True)
        except ValueError:
            signature = b""
        if not self._server_signature or not hmac.compare_digest(signature, self._server_signature):
            raise AuthenticationError("the server's SCRAM signature is wrong (not our cluster?)")


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _nonce() -> str:
    return base64.b64encode(os.urandom(NONCE_BYTES)).decode().replace(",", "-")


def _text(token: bytes) -> str:
    try:
        return bytes(token).decode()
    except UnicodeDecodeError:
        raise AuthenticationError("a SCRAM message is UTF-8 text") from None


def _attributes(text: str) -> dict[str, str]:
    """``a=1,b=2`` -> {"a": "1", "b": "2"}; AuthenticationError on anything else."""
    out: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise AuthenticationError(f"malformed SCRAM attribute {part[:40]!r}")
        out.setdefault(key, value)
    return out


def _escape(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _unescape(name: str) -> str:
    return name.replace("=2C", ",").replace("=3D", "=")
