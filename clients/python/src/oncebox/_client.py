"""``Client`` and ``AsyncClient``: the HTTP API of ``oncebox serve`` (``/v1``), sync and async.

Resending: a request whose answer is lost (a timeout, a reset, a refused connection) or answered
with a 5xx (a proxy's 502, the server's 503 when busy or stopping) is sent again, byte for byte, with
the SAME ids: at most ``retries`` more times (8 by default), waiting 0.25 s, then twice as long each
time up to 4 s (at most about 20 s of waiting in all, plus the requests' own timeouts). Then
``AnswerLost`` is raised: send the same call again later, never as a new step. A 4xx is never
resent: it is raised as ``RequestError`` (nothing was recorded).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any, Mapping, Optional
from urllib.parse import quote

import httpx

from ._outcome import AnswerLost, AnyOutcome, OnceboxError, RequestError, outcome_of

#: Resends after the first try, by default.
DEFAULT_RETRIES = 8
#: The first wait before a resend, and the longest.
FIRST_BACKOFF = 0.25
MAX_BACKOFF = 4.0
#: The longest ``wait`` the server accepts, in seconds.
MAX_WAIT = 300.0
#: The longest id the server accepts, in bytes.
MAX_ID_BYTES = 512


def _check_id(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"`{name}` must be a non-empty string from your workflow's durable state, got {value!r}")
    if len(value.encode()) > MAX_ID_BYTES or not value.isprintable():
        raise ValueError(f"`{name}` must be printable text of at most {MAX_ID_BYTES} bytes, got {value!r}")
    return value


def _call_body(tool: str, args: Any, run_id: str, step_id: str, wait: Optional[float]) -> dict[str, Any]:
    if not isinstance(tool, str) or not tool:
        raise ValueError(f"`tool` must be a tool's name, got {tool!r}")
    if not isinstance(args, Mapping):
        raise ValueError(f"`args` must be a JSON object (a dict), got {type(args).__name__}")
    body: dict[str, Any] = {
        "run_id": _check_id("run_id", run_id),
        "step_id": _check_id("step_id", step_id),
        "tool": tool,
        "args": dict(args),
    }
    if wait is not None:
        if not isinstance(wait, (int, float)) or not 0 <= wait <= MAX_WAIT:
            raise ValueError(f"`wait` must be 0 to {MAX_WAIT:.0f} seconds, got {wait!r}")
        body["wait"] = float(wait)
    return body


def _backoffs(retries: int) -> list[float]:
    waits, wait = [], FIRST_BACKOFF
    for _ in range(retries):
        waits.append(wait * (0.5 + random.random() / 2))
        wait = min(wait * 2, MAX_BACKOFF)
    return waits


def _refusal(response: httpx.Response, method: str, path: str) -> RequestError:
    kind, message = "error", response.text
    try:
        error = response.json().get("error", {})
        kind, message = str(error.get("kind", kind)), str(error.get("message", message))
    except (ValueError, AttributeError):
        pass
    return RequestError(response.status_code, kind, message, method, path)


def _lost(method: str, path: str, tries: int, last: str) -> AnswerLost:
    return AnswerLost(
        f"{method} {path}: no answer after {tries} tries ({last}); it may have run: send it again later with "
        "the same ids, never as a new step"
    )


class _Base:
    def __init__(self, base_url: str, token: Optional[str], timeout: float, retries: int) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"`base_url` must be an http:// or https:// URL, got {base_url!r}")
        if retries < 0:
            raise ValueError(f"`retries` must be 0 or more, got {retries}")
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.timeout = timeout
        self._headers = {"content-type": "application/json", "accept": "application/json"}
        if token:
            self._headers["authorization"] = f"Bearer {token}"

    def _timeout(self, body: Optional[Mapping[str, Any]]) -> httpx.Timeout:
        # A call that asks the server to wait must not be cut short by the client first.
        wait = float((body or {}).get("wait") or 0)
        return httpx.Timeout(self.timeout + wait)

    @staticmethod
    def _answer(response: httpx.Response, method: str, path: str) -> Any:
        if 400 <= response.status_code < 500:
            raise _refusal(response, method, path)
        try:
            return response.json()
        except ValueError as e:
            raise OnceboxError(f"{method} {path}: the server's answer is not JSON: {e}") from e


class Client(_Base):
    """A client of ``oncebox serve``'s HTTP API.

    ``token`` is a bearer token. The operator's is needed to approve, reject, settle and compensate;
    beyond loopback every request needs one, and an agent's client should hold the callers' token
    (``oncebox serve --caller-token-file``), which calls, reads and reconciles and decides nothing.
    Never give the operator's token to the model.
    """

    def __init__(
        self, base_url: str, token: Optional[str] = None, *, timeout: float = 60.0, retries: int = DEFAULT_RETRIES
    ) -> None:
        super().__init__(base_url, token, timeout, retries)
        self._http = httpx.Client(headers=self._headers)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, path: str, body: Optional[Mapping[str, Any]] = None) -> httpx.Response:
        content = None if body is None else json.dumps(body).encode()
        waits = _backoffs(self.retries)
        last = ""
        for n in range(self.retries + 1):
            try:
                response = self._http.request(
                    method, self.base_url + path, content=content, timeout=self._timeout(body)
                )
                if response.status_code < 500:
                    return response
                last = f"HTTP {response.status_code}"
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {e}"
            if n < self.retries:
                time.sleep(waits[n])
        raise _lost(method, path, self.retries + 1, last)

    def _json(self, method: str, path: str, body: Optional[Mapping[str, Any]] = None) -> Any:
        return self._answer(self._send(method, path, body), method, path)

    def call(
        self, tool: str, args: Mapping[str, Any], *, run_id: str, step_id: str, wait: Optional[float] = None
    ) -> AnyOutcome:
        """Calls ``tool`` with ``args`` for step ``step_id`` of run ``run_id``: the typed outcome.

        The ids come from your workflow's durable state, never from the model. ``wait``: seconds to
        wait for another caller's result of the same step (else ``InProgress`` at once).
        """
        body = _call_body(tool, args, run_id, step_id, wait)
        response = self._send("POST", "/v1/calls", body)
        answer = self._answer(response, "POST", "/v1/calls")
        return outcome_of(answer, run_id, step_id, tool, response.headers.get("oncebox-source"))

    def tools(self) -> Any:
        """The loaded tools and the files that did not load."""
        return self._json("GET", "/v1/tools")

    def operation(self, key: str) -> Any:
        """An operation with its effects and attempts."""
        return self._json("GET", f"/v1/operations/{quote(key, safe='')}")

    def run(self, run_id: str) -> Any:
        """A run's operations and what keeps it open."""
        return self._json("GET", f"/v1/runs/{quote(_check_id('run_id', run_id), safe='')}")

    def reconcile(self, run_id: str) -> Any:
        """Asks each tool's authority what became of the run's unknown steps (acts only on proof)."""
        return self._json("POST", f"/v1/runs/{quote(_check_id('run_id', run_id), safe='')}/reconcile")

    def compensate(self, run_id: str) -> Any:
        """Undoes the run's completed compensatable steps, newest first, each once (operator token)."""
        return self._json("POST", f"/v1/runs/{quote(_check_id('run_id', run_id), safe='')}/compensate")

    def approvals(self, *, pending: bool = False, run: Optional[str] = None) -> list[Any]:
        """Requests for approval (exact params with the token, masked without)."""
        query = "?pending=true" if pending else "?pending=false"
        if run is not None:
            query += f"&run={quote(_check_id('run', run), safe='')}"
        return list(self._json("GET", f"/v1/approvals{query}")["approvals"])

    def approval(self, key: str) -> Any:
        return self._json("GET", f"/v1/approvals/{quote(key, safe='')}")

    def approve(self, request: Mapping[str, Any], *, by: str, note: Optional[str] = None) -> Any:
        """Approves a request for approval as listed (bound to its fingerprint and component; token)."""
        return self._json("POST", *_decision(request, by, note, "approve"))

    def reject(self, request: Mapping[str, Any], *, by: str, note: Optional[str] = None) -> Any:
        """Rejects a request for approval as listed (token)."""
        return self._json("POST", *_decision(request, by, note, "reject"))

    def resolve(self, key: str, *, by: str, committed: Any = None, not_committed: bool = False, note: Optional[str] = None) -> Any:
        """Settles an unknown operation by hand (token)."""
        return self._json("POST", f"/v1/operations/{quote(key, safe='')}/resolve", _resolution(by, committed, not_committed, note))

    def undone_by_hand(self, key: str, *, by: str, note: Optional[str] = None) -> Any:
        """Records that a person undid step `key` by hand (one `compensate()` names `undo-by-hand`):
        its compensation then counts it undone and sends nothing for it (token)."""
        return self._json("POST", *_undone(key, by, note))


