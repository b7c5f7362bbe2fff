"""`laminar acl ...`: add, remove and list the rules that allow users to produce, consume or
administer topics. Registered on the main app by laminar/cli.py.

A rule names a user (or `*` for every user), an operation (produce, consume, admin) and a
resource: one topic (`--topic`), topics with a name prefix (`--prefix`) or all
(`--all-topics`). Superusers need no rules.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Annotated

import typer

from laminar.cli import DEFAULT_BOOTSTRAP, Bootstrap, render_table, run
from laminar.cli_auth import client_options
from laminar.client import Acl, Admin

acl_app = typer.Typer(
    help="Allow users to produce, consume or administer topics.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


class Operation(StrEnum):
    produce = "produce"
    consume = "consume"
    admin = "admin"


Principal = Annotated[str, typer.Option("--user", "-u", help="A user name, or * for every user.")]
Op = Annotated[Operation, typer.Option("--op", help="What the rule allows.")]
Topic = Annotated[str | None, typer.Option("--topic", "-t", help="Exactly this topic.")]
Prefix = Annotated[str | None, typer.Option("--prefix", help="Topics starting with this.")]
AllTopics = Annotated[bool, typer.Option("--all-topics", help="Every topic.")]


def _rule(user: str, op: Operation, topic: str | None, prefix: str | None, every: bool) -> Acl:
    if sum((topic is not None, prefix is not None, every)) != 1:
        raise typer.BadParameter("give exactly one of --topic, --prefix, --all-topics")
    return Acl(user, op.value, topic=topic, prefix=prefix)


def _change(bootstrap: str, call: Callable[[Admin], Awaitable[object]]) -> None:
    """One admin call that changes the rules (add or remove)."""

    async def go() -> None:
        async with Admin(bootstrap, **client_options()) as admin:
            await call(admin)

    run(go)


def describe(acl: Acl) -> str:
    if acl.topic is not None:
        return f"topic {acl.topic}"
    if acl.prefix is not None:
        return f"prefix {acl.prefix}*"
    return "all topics"


@acl_app.command("add")
def acl_add(
    user: Principal,
    op: Op,
    topic: Topic = None,
    prefix: Prefix = None,
    all_topics: AllTopics = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Allow a user to produce, consume or administer (create, delete, alter) topics."""
    acl = _rule(user, op, topic, prefix, all_topics)
    _change(bootstrap, lambda admin: admin.add_acl(acl))
    typer.echo(f"allowed {acl.principal} to {acl.operation} on {describe(acl)}")


@acl_app.command("remove")
def acl_remove(
    user: Principal,
    op: Op,
    topic: Topic = None,
    prefix: Prefix = None,
    all_topics: AllTopics = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Remove a rule (exactly as it was added)."""
    acl = _rule(user, op, topic, prefix, all_topics)
    _change(bootstrap, lambda admin: admin.remove_acl(acl))
    typer.echo(f"removed: {acl.principal} to {acl.operation} on {describe(acl)}")


@acl_app.command("list")
def acl_list(
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only this user's.")] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """List the rules."""

    async def go() -> list[Acl]:
        async with Admin(bootstrap, **client_options()) as admin:
            return await admin.list_acls()

    rules = [a for a in run(go) if user is None or a.principal == user]
    if not rules:
        typer.echo("no ACLs")
        return
    rows = [["USER", "OPERATION", "RESOURCE"]]
    rows += [[a.principal, a.operation, describe(a)] for a in rules]
    typer.echo(render_table(rows))
