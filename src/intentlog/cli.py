"""The ``intentlog`` command line: look at a journal and settle what automation cannot.

Commands::

    intentlog status                    counts by state, operations and tasks needing attention
    intentlog show TASK                 one task, its operations and their resolutions
    intentlog complete TASK / cancel TASK [--note TEXT] [--actor NAME]
                                        end a task nothing will finish, by hand
    intentlog resolve KEY --confirmed|--failed|--retry [--receipt JSON] [--note TEXT]
    intentlog approve KEY / deny KEY [--actor NAME] [--reason TEXT]
                                        a person's say on a send that waits for approval
    intentlog recover --effects MODULE  reconcile SUBMITTED operations with their services
    intentlog gc --older-than 30d       delete completed tasks older than a duration
    intentlog backup DEST [--force]     a consistent copy of a SQLite journal, while workers write
    intentlog check --effects MODULE --restart-within 1h
                                        effects whose service cannot settle a crash in flight
    intentlog mcp [--tools FILE] [--task ID] -- COMMAND...
                                        a journaling proxy in front of an MCP server
    intentlog console [--host H] [--port P] [--read-only]
                                        a web console: what needs a person, and resolving it

Every command takes ``--json`` for one JSON object on stdout. The journal is ``--db URL``,
else ``$INTENTLOG_URL``, else ``./.intentlog/journal.db``; it must already exist. ``--db`` and
``--json`` go before or after the command (``intentlog --db X status`` or ``intentlog status
--db X``); given on both sides, the command's own wins.

Exit codes:

    0  nothing needs attention (status), or the command did what it was asked
    1  an intentlog error (bad journal, bad input, unknown task or key): ``error: ...`` on stderr
    2  usage error (a bad or missing option)
    3  something needs a person: an operation is UNRESOLVED, action ESCALATE (status, recover),
       or a task nothing automatic will finish (status)
    4  work that a worker or recover will do, and nothing needs a person (status)

A reader that goes away early (``intentlog status | head``) is no error: the output stops,
nothing is said on stderr, and the exit code is the command's own: what status, check or
recover found (0, 3 or 4), 0 for a command that had done its work, and 1 for a demo stopped
before its claims were checked.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import click

import intentlog
from intentlog import Outcome
from intentlog import _cli_report as report
from intentlog import _view as views
from intentlog._cli_load import CliFailure as _Failure
from intentlog._cli_load import load_effects, load_registry, open_existing
from intentlog._cli_params import Address, Duration, Seconds, mask
from intentlog._decide import confirm_phrase
from intentlog._verbs import risk_of
from intentlog._words import duration

__all__ = ["cli", "main"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_PERSON, EXIT_AUTOMATION = 0, 1, 2, 3, 4
WIDTH = 100  # the width when not a terminal and $COLUMNS is unset


_ON_CLOSED_PIPE = "intentlog.exit_on_closed_pipe"  # ctx.meta: a command's code, once known


def _exit_on_closed_pipe(ctx: click.Context, code: int) -> None:
    """The exit code if stdout's reader goes away from here on: what the command found."""
    ctx.meta[_ON_CLOSED_PIPE] = code