def _decision(request: Mapping[str, Any], by: str, note: Optional[str], verb: str) -> tuple[str, dict[str, Any]]:
    if not isinstance(by, str) or not by.strip():
        raise ValueError("`by` names who decides, and is recorded")
    key = request.get("operation_key")
    if not key:
        raise ValueError("`request` must be a request for approval as `approvals()` lists it (with `operation_key`)")
    body: dict[str, Any] = {"fingerprint": request.get("fingerprint"), "component": request.get("component"), "by": by}
    if note is not None:
        body["note"] = note
    return f"/v1/approvals/{quote(str(key), safe='')}/{verb}", body


def _undone(key: str, by: str, note: Optional[str]) -> tuple[str, dict[str, Any]]:
    if not isinstance(by, str) or not by.strip():
        raise ValueError("`by` names who undid the step, and is recorded")
    body: dict[str, Any] = {"by": by}
    if note is not None:
        body["note"] = note
    return f"/v1/operations/{quote(key, safe='')}/undone-by-hand", body


def _resolution(by: str, committed: Any, not_committed: bool, note: Optional[str]) -> dict[str, Any]:
    if (committed is None) == (not not_committed):
        raise ValueError("give exactly one of `committed=OUTPUT` and `not_committed=True`")
    body: dict[str, Any] = {"by": by}
    if not_committed:
        body["not_committed"] = True
    else:
        body["committed"] = committed
    if note is not None:
        body["note"] = note
    return body


