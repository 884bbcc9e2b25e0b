"""``intentlog demo``: kill an agent at the worst moment, with and without intentlog.

Everything runs on 127.0.0.1: two reference services in threads ("payments" deduplicates keys
and answers lookups; "mailer" can do neither) and real agent processes
(:mod:`intentlog.demo._agents`) that crash points kill with SIGKILL. Every claim printed is
checked against a service's own record (``applied()``, ``truth()``) or the journal, and the
demo exits 0 only when all of them hold:

1. A naive agent (fresh Idempotency-Key per attempt, progress saved after the charge) killed
   after the charge committed: the restart charges again, the service applied 2 charges.
2. The same agent with intentlog, killed at the same moment: the journal holds the charge as
   SUBMITTED (next action RECONCILE); the restart finds it by key and records the receipt
   without sending again; the service applied the key once, with the journal's receipt id.
3. A mail killed in flight on a service that can neither deduplicate nor be asked: the restart
   stops with OutcomeUnknown (UNRESOLVED, next action ESCALATE); a person checks the mailer's
   record and resolves it; the next run completes and the mailer applied the mail once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

import intentlog
from intentlog._crash import ENV_VAR
from intentlog._verbs import risk_of
from intentlog.demo._agents import EXIT_UNRESOLVED
from intentlog.testing._service import ReferenceService

__all__ = ["Check", "run_demo"]

WIDTH = 100
AGENTS = "intentlog.demo._agents"  # the module the agent processes run (python -m)
KILLED = -9  # returncode of a child killed by SIGKILL
MAIL_TIMEOUT = 1.0  # the agents' request timeout: a mail in flight lands within it or never


@dataclasses.dataclass(frozen=True)
class Check:
    """One printed claim and whether it held."""

    claim: str
    ok: bool


class _Demo:
    def __init__(
        self,
        workdir: Path,
        journal: intentlog.Journal,
        payments: ReferenceService,
        mailer: ReferenceService,
        say: Callable[[str], None],
    ) -> None:
        self.workdir, self.db, self.journal = workdir, workdir / "journal.db", journal
        self.payments, self.mailer, self.say = payments, mailer, say
        self.checks: list[Check] = []

    def wrap(self, text: str, first: str = "   ", rest: str = "     ") -> None:
        opts: dict[str, Any] = {"break_long_words": False, "break_on_hyphens": False}
        self.say(textwrap.fill(text, WIDTH, initial_indent=first, subsequent_indent=rest, **opts))

    def check(self, claim: str, ok: bool) -> None:
        self.checks.append(Check(claim, bool(ok)))
        self.say(f"   {'checked:' if ok else 'FAILED:'} {claim}")

    def agent(self, *args: str, crash: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run an agent process to its end (or its SIGKILL); armed with ``crash`` if given."""
        env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
        if crash:
            env[ENV_VAR] = crash
        src = str(Path(intentlog.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", AGENTS, *args]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        if done.returncode not in (0, KILLED, EXIT_UNRESOLVED):  # show why it broke
            self.wrap(f"agent failed: {(done.stderr.strip().splitlines() or ['-'])[-1]}")
        return done

    def booking(self, order: str, crash: str | None = None) -> subprocess.CompletedProcess[str]:
        args = ("intentlog", str(self.db), self.payments.url, self.mailer.url, order)
        return self.agent(*args, crash=crash)

    def op(self, order: str, effect: str) -> intentlog.Operation:
        return next(o for o in self.journal.operations(order) if o.effect == effect)

    def completed(self, order: str) -> bool:
        return self.journal.task_info(order).record.completed

    # -- the story -------------------------------------------------------------------------

    def naive(self) -> int:
        """A naive agent charges order-0 twice; returns the charges the service applied."""
        self.say("\n1. A naive agent, order-0: a plain HTTP POST with a fresh Idempotency-Key per")
        self.say("   attempt; its progress is saved to a JSON file after the charge returns.")
        args = ("naive", str(self.workdir / "naive-progress.json"), self.payments.url, "order-0")
        first = self.agent(*args, crash="after_remote_commit:charge").returncode
        self.say(f"   run 1: charged, then killed before saving its progress (exit {first})")
        second = self.agent(*args).returncode
        self.say(f"   run 2: no progress on file, so it charges again (exit {second})")
        applied = {k: v for k, v in self.payments.applied().items() if k.startswith("naive-")}
        for key, ids in applied.items():
            self.say(f"   payments record: key {key} -> {', '.join(ids)}")
        charges = sum(len(ids) for ids in applied.values())
        self.check(
            f"naive: run 1 killed by SIGKILL after the charge (exit {first})", first == KILLED
        )
        self.check(f"naive: run 2 finished (exit {second})", second == 0)
        self.check(f"naive: the card was charged twice for one order ({charges})", charges == 2)
        return charges

    def reconcile(self) -> None:
        """The intentlog agent, killed at the same moment, charges order-1 once."""
        self.say(
            "\n2. The same agent with intentlog, order-1: charge the card, reserve a room, send"
        )
        self.say("   a mail, with a checkpoint after each step, on a SQLite journal (journal.db).")
        first = self.booking("order-1", crash="after_remote_commit:charge").returncode
        self.say(
            f"   run 1: the service committed the charge; killed before the receipt (exit {first})"
        )
        op = self.op("order-1", "charge")
        pending = [p for p in self.journal.pending() if p.task_id == "order-1"]
        for p in pending:
            self.say(f"   journal: {p.effect} {p.state}, next action {p.next_action} ({p.reason})")
        step = self.journal.task_info("order-1").record.next_step
        self.say(f"   journal: task order-1 resumes at next_step={step}")
        second = self.booking("order-1").returncode
        op = self.op("order-1", "charge")
        receipt = op.receipt.get("id") if isinstance(op.receipt, dict) else None
        self.wrap(
            f"run 2: looked the charge up by key (Found), recorded receipt {receipt} without "
            f"charging again, then reserved the room and sent the mail (exit {second})"
        )
        ids = self.payments.applied().get(op.key, [])
        self.check(
            f"order-1: run 1 killed by SIGKILL after the charge committed (exit {first})",
            first == KILLED and len(ids) >= 1,
        )
        self.check(
            "order-1: the journal held the charge SUBMITTED, next action RECONCILE",
            [(p.key, p.state, p.next_action) for p in pending]
            == [(op.key, intentlog.State.SUBMITTED, intentlog.Action.RECONCILE)]
            and step == "charge",
        )
        self.check(
            f"order-1: run 2 completed, the charge sent once (exit {second}, "
            f"attempts {op.attempts})",
            second == 0 and self.completed("order-1") and op.attempts == 1,
        )
        self.check(f"order-1: the service applied the charge once ({len(ids)})", len(ids) == 1)
        self.check(
            f"order-1: the journal's receipt is the charge the service applied ({receipt})",
            op.state is intentlog.State.CONFIRMED and [receipt] == ids,
        )

    def unresolved(self) -> None:
        """A mail killed in flight becomes UNRESOLVED; a person resolves it; sent once."""
        self.say("\n3. UNRESOLVED, order-2: killed with the mail in flight (sent, no answer read).")
        first = self.booking("order-2", crash="after_send:send_mail").returncode
        self.say(f"   run 1: killed after sending the mail request (exit {first})")
        second = self.booking("order-2")
        op = self.op("order-2", "send_mail")
        self.wrap(
            f"run 2: task.run raised OutcomeUnknown (exit {second.returncode}): the mailer can "
            "neither deduplicate nor be asked, so sending again could mail the guest twice"
        )
        actions = [p.next_action for p in self.journal.pending() if p.task_id == "order-2"]
        self.say(f"   journal: send_mail {op.state}, next action {', '.join(actions)}")
        self.check(
            f"order-2: run 1 killed by SIGKILL with the mail in flight (exit {first})",
            first == KILLED,
        )
        self.check(
            f"order-2: run 2 stopped on OutcomeUnknown (exit {second.returncode}), sent nothing",
            second.returncode == EXIT_UNRESOLVED
            and op.attempts == 1
            and len(self.mailer.applied().get(op.key, [])) <= 1,
        )
        self.check(
            "order-2: the journal marks the mail UNRESOLVED, next action ESCALATE",
            op.state is intentlog.State.UNRESOLVED and actions == [intentlog.Action.ESCALATE],
        )
        # A person looks at the mailer's own record. A request still in flight lands within
        # its timeout, so "not there" is believed only after that.
        give_up = time.monotonic() + MAIL_TIMEOUT
        while not self.mailer.applied().get(op.key) and time.monotonic() < give_up:
            time.sleep(0.05)
        sent = self.mailer.applied().get(op.key, [])
        if sent:
            self.say(
                f"   the mailer's record shows the mail went out ({sent[0]}), so a person runs:"
            )
            receipt: Any = {"id": sent[0]}
            note = "seen in the mailer record"
            self.journal.resolve(op.key, "confirmed", receipt=receipt, note=note, accept_risk=True)
            flags = f"--confirmed --receipt {shlex.quote(json.dumps(receipt))}"
        else:
            self.say("   the mailer's record has no such mail, so a person runs:")
            note = "not in the mailer record"
            self.journal.resolve(op.key, "retry", note=note, accept_risk=True)
            flags = "--retry"
            risk = risk_of(op, "retry", self.journal.store.now())
            if risk is not None:  # the mailer cannot deduplicate: a person types the phrase
                flags += f" --confirm {shlex.quote(risk.phrase)}"
        self.say(f"     intentlog --db {shlex.quote(str(self.db))} \\")
        self.say(f"         resolve {op.key} \\")
        self.say(f"         {flags} --note {shlex.quote(note)}")
        self.say("   (the demo does the same in-process: journal.resolve)")
        third = self.booking("order-2").returncode
        what = "used the receipt, sent no mail" if sent else "sent the mail with the same key"
        self.say(f"   run 3: {what}, completed (exit {third})")
        mails = len(self.mailer.applied().get(op.key, []))
        self.check(
            f"order-2: run 3 completed (exit {third})", third == 0 and self.completed("order-2")
        )
        self.check(f"order-2: the mailer sent the mail once ({mails})", mails == 1)

    def totals(self, naive_charges: int) -> dict[str, Any]:
        """Charges per order from the service's record; checks that intentlog made 1 each."""
        truth = self.payments.truth()
        ours = {k: n for k, n in truth.items() if not k.startswith("naive-")}
        charges = sum(truth.get(self.op(o, "charge").key, 0) for o in ("order-1", "order-2"))
        self.check(
            f"intentlog: one charge per order ({charges} for 2), no key applied twice",
            charges == 2 and all(n == 1 for n in ours.values()),
        )
        return {
            "naive": {"orders": 1, "charges": naive_charges},
            "intentlog": {"orders": 2, "charges": charges},
        }


def _workdir(stack: contextlib.ExitStack, directory: Path | None) -> Path:
    if directory is None:
        return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="intentlog-demo-")))
    directory.mkdir(parents=True, exist_ok=True)
    if any(directory.iterdir()):
        raise click.BadParameter(f"{directory} is not empty", param_hint="'--dir'")
    return directory