class _Group(click.Group):
    """Catches every intentlog error in one place: ``error: <message>`` on stderr, exit 1.
    A closed pipe on stdout is no error: quiet, with the command's own exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # Caught here, before click's own handler, which would exit 1: the reader went
            # away (| head), so what the command found is still its exit code.
            _quiet_closed_pipe()
            raise click.exceptions.Exit(ctx.meta.get(_ON_CLOSED_PIPE, EXIT_OK)) from None
        except (intentlog.Error, _Failure, OSError) as exc:
            raw = ctx.obj.get("db") if ctx.obj else None
            click.echo(f"error: {mask(str(exc), raw)}", err=True)
            raise click.exceptions.Exit(EXIT_ERROR) from None


_JSON = "Print one JSON object."
_DB = (
    "Journal: a path, sqlite:///path or postgresql://... [env INTENTLOG_URL; default "
    "./.intentlog/journal.db]."
)


def _json_either_side(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    # A command's --json, or the group's (intentlog --json status).
    return value or bool((ctx.obj or {}).get("json"))


def _db_after_command(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    # A command's --db (intentlog status --db X) wins over the group's and $INTENTLOG_URL;
    # ctx.obj is the group's, so every command and the error handler see it.
    if value is not None:
        ctx.ensure_object(dict)["db"] = value


_json_option = click.option(
    "--json", "as_json", is_flag=True, callback=_json_either_side, help=_JSON
)
# No envvar here: $INTENTLOG_URL is read once, by the group, so that it never overrides an
# explicit --db given before the command.
_db_option = click.option(
    "--db", metavar="URL", expose_value=False, callback=_db_after_command, help=_DB
)


@click.group(cls=_Group)
@click.option("--db", metavar="URL", envvar="INTENTLOG_URL", help=_DB)
@click.option("--json", "as_json", is_flag=True, help=_JSON)
@click.version_option(intentlog.__version__, prog_name="intentlog")
@click.pass_context
def cli(ctx: click.Context, db: str | None, as_json: bool) -> None:
    """Look at an intentlog journal and settle what automation cannot.

    \b
    Exit codes: 0 nothing needs attention / done; 1 intentlog error
    (message on stderr); 2 usage error; 3 something needs a person
    (an UNRESOLVED operation); 4 work that automation will do.

    \b
    Example:
      INTENTLOG_URL=./.intentlog/journal.db intentlog status --json
      intentlog status --db ./.intentlog/journal.db --json
    """
    ctx.obj = {"db": db, "json": as_json}


def _open(ctx: click.Context) -> intentlog.Journal:
    """The existing journal ``--db`` names (see :func:`intentlog._cli_load.open_existing`)."""
    return open_existing(ctx.obj["db"])


def _emit(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


_iso = report.iso
_table = report.table
_pick = report.pick
_action = views.action_text
_action_text = views.task_action_text
_OP_FIELDS, _OP_TIMES = report.OP_FIELDS, report.OP_TIMES


_UNCLAIMED = "How long a runnable task may wait unclaimed before it needs a person [10m]."


@cli.command(short_help="Counts by state, and what needs attention (exit 0/3/4).")
@click.option("--unclaimed-after", type=Duration(), default=None, metavar="DURATION",
              help=_UNCLAIMED)  # fmt: skip
@_db_option
@_json_option
@click.pass_context
def status(ctx: click.Context, unclaimed_after: float | None, as_json: bool) -> None:
    """Show counts by state and everything that needs attention.

    Lists every operation not yet CONFIRMED or FAILED with its next action
    (WAIT shows the time until the next step can be decided), then the
    unfinished tasks nobody is working on, each with who will finish it and
    why: a worker of its kind, intentlog recover, or a person (an UNRESOLVED
    operation to resolve; a task its code or the MCP proxy never completed,
    or whose kind no running worker claims: complete or cancel it).

    \b
    Exit codes:
      0  nothing needs attention
      1  intentlog error (message on stderr)
      2  usage error
      3  something needs a person: an operation's next action is ESCALATE
         or APPROVE (it waits for approval), or a task nothing automatic will
         finish (see WHY)
      4  work that a worker or recover will do, and nothing needs a person

    \b
    Example:
      intentlog status --json
    """
    with _open(ctx) as journal:
        view = views.status(journal, unclaimed_after)
    code = EXIT_PERSON if view.needs_person else EXIT_AUTOMATION if view.automatic else EXIT_OK
    _exit_on_closed_pipe(ctx, code)
    if as_json:
        _emit(report.status_doc(view))
    else:
        for block in report.status_text(view):
            click.echo(block)
    ctx.exit(code)


@cli.command(short_help="One task, its operations and their resolutions.")
@click.argument("task_id", metavar="TASK")
@_db_option
@_json_option
@click.pass_context
def show(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Show one task, who will finish it and why, and each operation: its next
    action and why, what it is (effect or service), its sends, last error, the
    arguments it keeps (proxied tool calls keep theirs, secrets redacted; an
    effect keeps only their fingerprint unless it sets store_args=True) and
    its resolutions.

    \b
    Exit codes: 0 shown; 1 unknown task or bad journal; 2 usage error.

    \b
    Example:
      intentlog show order-42 --json
    """
    with _open(ctx) as journal:
        view = views.task_view(journal, task_id)
    if as_json:
        _emit(report.show_doc(view))
        return
    for block in report.show_text(view):
        click.echo(block)