class AsyncClient(_Base):
    """The async twin of :class:`Client` (the same methods, awaited)."""

    def __init__(
        self, base_url: str, token: Optional[str] = None, *, timeout: float = 60.0, retries: int = DEFAULT_RETRIES
    ) -> None:
        super().__init__(base_url, token, timeout, retries)
        self._http = httpx.AsyncClient(headers=self._headers)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, method: str, path: str, body: Optional[Mapping[str, Any]] = None) -> httpx.Response:
        content = None if body is None else json.dumps(body).encode()
        waits = _backoffs(self.retries)
        last = ""
        for n in range(self.retries + 1):
            try:
                response = await self._http.request(
                    method, self.base_url + path, content=content, timeout=self._timeout(body)
                )
                if response.status_code < 500:
                    return response
                last = f"HTTP {response.status_code}"
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {e}"
            if n < self.retries:
                await asyncio.sleep(waits[n])
        raise _lost(method, path, self.retries + 1, last)

    async def _json(self, method: str, path: str, body: Optional[Mapping[str, Any]] = None) -> Any:
        return self._answer(await self._send(method, path, body), method, path)

    async def call(
        self, tool: str, args: Mapping[str, Any], *, run_id: str, step_id: str, wait: Optional[float] = None
    ) -> AnyOutcome:
        """See :meth:`Client.call`."""
        body = _call_body(tool, args, run_id, step_id, wait)
        response = await self._send("POST", "/v1/calls", body)
        answer = self._answer(response, "POST", "/v1/calls")
        return outcome_of(answer, run_id, step_id, tool, response.headers.get("oncebox-source"))

    async def tools(self) -> Any:
        return await self._json("GET", "/v1/tools")

    async def operation(self, key: str) -> Any:
        return await self._json("GET", f"/v1/operations/{quote(key, safe='')}")

    async def run(self, run_id: str) -> Any:
        return await self._json("GET", f"/v1/runs/{quote(_check_id('run_id', run_id), safe='')}")

    async def reconcile(self, run_id: str) -> Any:
        return await self._json("POST", f"/v1/runs/{quote(_check_id('run_id', run_id), safe='')}/reconcile")

    async def compensate(self, run_id: str) -> Any:
        return await self._json("POST", f"/v1/runs/{quote(_check_id('run_id', run_id), safe='')}/compensate")

    async def approvals(self, *, pending: bool = False, run: Optional[str] = None) -> list[Any]:
        query = "?pending=true" if pending else "?pending=false"
        if run is not None:
            query += f"&run={quote(_check_id('run', run), safe='')}"
        return list((await self._json("GET", f"/v1/approvals{query}"))["approvals"])

    async def approval(self, key: str) -> Any:
        return await self._json("GET", f"/v1/approvals/{quote(key, safe='')}")

    async def approve(self, request: Mapping[str, Any], *, by: str, note: Optional[str] = None) -> Any:
        return await self._json("POST", *_decision(request, by, note, "approve"))

    async def reject(self, request: Mapping[str, Any], *, by: str, note: Optional[str] = None) -> Any:
        return await self._json("POST", *_decision(request, by, note, "reject"))

    async def resolve(
        self, key: str, *, by: str, committed: Any = None, not_committed: bool = False, note: Optional[str] = None
    ) -> Any:
        return await self._json(
            "POST", f"/v1/operations/{quote(key, safe='')}/resolve", _resolution(by, committed, not_committed, note)
        )

    async def undone_by_hand(self, key: str, *, by: str, note: Optional[str] = None) -> Any:
        return await self._json("POST", *_undone(key, by, note))
