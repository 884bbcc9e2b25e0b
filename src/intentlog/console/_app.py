"""The console's routes (Starlette): the overview, a task page, resolving, and ``/metrics``.

The journal is the synchronous :class:`intentlog.Journal`; the routes that read it are plain
functions, which Starlette runs in its thread pool, so a slow query never blocks the event
loop. Templates are Jinja2 with autoescaping on for every value: task ids, notes, receipts,
errors and reasons are written by services and agents and are always shown as text.
"""

from __future__ import annotations

import importlib
import importlib.resources
import json
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

import intentlog
from intentlog._decide import confirm_phrase
from intentlog._hygiene import check_safe, check_text
from intentlog._verbs import risk_of
from intentlog._view import TaskView, overview, task_view
from intentlog._words import duration
from intentlog.console._auth import Gate, GateMiddleware, identity

__all__ = ["OUTCOMES", "create_app"]

OUTCOMES = tuple(intentlog.Outcome)
_FIELDS = ("csrf", "key", "seen", "outcome", "receipt", "note", "actor", "confirm")


def seen(op: intentlog.Operation) -> str:
    """What the form records of the operation it was shown for: its state and sends. A
    resolution is for that situation only (as in :meth:`intentlog.Journal.resolve`)."""
    return f"{op.state.value}:{op.attempts}"


def _quote(value: object) -> str:
    return urllib.parse.quote(str(value), safe="")


def _compact(value: object) -> str:
    # Plain text, escaped by the template like any other value (unlike Jinja's tojson,
    # which is meant for <script> and turns "<" into "\u003c").
    return json.dumps(value, separators=(", ", ": "), ensure_ascii=False, default=str)