_ACTOR = "Who does it, for the audit log [default: USER@HOST]."


def _finish(ctx: click.Context, verb: str, task_id: str, note: str | None,
            actor: str | None, as_json: bool) -> None:  # fmt: skip
    with _open(ctx) as journal:
        if verb == "complete":
            info = journal.complete(task_id, note=note, actor=actor)
        else:
            info = journal.cancel(task_id, note=note, actor=actor)
        endings = journal.task_resolutions(task_id)
    last = endings[-1]
    if as_json:
        _emit({"task": task_id, "completed": info.record.completed, "outcome": last.outcome,
               "actor": last.actor, "note": last.note, "at": _iso(last.at)})  # fmt: skip
        return
    click.echo(f"task {task_id}: {last.outcome} by {last.actor}")


def _ending_options(command: Callable[..., None]) -> Callable[..., None]:
    """The arguments and options that ``complete`` and ``cancel`` share."""
    for option in reversed((
        click.argument("task_id", metavar="TASK"),
        click.option("--note", metavar="TEXT", help="Why; kept in the audit log."),
        click.option("--actor", metavar="NAME", help=_ACTOR),
        _db_option,
        _json_option,
        click.pass_context,
    )):  # fmt: skip
        command = option(command)
    return command


@cli.command(short_help="Mark a task complete by hand (its code never did).")
@_ending_options
def complete(
    ctx: click.Context, task_id: str, note: str | None, actor: str | None, as_json: bool
) -> None:
    """Mark TASK complete: its work is done, but its code (a program that ended,
    an MCP proxy session) never said so. Kept in the audit log with --actor
    and --note (see intentlog show TASK).

    Refused, with nothing written, while a live process holds the task, or
    when an operation of it is SUBMITTED or UNRESOLVED (resolve those first:
    the error names them) or PLANNED (cancel the task instead).

    \b
    Exit codes: 0 completed; 1 refused (unknown task, open operations, held
    by a live process, bad --note/--actor); 2 usage error.

    \b
    Example:
      intentlog complete order-42 --note "agent finished; session ended" --actor alice
    """
    _finish(ctx, "complete", task_id, note, actor, as_json)


@cli.command(short_help="End a task that will not be finished, by hand.")
@_ending_options
def cancel(
    ctx: click.Context, task_id: str, note: str | None, actor: str | None, as_json: bool
) -> None:
    """Cancel TASK: nobody will finish it. Its PLANNED operations (nothing was
    sent for them) become FAILED; each change and the cancellation are kept in
    the audit log with --actor and --note.

    Never gives up an operation whose outcome is open: refused, with nothing
    written, when one is SUBMITTED or UNRESOLVED (the error names them and the
    resolve command), or while a live process holds the task.

    \b
    Exit codes: 0 cancelled; 1 refused (unknown task, open operations, held
    by a live process, bad --note/--actor); 2 usage error.

    \b
    Example:
      intentlog cancel order-42 --note "customer withdrew the order" --actor alice
    """
    _finish(ctx, "cancel", task_id, note, actor, as_json)


