"""`laminar user ...`: create, change the password of, delete and list users.

Registered on the main app by laminar/cli.py. Once the cluster has a user every client must
authenticate; the first user must be a superuser (`--superuser`). Passwords are read from
stdin (`--password-stdin`), an option, or a prompt; only their SCRAM-SHA-256 credential is
sent to the cluster.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from laminar.cli import DEFAULT_BOOTSTRAP, Bootstrap, render_table, run
from laminar.cli_auth import client_options
from laminar.client import Admin, UserDescription

user_app = typer.Typer(
    help="Create, delete and list users (SASL/SCRAM-SHA-256).",
    no_args_is_help=True,
    rich_markup_mode=None,
)

NewPassword = Annotated[
    str | None,
    typer.Option("--password", help="The user's password (else --password-stdin or a prompt)."),
]
PasswordStdin = Annotated[
    bool, typer.Option("--password-stdin", help="Read the password from the first stdin line.")
]


def new_password(name: str, password: str | None, from_stdin: bool) -> str:
    """The password given, read from stdin, or prompted for (twice)."""
    if password is not None and from_stdin:
        raise typer.BadParameter("--password and --password-stdin exclude each other")
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif password is None:
        password = typer.prompt(
            f"new password for {name}", hide_input=True, confirmation_prompt=True, err=True
        )
    if not password:
        raise typer.BadParameter("the password must not be empty")
    return password


@user_app.command("create")
def user_create(
    name: str,
    password: NewPassword = None,
    password_stdin: PasswordStdin = False,
    superuser: Annotated[
        bool, typer.Option("--superuser", help="May do anything, incl. users and ACLs.")
    ] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Create a user. The first user must be a superuser: from then on every client
    authenticates (`laminar --user NAME ...`, LAMINAR_USER/LAMINAR_PASSWORD)."""
    secret = new_password(name, password, password_stdin)

    async def go() -> None:
        async with Admin(bootstrap, **client_options()) as admin:
            await admin.create_user(name, secret, superuser=superuser)

    run(go)
    typer.echo(f"created user {name}" + (" (superuser)" if superuser else ""))


@user_app.command("passwd")
def user_passwd(
    name: str,
    password: NewPassword = None,
    password_stdin: PasswordStdin = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Change a user's password (connections already open stay authenticated)."""
    secret = new_password(name, password, password_stdin)

    async def go() -> None:
        async with Admin(bootstrap, **client_options()) as admin:
            await admin.change_password(name, secret)

    run(go)
    typer.echo(f"changed the password of {name}")


@user_app.command("delete")
def user_delete(name: str, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> None:
    """Delete a user and its ACLs. Deleting the last user opens the cluster again."""

    async def go() -> None:
        async with Admin(bootstrap, **client_options()) as admin:
            await admin.delete_user(name)

    run(go)
    typer.echo(f"deleted user {name}")


@user_app.command("list")
def user_list(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> None:
    """List users (names and roles; credentials are never shown)."""

    async def go() -> list[UserDescription]:
        async with Admin(bootstrap, **client_options()) as admin:
            return await admin.list_users()

    users = run(go)
    if not users:
        typer.echo("no users: the cluster is open to every client")
        return
    rows = [["USER", "ROLE", "MECHANISM"]]
    rows += [
        [u.name, "superuser" if u.superuser else "user", f"SCRAM-SHA-256 ({u.iterations})"]
        for u in users
    ]
    typer.echo(render_table(rows))