def _iso(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _pretty(value: object) -> str:
    # Indented JSON for a <pre> block (a receipt, an error, a task's state), escaped as text.
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _describe_policy(policy: intentlog.Policy) -> str:
    """What the service promises, in words, from the policy recorded with an operation."""
    parts = []
    if policy.service:
        parts.append(policy.service)
    if policy.idempotent:
        retention = policy.key_retention
        kept = "forever" if retention is None else f"for {duration(retention)}"
        parts.append(f"deduplicates keys {kept}")
    else:
        parts.append("does not deduplicate")
    parts.append("can be asked (lookup)" if policy.can_reconcile else "cannot be asked")
    parts.append(f"timeout {duration(policy.timeout)}")
    return ", ".join(parts)


def _lease_text(view: TaskView) -> str:
    """Who holds a task page's task, and until when."""
    record, now = view.info.record, view.now
    if not record.owner:
        return "nobody"
    if record.lease_expires <= now:
        return f"{record.owner} (expired {duration(now - record.lease_expires)} ago)"
    state = "alive" if view.info.holder_alive else "process gone"
    return f"{record.owner} ({state}, expires in {duration(record.lease_expires - now)})"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("intentlog.console", "templates"),
        autoescape=True,  # every template is HTML; never |safe on journal data
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = _quote
    env.filters["json"] = _compact
    env.filters["iso"] = _iso
    env.filters["pretty"] = _pretty
    env.filters["policy"] = _describe_policy
    env.filters["lease"] = _lease_text
    env.filters["age"] = lambda seconds: duration(max(float(seconds), 0.0))
    return env


def task_url(task_id: str) -> str:
    """The path of a task's page (any task id: every character is percent-encoded)."""
    return f"/task/{_quote(task_id)}"


class Console:
    """The pages of one console over one journal."""

    def __init__(self, journal: intentlog.Journal, gate: Gate, *, read_only: bool) -> None:
        self.journal = journal
        self.gate = gate
        self.read_only = read_only
        self.env = _environment()
        css = importlib.resources.files("intentlog.console").joinpath("static/console.css")
        self.css = css.read_text(encoding="utf-8")

    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        html = self.env.get_template(name).render(
            csrf=self.gate.csrf_token(identity(request)),
            read_only=self.read_only,
            journal_url=self.journal.url,
            task_url=task_url,
            seen=seen,
            **context,
        )
        return HTMLResponse(html, status_code=status)

    # -- pages -------------------------------------------------------------------------------

    def overview(self, request: Request) -> Response:
        return self.render(request, "overview.html", view=overview(self.journal))

    def task(self, request: Request) -> Response:
        task_id = request.path_params["task_id"]
        try:
            view = task_view(self.journal, task_id)
        except intentlog.InvalidInput as exc:
            return self.render(request, "error.html", 404, title="No such task", message=str(exc))
        return self.render(request, "task.html", view=view, errors={}, values={}, end_error=None)

    def css_file(self, request: Request) -> Response:
        return Response(self.css, media_type="text/css")

    def metrics(self, request: Request) -> Response:
        """The Prometheus exposition of ``intentlog.metrics.render``, where installed."""
        try:
            module = importlib.import_module("intentlog.metrics")
        except ImportError as exc:
            return PlainTextResponse(f"metrics are not available here ({exc})\n", 501)
        render: Callable[[intentlog.Journal], tuple[bytes, str]] = module.render
        try:
            body, content_type = render(self.journal)
        except intentlog.InvalidInput as exc:  # prometheus-client is not installed
            return PlainTextResponse(f"{exc}\n", 501)
        return Response(body, headers={"content-type": content_type})

    # -- resolving ---------------------------------------------------------------------------

    async def resolve(self, request: Request) -> Response:
        """POST /resolve: settle one operation; 303 to its task page, which shows the new
        audit line. Refused (403) without this session's CSRF token; any input the journal
        refuses is shown back on the task page (400) and nothing is written."""
        return await self._posted(request, _FIELDS, self._resolve)

    async def _posted(
        self,
        request: Request,
        names: tuple[str, ...],
        handle: Callable[[Request, dict[str, str]], Response],
    ) -> Response:
        """Read a form's ``names`` (no files, a bounded number of fields), refuse it (403)
        without this session's CSRF token, else ``handle`` it off the event loop (it reads
        and writes the journal)."""
        async with request.form(max_files=0, max_fields=len(names) * 2) as form:
            fields = {name: _field(form, name) for name in names}
        if not fields["csrf"] or not self.gate.csrf_ok(identity(request), fields["csrf"]):
            return self.render(
                request,
                "error.html",
                403,
                title="Refused",
                message="The form's CSRF token is missing or wrong: reload the page and try again.",
            )
        return await run_in_threadpool(handle, request, fields)

    def _resolve(self, request: Request, fields: dict[str, str]) -> Response:
        key = fields["key"]
        try:
            op = self.journal.operation(key)
        except intentlog.UnknownOperation as exc:
            return self.render(
                request, "error.html", 404, title="No such operation", message=str(exc)
            )
        problem, receipt = self._check(op, fields)
        refused: str | None = None
        if problem is None:
            outcome = intentlog.Outcome(fields["outcome"])  # checked above: one of OUTCOMES
            try:
                self.journal.resolve(
                    key,
                    outcome,
                    receipt=receipt,
                    note=fields["note"] or None,
                    actor=fields["actor"],
                    # _check refused a risk whose phrase was not typed; this is that phrase.
                    accept_risk=fields["confirm"] == confirm_phrase(outcome, op.effect),
                )
            except intentlog.Error as exc:
                problem = f"Nothing was written: {exc}"
                refused = getattr(exc, "path", None) or ""
            else:
                return RedirectResponse(f"{task_url(op.task_id)}#op-{_quote(key)}", 303)
        values = _echoed(fields, refused)
        view = task_view(self.journal, op.task_id)
        return self.render(
            request,
            "task.html",
            400,
            view=view,
            errors={key: problem},
            values={key: values},
            end_error=None,
        )

    async def approve(self, request: Request) -> Response:
        """POST /approve: approve or deny the first send of one operation that waits for
        approval (``verdict`` is ``approve`` or ``deny``); 303 to its task page. The same
        rules as resolving: refused (403) without this session's CSRF token, and what the
        journal refuses (a send begun, a missing name) is shown, nothing written."""
        names = ("csrf", "key", "seen", "verdict", "reason", "actor")
        return await self._posted(request, names, self._approve)

    def _approve(self, request: Request, fields: dict[str, str]) -> Response:
        key, verdict = fields["key"], fields["verdict"]
        try:
            op = self.journal.operation(key)
        except intentlog.UnknownOperation as exc:
            return self.render(
                request, "error.html", 404, title="No such operation", message=str(exc)
            )
        problem: str | None = None
        if fields["seen"] != seen(op):
            problem = (
                f"Nothing was written: the operation changed since the page was shown (it is "
                f"{op.state.value} now, after {op.attempts} send(s)); look at it again."
            )
        elif verdict not in ("approve", "deny"):
            problem = "Choose approve or deny."
        elif not fields["actor"]:
            problem = "Your name is needed: it is kept in the audit trail as who decided."
        else:
            answer = self.journal.approve if verdict == "approve" else self.journal.deny
            try:
                answer(key, actor=fields["actor"], reason=fields["reason"] or None)
            except intentlog.Error as exc:
                problem = f"Nothing was written: {exc}"
            else:
                return RedirectResponse(f"{task_url(op.task_id)}#op-{_quote(key)}", 303)
        values = {
            name: "" if _holds_secret(name, fields[name]) else fields[name]
            for name in ("reason", "actor")
        }
        view = task_view(self.journal, op.task_id)
        return self.render(request, "task.html", 400, view=view, errors={key: problem},
                           values={key: values}, end_error=None)  # fmt: skip

    async def end_task(self, request: Request) -> Response:
        """POST /end-task: complete or cancel a task nothing automatic will finish; 303 to
        its page. Refused (403) without this session's CSRF token; what the journal refuses
        (open operations, a live holder, a bad actor or note) is shown, nothing written."""
        names = ("csrf", "task", "verb", "note", "actor")
        return await self._posted(request, names, self._end_task)

    def _end_task(self, request: Request, fields: dict[str, str]) -> Response:
        task_id, verb = fields["task"], fields["verb"]
        if verb not in ("complete", "cancel") or not fields["actor"]:
            problem = "Choose complete or cancel, and give your name for the audit trail."
        else:
            try:
                end = self.journal.complete if verb == "complete" else self.journal.cancel
                end(task_id, note=fields["note"] or None, actor=fields["actor"])
            except intentlog.Error as exc:
                problem = f"Nothing was written: {exc}"
            else:
                return RedirectResponse(task_url(task_id), 303)
        try:
            view = task_view(self.journal, task_id)
        except intentlog.InvalidInput as exc:
            return self.render(request, "error.html", 404, title="No such task", message=str(exc))
        return self.render(request, "task.html", 400, view=view, errors={}, values={},
                           end_error=problem)  # fmt: skip

    def _check(self, op: intentlog.Operation, fields: dict[str, str]) -> tuple[str | None, Any]:
        """What is wrong with the form before the journal is asked (None: nothing), and the
        parsed receipt."""
        outcome = fields["outcome"]
        if fields["seen"] != seen(op):
            return (
                f"Nothing was written: the operation changed since the page was shown (it is "
                f"{op.state.value} now, after {op.attempts} send(s)); look at it again.",
                None,
            )
        if outcome not in OUTCOMES:
            return "Choose what happened: confirmed, failed or retry.", None
        if not fields["actor"]:
            return "Your name is needed: it is kept in the audit trail as who resolved it.", None
        receipt: Any = None
        if fields["receipt"]:
            try:
                receipt = json.loads(fields["receipt"])
            except ValueError as exc:
                return f"Nothing was written: the receipt is not valid JSON ({exc}).", None
            except RecursionError:
                return "Nothing was written: the receipt is nested too deeply.", None
        # The decision module says what this choice risks; the journal refuses it too
        # without accept_risk, so the form's check and the journal's cannot disagree.
        task = self.journal.store.get_task(op.task_id)
        risk = risk_of(op, outcome, self.journal.store.now(), task)
        if risk is not None and fields["confirm"] != risk.phrase:
            return (
                f"{_NOT_DONE[outcome]} {_sentence(risk.reason)} To resolve it so anyway, type "
                f"“{risk.phrase}” in the confirmation box.",
                None,
            )
        return None, receipt


_NOT_DONE = {"retry": "Not retried.", "failed": "Not marked failed.",
             "confirmed": "Not marked confirmed."}  # fmt: skip


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _echoed(fields: dict[str, str], refused: str | None) -> dict[str, str]:
    """The form's values to show again with an error: what the person typed, except a value
    the journal refused (``refused``: the error's path) and any value that looks like a
    credential. A secret typed in the wrong box is never written into the page."""
    values = {"outcome": fields["outcome"]}
    for name in ("note", "actor", "receipt"):
        value = fields[name]
        named = refused is not None and (refused == name or refused.startswith(name + "."))
        values[name] = "" if named or _holds_secret(name, value) else value
    return values


def _holds_secret(name: str, value: str) -> bool:
    """Whether the journal's checks would refuse ``value`` as a credential: as free text
    (a note's check), and as the JSON it is (a receipt parsed, an actor as a string)."""
    try:
        check_text(value, what=name)
    except intentlog.UnsafeValue:
        return True
    except intentlog.Error:  # unstorable characters: not a credential
        pass
    data: Any = value
    if name == "receipt":
        try:
            data = json.loads(value)
        except (ValueError, RecursionError):
            return False  # not JSON: the free-text check above is what applies
    try:
        check_safe(data, what=name, max_bytes=1 << 30)  # no size bound: only secrets count
    except intentlog.UnsafeValue:
        return True
    except (intentlog.Error, RecursionError):
        return False
    return False


def _field(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def _journal_error(request: Request, exc: Exception) -> Response:
    # The journal could not be read (a database down, a lock held too long): say so, escaped.
    console: Console = request.app.state.console
    return console.render(request, "error.html", 503, title="Journal error", message=str(exc))


def create_app(journal: intentlog.Journal, *, token: str, read_only: bool = False) -> Starlette:
    """The console's ASGI application over ``journal``, guarded by ``token``.

    ``read_only``: no resolve forms, and every state-changing request is refused (403).
    The caller keeps ownership of the journal (and closes it).
    """
    gate = Gate(token)
    console = Console(journal, gate, read_only=read_only)
    routes = [
        Route("/", console.overview, name="overview"),
        Route("/task/{task_id:path}", console.task, name="task"),
        Route("/resolve", console.resolve, methods=["POST"], name="resolve"),
        Route("/end-task", console.end_task, methods=["POST"], name="end-task"),
        Route("/approve", console.approve, methods=["POST"], name="approve"),
        Route("/metrics", console.metrics, name="metrics"),
        Route("/console.css", console.css_file, name="css"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(GateMiddleware, gate=gate, read_only=read_only)],
        exception_handlers={intentlog.Error: _journal_error},
    )
    app.state.console = console
    return app