@cli.command(short_help="Settle an operation: --confirmed, --failed or --retry.")
@click.argument("key")
@click.option("--confirmed", is_flag=True, help="It happened; give what you saw as --receipt.")
@click.option("--failed", is_flag=True, help="It did not happen; do not retry this key.")
@click.option("--retry", is_flag=True, help="It did not happen; the next run sends it again.")
@click.option("--receipt", metavar="JSON", help="The receipt (JSON), only with --confirmed.")
@click.option("--note", metavar="TEXT", help="Why; kept in the audit log.")
@click.option(
    "--actor", metavar="NAME", help="Who resolves it, for the audit log [default: USER@HOST]."
)
@click.option(
    "--confirm",
    metavar="PHRASE",
    help="Resolve despite the risk shown, by typing the phrase it names ('retry EFFECT').",
)
@_db_option
@_json_option
@click.pass_context
def resolve(
    ctx: click.Context,
    key: str,
    confirmed: bool,
    failed: bool,
    retry: bool,
    receipt: str | None,
    note: str | None,
    actor: str | None,
    confirm: str | None,
    as_json: bool,
) -> None:
    """Settle an operation by hand (exactly one of --confirmed, --failed, --retry).

    The resolution is kept as an audit record (see intentlog show TASK), with
    who made it: --actor, by default this process's USER@HOST.

    A choice the decision would not make is refused with the reason, until
    you type the phrase it names with --confirm: a retry that may apply the
    effect twice (the service does not deduplicate, may have forgotten the
    key, or the latest request may still be executing), and --confirmed or
    --failed while the latest request may still land. --confirmed needs a
    --receipt with every field the effect keeps.

    \b
    Exit codes: 0 resolved; 1 unknown key, bad --receipt, an outcome that
    does not fit the operation's state, or a risk not confirmed; 2 usage error.

    \b
    Example:
      intentlog resolve charge-1ec2efaa48 --confirmed \\
          --receipt '{"id": "ch_1"}' --note "seen in the dashboard"
      intentlog resolve mail-5b1f09c2d4 --retry --confirm "retry mail" \\
          --note "not in the outbox; the server does not deduplicate"
    """
    flags = {Outcome.CONFIRMED: confirmed, Outcome.FAILED: failed, Outcome.RETRY: retry}
    chosen = [name for name, on in flags.items() if on]
    if len(chosen) != 1:
        raise click.UsageError(
            "give exactly one of --confirmed, --failed, --retry"
            + (f" (got {', '.join('--' + c for c in chosen)})" if chosen else ""),
            ctx,
        )
    parsed: Any = None
    if receipt is not None:
        try:
            parsed = json.loads(receipt)
        except ValueError as exc:
            raise _Failure(f"--receipt is not valid JSON: {exc}") from None
        except RecursionError:  # the journal's depth bound refuses far less already
            raise _Failure("--receipt is nested too deeply") from None
    with _open(ctx) as journal:
        # A wrong phrase matters only where there is a risk to confirm: the journal's own
        # refusal (an outcome that does not fit the state, say) is said first.
        accept = confirm is not None and confirm.strip() == confirm_phrase(
            chosen[0], journal.operation(key).effect
        )
        try:
            op = journal.resolve(
                key, chosen[0], receipt=parsed, note=note, actor=actor, accept_risk=accept
            )
        except intentlog.InvalidInput as exc:
            current = journal.operation(key)
            task = journal.store.get_task(current.task_id)
            risk = risk_of(current, chosen[0], journal.store.now(), task)
            if exc.phrase is None or risk is None:
                raise
            if confirm is not None:
                raise _Failure(
                    f"--confirm must be exactly {risk.phrase!r} to resolve {key} as {chosen[0]}"
                ) from None
            raise _Failure(
                f"not resolved: {risk.reason} To resolve it as {chosen[0]} anyway, add "
                f"--confirm {shlex.quote(risk.phrase)}"
            ) from None
        info = journal.task_info(op.task_id)
    if as_json:
        _emit(
            _pick(op, *_OP_FIELDS, *_OP_TIMES)
            | {"task_next_action": _action(info.next_action, None)}
        )
        return
    click.echo(f"{op.key}: {op.state.value}")
    click.echo(f"task {op.task_id}: next action {_action_text(info)}")


_EFFECTS = "Module (or module:attr) with the effects; repeatable; ./ is importable."
_WAIT = "How long to wait for a task held by a live worker (default 0)."


