"""``intentlog approve KEY`` and ``intentlog deny KEY``: a person's say on an operation that
waits for approval before its first send (an effect declared with ``approval=True``).

Thin over :meth:`intentlog.Journal.approve` and :meth:`intentlog.Journal.deny`: what either
may do in which state is the decision module's (``answer_approval``); these commands only
say it. Registered on the ``intentlog`` group by ``intentlog.cli``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

import intentlog
from intentlog import _cli_report as report
from intentlog._view import action_text

__all__ = ["approval_commands"]

_ACTOR = "Who decides, for the audit log [default: USER@HOST]."
_REASON = "Why; kept in the audit log and shown with the operation."


def approval_commands(
    open_journal: Callable[[click.Context], intentlog.Journal],
    options: tuple[Callable[[Callable[..., Any]], Callable[..., Any]], ...],
) -> list[click.Command]:
    """The ``approve`` and ``deny`` commands, opening the journal with ``open_journal`` and
    taking the group's shared ``options`` (``--db``, ``--json``)."""

    def command(name: str, short_help: str) -> Callable[[Callable[..., None]], click.Command]:
        def decorate(fn: Callable[..., None]) -> click.Command:
            decorators: list[Callable[[Any], Any]] = [
                click.argument("key"),
                click.option("--actor", metavar="NAME", help=_ACTOR),
                click.option("--reason", metavar="TEXT", help=_REASON),
                *options,
                click.pass_context,
            ]
            for option in reversed(decorators):
                fn = option(fn)
            return click.command(name, short_help=short_help)(fn)

        return decorate

    def act(ctx: click.Context, verb: str, key: str, actor: str | None, reason: str | None,
            as_json: bool) -> None:  # fmt: skip
        with open_journal(ctx) as journal:
            answer = journal.approve if verb == "approve" else journal.deny
            op = answer(key, actor=actor, reason=reason)
            info = journal.task_info(op.task_id)
        approval = op.approval
        assert approval is not None  # answered: the operation needs approval
        if as_json:
            doc = report.pick(op, "key", "task_id", "effect", "state")
            doc |= {"approval": approval.status, "actor": approval.actor}
            doc |= {"at": report.iso(approval.at), "reason": approval.reason}
            doc |= {"fingerprint": approval.fingerprint, "args": op.args}
            doc |= {"task_next_action": action_text(info.next_action)}
            click.echo(json.dumps(doc, indent=2, default=str))
            return
        by = f" by {approval.actor}" + (f": {approval.reason}" if approval.reason else "")
        click.echo(f"{op.key}: {approval.status}{by} ({op.state.value})")
        if approval.status == "approved":
            click.echo(
                f"task {op.task_id}: its next run sends it, once, with the arguments approved "
                f"{report.compact(op.args)}"
            )
        else:
            click.echo(f"task {op.task_id}: it is never sent; its run raises Rejected")

    @command("approve", "Approve an operation's first send (approval=True effects).")
    def approve(ctx: click.Context, key: str, actor: str | None, reason: str | None,
                as_json: bool) -> None:  # fmt: skip
        """Approve the first send of operation KEY, which waits for a person's
        approval (its effect is declared with approval=True). The approval is
        bound to the arguments recorded with it (shown by intentlog show TASK):
        the task's next run of the same call sends it, once.

        Approving again changes nothing. Refused, with nothing written, for an
        operation that needs no approval, was denied, or whose send has begun.

        \b
        Exit codes: 0 approved (or already); 1 unknown key or refused (the
        message names the operation's state); 2 usage error.

        \b
        Example:
          intentlog approve refund-3f9a0c1d2e --actor alice --reason "checked the order"
        """
        act(ctx, "approve", key, actor, reason, as_json)

    @command("deny", "Deny an operation's first send: it ends FAILED, never sent.")
    def deny(ctx: click.Context, key: str, actor: str | None, reason: str | None,
             as_json: bool) -> None:  # fmt: skip
        """Deny the first send of operation KEY: it becomes FAILED and is never
        sent (its task's run raises Rejected, naming who denied it and why). A
        denial wins over an approval whose send has not begun.

        Denying again changes nothing. Refused, with nothing written, for an
        operation that needs no approval or whose send has begun.

        \b
        Exit codes: 0 denied (or already); 1 unknown key or refused (the
        message names the operation's state); 2 usage error.

        \b
        Example:
          intentlog deny refund-3f9a0c1d2e --actor alice --reason "duplicate request"
        """
        act(ctx, "deny", key, actor, reason, as_json)

    return [approve, deny]