def run_demo(directory: Path | None = None, *, as_json: bool = False) -> int:
    """Run the demo; returns the exit code: 0 when every claim was checked, else 1.

    ``directory``: keep the journal and the services' records there (new or empty); default a
    temporary directory, removed at the end. ``as_json``: print one JSON summary instead.
    """
    started = time.monotonic()
    say: Callable[[str], None] = (lambda _: None) if as_json else click.echo
    with contextlib.ExitStack() as stack:
        workdir = _workdir(stack, directory)
        payments = stack.enter_context(ReferenceService("both", db_path=workdir / "payments.db"))
        # Each service names its records after itself: the mailer's ids read as mail ids.
        mailer = ReferenceService("neither", db_path=workdir / "mailer.db", id_prefix="mail_")
        stack.enter_context(mailer)
        journal = stack.enter_context(intentlog.open(workdir / "journal.db"))
        demo = _Demo(workdir, journal, payments, mailer, say)
        say("intentlog demo: an agent books orders and is killed with SIGKILL at the worst moment.")
        say(f"files: {workdir}" + ("" if directory else " (removed at the end; keep with --dir)"))
        say(f"payments {payments.url}  mode both: deduplicates keys, answers lookups by key")
        say(f"mailer   {mailer.url}  mode neither: like an SMTP relay")
        charges: dict[str, Any] = {}
        try:
            naive_charges = demo.naive()
            demo.reconcile()
            demo.unresolved()
            charges = demo.totals(naive_charges)
        except BrokenPipeError:
            raise  # nobody reads on: stop here (the services stop), the CLI exits quietly
        except Exception as exc:  # a broken step is a failed claim, not a traceback
            demo.check(f"the demo ran to the end ({type(exc).__name__}: {exc})", False)
    checks, ok = demo.checks, all(c.ok for c in demo.checks)
    db = workdir / "journal.db"
    if as_json:
        doc = {
            "ok": ok,
            "checks": [dataclasses.asdict(c) for c in checks],
            "charges": charges,
            "journal": str(db) if directory else None,
            "seconds": round(time.monotonic() - started, 2),
        }
        click.echo(json.dumps(doc, indent=2))
        return 0 if ok else 1
    say("\nSummary")
    for c in checks:
        say(f"  {'checked:' if c.ok else 'FAILED:'} {c.claim}")
    if charges:
        say("charges the payments service applied (its own record):")
        naive, ours = charges["naive"], charges["intentlog"]
        say(f"  naive agent      {naive['charges']} charges for {naive['orders']} order")
        say(f"  with intentlog   {ours['charges']} charges for {ours['orders']} orders")
    failed = sum(not c.ok for c in checks)
    verdict = f"{failed} of {len(checks)} claims FAILED" if failed else "every claim was checked"
    say(f"{verdict}, against the services' own records and the journal.")
    if directory:
        say(f"look at the journal: intentlog --db {shlex.quote(str(db))} status")
    return 0 if ok else 1