@cli.command(short_help="Reconcile SUBMITTED operations; sends nothing.")
@click.option("--effects", "specs", metavar="MODULE", multiple=True, required=True, help=_EFFECTS)
@click.option("--wait", type=Seconds(min=0), default=0.0, metavar="SECONDS", help=_WAIT)
@_db_option
@_json_option
@click.pass_context
def recover(ctx: click.Context, specs: tuple[str, ...], wait: float, as_json: bool) -> None:
    """Reconcile SUBMITTED operations with their services, sending nothing.

    Found operations become CONFIRMED; operations nothing can settle become
    UNRESOLVED. Tasks held by a live worker are left alone.

    \b
    Exit codes: 0 nothing ended UNRESOLVED; 1 import error, no effects, or
    intentlog error; 2 usage error; 3 an operation ended UNRESOLVED.

    \b
    Example:
      intentlog recover --effects myapp.effects --effects billing:EFFECTS --wait 5
    """
    effects = load_effects(specs)
    with _open(ctx) as journal:
        report = journal.recover(effects, wait=wait)
        url = journal.url
    unresolved = [r for r in report if r.state is intentlog.State.UNRESOLVED]
    code = EXIT_PERSON if unresolved else EXIT_OK
    _exit_on_closed_pipe(ctx, code)
    cols = ("key", "task_id", "effect", "state", "next_action", "reason")
    items = [
        _pick(r, *cols[:4]) | {"next_action": r.next_action.value, "reason": r.reason}
        for r in report
    ]
    if as_json:
        names = [e.name for e in effects]
        doc = {"journal": url, "effects": names, "recovered": items}
        _emit({**doc, "needs_person": bool(unresolved)})
        ctx.exit(code)
    if not report:
        click.echo("no SUBMITTED operations to recover")
        ctx.exit(code)
    rows = [[i[c] for c in cols] for i in items]
    click.echo(_table(["KEY", "TASK", "EFFECT", "STATE", "NEXT", "REASON"], rows))
    tally = collections.Counter(r.state.value for r in report)
    summary = ", ".join(f"{n} {state}" for state, n in sorted(tally.items()))
    click.echo(f"\n{len(report)} operation(s) examined: {summary}")
    if unresolved:
        click.echo("needs a person: intentlog resolve KEY --confirmed/--failed/--retry")
    ctx.exit(code)


_OLDER = "Remove tasks completed longer ago than this: 30d, 12h, 45m, 90s or seconds."


@cli.command(short_help="Delete completed tasks older than a duration.")
@click.option("--older-than", type=Duration(), required=True, metavar="DURATION", help=_OLDER)
@_db_option
@_json_option
@click.pass_context
def gc(ctx: click.Context, older_than: float, as_json: bool) -> None:
    """Delete completed tasks (and their operations) older than a duration.

    Never removes an unfinished task or one with an operation that is not
    CONFIRMED or FAILED.

    \b
    Exit codes: 0 done; 1 intentlog error; 2 usage error (bad --older-than).

    \b
    Example:
      intentlog gc --older-than 30d
    """
    with _open(ctx) as journal:
        removed = journal.gc(older_than)
        url = journal.url
    if as_json:
        _emit({"journal": url, "older_than_seconds": older_than, "removed": removed})
        return
    click.echo(f"removed {removed} completed task(s) older than {duration(older_than)} from {url}")


_RESTART = "The longest a worker may stay down: 90s, 15m, 1h, 2d or seconds."
_ACCEPT = "An effect whose crashes in flight may end UNRESOLVED for a person; repeatable."


