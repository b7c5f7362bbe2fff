"""The login options of client commands: ``--user``/``--password`` before the command name,
or ``LAMINAR_USER``/``LAMINAR_PASSWORD``: ``laminar --user root topic list``. Needed once the
cluster has users (SASL/SCRAM-SHA-256, laminar/auth); ``client_options`` adds them, and the
TLS context (laminar/cli_tls.py), to every client the commands make."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from laminar.cli_tls import client_ssl

_login: dict[str, str | None] = {"username": None, "password": None}

User = Annotated[
    str | None,
    typer.Option(
        "--user",
        envvar="LAMINAR_USER",
        help="Authenticate as this user (clusters with users; SCRAM-SHA-256).",
    ),
]
Password = Annotated[
    str | None,
    typer.Option(
        "--password",
        envvar="LAMINAR_PASSWORD",
        help="Password of --user (prefer the LAMINAR_PASSWORD environment variable).",
    ),
]


def set_client_login(user: str | None, password: str | None) -> None:
    """Remember the global login options (the app callback calls this for every command, so
    nothing is asked here: `laminar node start` must not prompt for a client password)."""
    if password and not user:
        raise typer.BadParameter("--password needs --user")
    _login["username"], _login["password"] = user or None, password or None


def client_options() -> dict[str, Any]:
    """Keyword arguments for Admin/Producer/Consumer/ShareConsumer: TLS and login (the
    password is prompted for, once, if --user came without one)."""
    user = _login["username"]
    if user and not _login["password"]:
        if not sys.stdin.isatty():
            raise ValueError(f"--user {user} needs --password (or LAMINAR_PASSWORD)")
        _login["password"] = typer.prompt(f"password for {user}", hide_input=True, err=True)
    return {"ssl": client_ssl(), **_login}
