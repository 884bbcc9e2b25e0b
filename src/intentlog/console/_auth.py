"""The console's gate: the access token, the session cookie, CSRF tokens, read-only mode and
the security headers every response carries.

Guarantees: no request reaches a page without the token (``Authorization: Bearer TOKEN``,
``?token=TOKEN``, or the session cookie a ``?token=`` visit sets); a wrong credential gets
403, none at all 401. The token itself never goes into a cookie, a page or a log line of the
console: a ``?token=`` visit is redirected to the same address without it. A session cookie
is signed with a key that lives only in this process, so a restart ends every session. Every
comparison of a secret is in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import urllib.parse

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "SECURITY_HEADERS",
    "Gate",
    "GateMiddleware",
    "identity",
]

SECURITY_HEADERS = {
    # No scripts at all: the pages are plain forms, refreshed by a meta tag.
    "content-security-policy": (
        "default-src 'self'; script-src 'none'; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",  # pages hold receipts and CSRF tokens
}
_IDENTITY = "intentlog.console.identity"
_SAFE_METHODS = ("GET", "HEAD")


class Gate:
    """The secrets of one console process: its token and the key that signs its sessions
    and derives their CSRF tokens."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()
        self._key = secrets.token_bytes(32)

    def token_ok(self, offered: str) -> bool:
        return hmac.compare_digest(offered.encode("utf-8", "replace"), self._token)

    def new_session(self) -> str:
        """A session cookie value: a random id and its signature."""
        sid = secrets.token_urlsafe(18)
        return f"{sid}.{self._sign('session', sid)}"

    def session(self, cookie: str) -> str | None:
        """The session id of a cookie this process signed, else None."""
        sid, _, signature = cookie.partition(".")
        if not sid or not hmac.compare_digest(signature, self._sign("session", sid)):
            return None
        return sid

    def csrf_token(self, who: str) -> str:
        """The CSRF token of one session (or of token-authenticated requests)."""
        return self._sign("csrf", who)

    def csrf_ok(self, who: str, offered: str) -> bool:
        return hmac.compare_digest(
            offered.encode("utf-8", "replace"), self.csrf_token(who).encode()
        )

    def _sign(self, purpose: str, value: str) -> str:
        message = f"{purpose}:{value}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()


def identity(request: Request) -> str:
    """Who the gate let in: ``session:<id>`` or ``token`` (a Bearer or ``?token=`` request)."""
    return str(request.scope[_IDENTITY])


def cookie_name(scope: Scope) -> str:
    # Browsers keep cookies per host, not per port: two consoles on one machine must not
    # overwrite each other's session.
    server = scope.get("server")
    return f"intentlog_console_{server[1] if server else 0}"


class GateMiddleware:
    """Refuses every request without the token, turns a ``?token=`` visit into a session,
    refuses state-changing requests in read-only mode, and adds :data:`SECURITY_HEADERS`."""

    def __init__(self, app: ASGIApp, *, gate: Gate, read_only: bool) -> None:
        self.app = app
        self.gate = gate
        self.read_only = read_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])]
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        response = self._check(scope)
        if response is not None:
            await response(scope, receive, send_secured)
            return
        await self.app(scope, receive, send_secured)

    def _check(self, scope: Scope) -> Response | None:
        """None to let the request through (its identity set in the scope), or the answer."""
        request = Request(scope)
        offered = False
        who: str | None = None
        scheme, _, credential = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            offered = True
            if self.gate.token_ok(credential.strip()):
                who = "token"
        cookie = request.cookies.get(cookie_name(scope))
        if who is None and cookie:
            offered = True
            sid = self.gate.session(cookie)
            if sid is not None:
                who = f"session:{sid}"
        query_token = request.query_params.get("token")
        if query_token is not None:
            offered = True
            valid = self.gate.token_ok(query_token)
            if valid and request.method in _SAFE_METHODS:
                return self._start_session(request, keep=who if who != "token" else None)
            if valid and who is None:
                who = "token"
        if who is None:
            return _refusal(403 if offered else 401)
        if self.read_only and request.method not in _SAFE_METHODS:
            return _page(403, "Read-only", "This console is read-only: it changes nothing.")
        scope[_IDENTITY] = who
        return None

    def _start_session(self, request: Request, *, keep: str | None) -> Response:
        # The token leaves the address bar (and the history) at once: the same address
        # without it, with a session cookie instead.
        query = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        url = URL(path=request.url.path, query=urllib.parse.urlencode(query))
        response = RedirectResponse(str(url), status_code=303)
        if keep is None:
            response.set_cookie(
                cookie_name(request.scope),
                self.gate.new_session(),
                httponly=True,
                samesite="strict",
                path="/",
            )
        return response


def _refusal(status: int) -> Response:
    if status == 401:
        response = _page(
            401,
            "Token needed",
            "This console needs its token: open the address it printed when it started "
            "(it ends in ?token=...), or send Authorization: Bearer TOKEN.",
        )
        response.headers["www-authenticate"] = "Bearer"
        return response
    return _page(403, "Wrong token", "This token, cookie or session is not valid here.")


def _page(status: int, title: str, text: str) -> Response:
    # Fixed text only: nothing from the request is echoed.
    body = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{title}</title></head><body><h1>{title}</h1><p>{text}</p></body></html>"
    )
    return HTMLResponse(body, status_code=status)