@cli.command(short_help="Can the effects' services cover a restart? Sends nothing (exit 0/3).")
@click.option("--effects", "specs", metavar="MODULE", multiple=True, required=True, help=_EFFECTS)
@click.option("--restart-within", type=Duration(), required=True, metavar="DURATION", help=_RESTART)
@click.option("--accept", "accepted", metavar="EFFECT", multiple=True, help=_ACCEPT)
@_json_option
@click.pass_context
def check(
    ctx: click.Context,
    specs: tuple[str, ...],
    restart_within: float,
    accepted: tuple[str, ...],
    as_json: bool,
) -> None:
    """Check that every effect's service can settle a crash in flight after a
    restart that comes within --restart-within.

    A problem: an effect whose key retention, minus the safety margin the
    decision keeps, is shorter than the interval (and that has no reconciler),
    or an effect that can neither deduplicate nor be asked. A crash with a
    request in flight there ends UNRESOLVED, for a person. A note: an effect
    whose service can be asked but that has no reconciler, or a problem
    accepted with --accept. Reads what the effects declare and sends nothing.
    Where the journal (--db, INTENTLOG_URL) is on PostgreSQL, it is opened
    read-only and a warning line says whether a failover of its server could
    lose commits these effects cannot afford (no synchronous standby).

    \b
    Exit codes: 0 no problem; 1 import error or no effects; 2 usage error
    (a bad --restart-within, an --accept naming no effect); 3 a problem.

    \b
    Example:
      intentlog check --effects myapp.effects --restart-within 1h
      intentlog check --effects myapp.effects --restart-within 1h --accept send_mail
    """
    from intentlog._check import describe, human

    effects = load_effects(specs)
    unknown = sorted(set(accepted) - {e.name for e in effects})
    if unknown:
        raise click.BadParameter(
            f"names no effect: {', '.join(unknown)}", ctx, param_hint="--accept"
        )
    findings = intentlog.check(effects, restart_within=restart_within, accept=accepted)
    problems = sum(f.problem for f in findings)
    code = EXIT_PERSON if problems else EXIT_OK
    _exit_on_closed_pipe(ctx, code)
    journal_warning = _journal_warning(ctx, effects)
    if journal_warning is not None:
        click.echo(f"warning: {journal_warning}", err=True)
    if as_json:
        doc = {
            "restart_within_seconds": restart_within,
            "effects": [
                {
                    "effect": e.name,
                    "service": e.service.name if e.service is not None else None,
                    "deduplicates": e.policy.idempotent,
                    "key_retention_seconds": e.policy.key_retention,
                    "can_reconcile": e.policy.can_reconcile,
                    "summary": describe(e),
                }
                for e in effects
            ],
            "findings": [
                {
                    "effect": f.effect,
                    "service": f.service,
                    "kind": f.kind,
                    "problem": f.problem,
                    "accepted": f.accepted,
                    "message": f.message,
                }
                for f in findings
            ],
            "problems": problems,
            "journal_warning": journal_warning,
        }
        _emit(doc)
        ctx.exit(code)
    rows = []
    for e in effects:
        service = e.service.name if e.service is not None else "-"
        mine = [f for f in findings if f.effect == e.name]
        if not mine:
            rows.append((e.name, service, "ok", describe(e)))
        for f in mine:
            rows.append((e.name, service, "PROBLEM" if f.problem else "note", f.message))
    click.echo(_table(["EFFECT", "SERVICE", "VERDICT", "WHY"], rows))
    notes = len(findings) - problems
    click.echo(
        f"\n{len(effects)} effect(s) checked for a restart within {human(restart_within)}: "
        f"{problems} problem(s), {notes} note(s)"
    )
    if problems:
        click.echo("fix: a reconciler, or a service that keeps keys longer; or --accept EFFECT")
    ctx.exit(code)


def _journal_warning(ctx: click.Context, effects: list[intentlog.Effect]) -> str | None:
    """check's line about the journal's server, for a journal named on PostgreSQL."""
    from intentlog._check import journal_warning

    raw: str | None = ctx.obj["db"]
    if raw is None or not raw.startswith(("postgresql://", "postgres://")):
        return None  # a SQLite journal is one file on one disk: no failover to lose commits
    try:
        with intentlog.open(raw, create=False) as journal:
            return journal_warning(journal.store, effects)
    except intentlog.Error as exc:
        return f"cannot read how the journal's server replicates its commits: {exc}"


@cli.command(short_help="Kill an agent at the worst moment, with and without intentlog.")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the journal and the services' records in this new or empty directory.",
)
@_json_option
@click.pass_context
def demo(ctx: click.Context, directory: Path | None, as_json: bool) -> None:
    """Show what a crash at the worst moment does, with and without intentlog.

    Starts two services on 127.0.0.1 and runs agents as real processes that
    are killed with SIGKILL and restarted: a naive agent charges a card twice;
    the same agent with intentlog reconciles and charges once; a mail lost in
    flight becomes UNRESOLVED until a person resolves it. Every claim printed
    is checked against the services' own records and the journal.

    \b
    Exit codes: 0 every claim checked; 1 a claim FAILED; 2 usage error.

    \b
    Example:
      intentlog demo
      intentlog demo --dir ./demo && intentlog --db ./demo/journal.db status
    """
    from intentlog.demo import run_demo

    # The demo prints as it goes: stopped by its reader, its claims were not all checked.
    _exit_on_closed_pipe(ctx, EXIT_ERROR)
    ctx.exit(run_demo(directory, as_json=as_json))


