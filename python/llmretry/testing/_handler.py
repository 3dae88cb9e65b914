"""The mock's request handler: one keep-alive connection, its control API
(``/_mock/...``) and its scripted replies (``_chat``; the connection's
plumbing is in ``_connection``)."""

from __future__ import annotations

import json
from typing import Tuple
from urllib.parse import unquote, urlsplit

from . import _batches
from ._chat import _ChatReplies
from ._connection import _Abort, _BadRequest  # noqa: F401  (_server imports _Abort here)
from ._replies import _strict_refusal
from ._scripts import ScriptError


class _Handler(_ChatReplies):
    """One keep-alive connection: control API and scripted chat replies."""

    # -- methods ----------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch()

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch()

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch()

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch()

    def do_PATCH(self) -> None:  # noqa: N802
        self._dispatch()

    def _dispatch(self) -> None:
        try:
            body = self._read_body()
        except _BadRequest as exc:
            self.close_connection = True
            self._send_error_json(400, str(exc))
            return
        path = self._route_path()
        method = self.command
        if _batches.handles(path):     # the Files and Batch APIs (strict or not)
            status, ctype, doc = self.server.state.batch_store.handle(
                method, path, self.headers.get("Content-Type") or "", body,
                urlsplit(self.path).query)
            self._send(status, doc if status != 204 else None,
                       [("Content-Type", ctype)] if ctype else [])
            return
        if self.server.strict and not path.startswith("/_mock/"):
            refusal = _strict_refusal(method, path, body)
            if refusal is not None:     # not recorded: no step consumed
                self._send_json(*refusal)
                return
        if path.startswith("/_mock/"):
            self._control(method, path, body)
        elif path.endswith(("/completions", "/responses", "/embeddings")):
            if method != "POST":
                self._send_error_json(405, f"method {method} not allowed")
                return
            name = "default"
            if path.startswith("/s/"):
                name = unquote(path[3:].split("/", 1)[0]) or "default"
            self._chat(name, body)
        else:
            self._send_error_json(404, f"no route for {method} {path}")

    # -- control API ------------------------------------------------------

    def _control(self, method: str, path: str, body: bytes) -> None:
        state = self.server.state
        allowed: Tuple[str, ...]
        if path.startswith("/_mock/scenarios/") and len(path) > 17:
            allowed = ("PUT",)
            if method == "PUT":
                name = unquote(path[len("/_mock/scenarios/"):])
                try:
                    doc = json.loads(body.decode("utf-8") or "{}")
                    if not isinstance(doc, dict):
                        raise ScriptError("the script must be a JSON object")
                    state.script(name, doc.get("steps"), doc.get("after"),
                                 doc.get("limits"), doc.get("outage"),
                                 doc.get("route"), doc.get("clock"))
                except (ValueError, UnicodeDecodeError) as exc:
                    self._send_error_json(400, f"bad script: {exc}")
                    return
                self._send(204, None)
                return
        elif path.startswith("/_mock/requests/") and len(path) > 16:
            allowed = ("GET", "DELETE")
            name = unquote(path[len("/_mock/requests/"):])
            if method == "GET":
                self._send_json(200, state.records(name))
                return
            if method == "DELETE":
                state.clear(name)
                self._send(204, None)
                return
        elif path.startswith("/_mock/limits/") and len(path) > 14:
            allowed = ("GET",)
            if method == "GET":
                name = unquote(path[len("/_mock/limits/"):])
                stats = state.limit_stats(name)
                if stats is None:
                    self._send_error_json(
                        404, f"scenario {name!r} has no limits")
                else:
                    self._send_json(200, stats)
                return
        elif path.startswith("/_mock/outage/") and len(path) > 14:
            allowed = ("PUT", "DELETE", "GET")
            name = unquote(path[len("/_mock/outage/"):])
            if method == "PUT":
                try:
                    doc = json.loads(body.decode("utf-8") or "{}")
                    if not isinstance(doc, dict):
                        raise ScriptError("the outage must be a JSON object")
                    unknown = sorted(set(doc) - {"mode", "for_ms"})
                    if unknown:
                        raise ScriptError(f"outage: unknown field(s) "
                                          f"{unknown} (known: for_ms, mode)")
                    state.start_outage(name, doc.get("mode", "503"),
                                       doc.get("for_ms"))
                except (ValueError, UnicodeDecodeError) as exc:
                    self._send_error_json(400, f"bad outage: {exc}")
                    return
                self._send(204, None)
                return
            if method == "DELETE":
                state.end_outage(name)
                self._send(204, None)
                return
            if method == "GET":
                self._send_json(200, state.outage_stats(name))
                return
        elif path.startswith("/_mock/clock/") and len(path) > 13:
            allowed = ("POST", "GET")
            name = unquote(path[len("/_mock/clock/"):])
            if method == "POST":
                try:
                    doc = json.loads(body.decode("utf-8") or "{}")
                    if not isinstance(doc, dict) or set(doc) != {"advance_ms"}:
                        raise ScriptError('the clock takes {"advance_ms": N}')
                    state.advance_clock(name, doc["advance_ms"])
                except (ValueError, UnicodeDecodeError) as exc:
                    self._send_error_json(400, f"bad clock: {exc}")
                    return
                self._send(204, None)
                return
            if method == "GET":
                self._send_json(200, state.clock_stats(name))
                return
        elif path == "/_mock/connections":
            allowed = ("GET",)
            if method == "GET":
                with state.lock:
                    accepted = state.accepted
                self._send_json(200, {"accepted": accepted})
                return
        elif path == "/_mock/health":
            allowed = ("GET",)
            if method == "GET":
                self._send_json(200, {"ok": True})
                return
        else:
            self._send_error_json(404, f"no route for {method} {path}")
            return
        self._send_error_json(405, f"method {method} not allowed "
                                   f"(allowed: {', '.join(allowed)})")