@cli.command(short_help="Create a task for workers to run.")
@click.argument("kind")
@click.argument("task_id")
@click.option("--input", "input_text", metavar="JSON", default="null", help="The task's input.")
@_db_option
@_json_option
@click.pass_context
def start(ctx: click.Context, kind: str, task_id: str, input_text: str, as_json: bool) -> None:
    """Create task TASK_ID to be run by a worker with the function registered as KIND.

    Starting the same id again with the same kind and input changes nothing.

    \b
    Exit codes: 0 created or already there; 1 bad input or another task
    with this id; 2 usage error.

    \b
    Example:
      intentlog start order order-42 --input '{"amount": 500}'
    """
    try:
        value = json.loads(input_text)
    except ValueError as exc:
        raise _Failure(f"--input is not valid JSON: {exc}") from None
    except RecursionError:  # the journal's depth bound refuses far less already
        raise _Failure("--input is nested too deeply") from None
    with _open_journal_for_write(ctx) as journal:
        created = journal.start(kind, task_id, value)
    if as_json:
        _emit({"task": task_id, "kind": kind, "created": created})
    else:
        click.echo(f"{'created' if created else 'already there'}: task {task_id} ({kind})")


def _open_journal_for_write(ctx: click.Context) -> intentlog.Journal:
    """Like _open, but a missing journal is created (starting work is how one begins)."""
    return intentlog.open(ctx.obj["db"])


@cli.command(short_help="Run registered tasks; stops gracefully on SIGTERM.")
@click.option("--app", "app", metavar="MODULE:REGISTRY", required=True, help="The registry.")
@click.option("--concurrency", type=click.IntRange(1, 256), default=1, help="Worker threads.")
@click.option("--poll", type=Seconds(min=0.01), default=0.5, metavar="SECONDS")
@click.option(
    "--lease-ttl", type=Seconds(min=0.1), default=30.0, metavar="SECONDS",
    help="How long a claimed task's lease lasts without renewal.",
)  # fmt: skip
@click.option("--exit-when-idle", is_flag=True, help="Return once nothing is runnable.")
@click.option(
    "--metrics", "metrics_at", type=Address(), default=None, metavar="HOST:PORT",
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (PORT alone: 127.0.0.1).",
)  # fmt: skip
@_db_option
@_json_option
@click.pass_context
def worker(
    ctx: click.Context,
    app: str,
    concurrency: int,
    poll: float,
    lease_ttl: float,
    exit_when_idle: bool,
    metrics_at: tuple[str, int] | None,
    as_json: bool,
) -> None:
    """Claim runnable tasks and run them with the registered task functions.

    A task is runnable when it is new, or its lease expired (its worker died),
    and it has no UNRESOLVED operation (then it is parked until resolved). A
    worker reconciles a task's SUBMITTED operations first, then resumes the
    task function at the task's next_step. SIGTERM or SIGINT: the running
    tasks finish, then the worker exits.

    With --metrics, GET /metrics serves the journal's gauges and this
    process's counters (Prometheus text format) while the worker runs; the
    address is printed on stderr. Read-only and without keys, arguments or
    receipts, but it shows effect names and counts: bind another address
    than loopback only where that is fine.

    \b
    Exit codes: 0 stopped cleanly; 1 intentlog error; 2 usage error.

    \b
    Example:
      intentlog --db postgresql://app@db/prod worker --app myapp.tasks:registry
    """
    workers: list[intentlog.Worker] = []
    stopping = threading.Event()

    def request_stop(*_: object) -> None:
        stopping.set()
        for w in workers:
            w.stop()

    # Handled from the first moment, so a worker stopped while it is still starting (loading
    # the app, opening the journal) exits cleanly too, having claimed nothing.
    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    click.echo(f"intentlog worker {os.getpid()}: started (SIGTERM stops it cleanly)", err=True)
    # The journal logs an outage of its server in two lines ("connection lost", "reconnected
    # after N s"); psycopg's pool would add one for every connection it discards and every
    # attempt that fails meanwhile. Its errors still show, and a level set before is kept.
    pool_log = logging.getLogger("psycopg.pool")
    if pool_log.level == logging.NOTSET:
        pool_log.setLevel(logging.ERROR)
    try:
        registry = load_registry(app)
        opened = _open_when_reachable(ctx.obj["db"], lease_ttl, stopping)
        if opened is not None:  # None: stopped while the server was away, nothing claimed
            with opened as journal, _serving_metrics(journal, registry, metrics_at):
                workers.extend(
                    intentlog.Worker(journal, registry, poll=poll) for _ in range(concurrency)
                )
                if stopping.is_set():
                    request_stop()
                threads = [
                    threading.Thread(target=w.run, kwargs={"exit_when_idle": exit_when_idle})
                    for w in workers[1:]
                ]
                for thread in threads:
                    thread.start()
                try:
                    workers[0].run(exit_when_idle=exit_when_idle)
                finally:
                    for w in workers:
                        w.stop()
                    for thread in threads:
                        thread.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    totals = {
        "completed": sum(w.completed for w in workers),
        "parked": sum(w.parked for w in workers),
        "failed": sum(w.failed for w in workers),
    }
    if as_json:
        _emit(totals)
    else:
        click.echo(", ".join(f"{n} {what}" for what, n in totals.items()))


def _open_when_reachable(
    db: str, lease_ttl: float, stopping: threading.Event
) -> intentlog.Journal | None:
    """The journal, opened once its server can be reached: a worker started while the server
    restarts or fails over waits for it (one line per try, the pause doubling up to 30 s)
    instead of exiting; None if stopped meanwhile. Any other error ends the worker."""
    pause = 0.5
    while True:
        try:
            return intentlog.open(db, lease_ttl=lease_ttl)
        except intentlog.JournalUnreachable as exc:
            why = " ".join(str(exc).split())  # one line: libpq's messages span several
            click.echo(f"intentlog worker {os.getpid()}: {why}; trying again in {pause:g} s",
                       err=True)  # fmt: skip
            if stopping.wait(pause):
                return None
            pause = min(pause * 2, 30.0)


@contextlib.contextmanager
def _serving_metrics(
    journal: intentlog.Journal, registry: intentlog.Registry, at: tuple[str, int] | None
) -> Iterator[None]:
    """While the worker runs: its counters on, and /metrics served at ``at`` (if given)."""
    if at is None:
        yield
        return
    import intentlog.metrics

    intentlog.metrics.enable()
    intentlog.metrics.know(registry.effects.values())
    with intentlog.metrics.serve(journal, *at) as server:
        click.echo(f"intentlog worker {os.getpid()}: metrics at {server.url}", err=True)
        yield


def _add_commands() -> None:
    # Commands in modules of their own, each importing what it needs only when it runs: the
    # MCP proxy's code; the gateway's httpx; the console's Starlette, Jinja2 and uvicorn; the
    # SQLite copy, which needs none of the verbs above.
    from intentlog._backup import backup_command
    from intentlog.console._cli import console_command
    from intentlog.gateway._cli import gateway_command
    from intentlog.proxy._cli import mcp_command

    for command in (mcp_command, gateway_command, console_command, backup_command):
        cli.add_command(command)


_add_commands()


def _add_approvals() -> None:
    # Its own module (intentlog._cli_approve), over the journal as this module opens it.
    from intentlog._cli_approve import approval_commands

    for command in approval_commands(_open, (_db_option, _json_option)):
        cli.add_command(command)


_add_approvals()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``intentlog`` command."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="intentlog")


def _quiet_closed_pipe() -> None:
    """The reader of stdout went away (``intentlog show ... | head``). Later writes, and the
    interpreter's flush at exit, go to /dev/null instead of raising (Python's documented
    recipe for SIGPIPE)."""
    with contextlib.suppress(OSError, ValueError):  # no stdout fd (in-process, CliRunner)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)


if __name__ == "__main__":
    main()
