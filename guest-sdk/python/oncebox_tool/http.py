"""HTTP: reads (:func:`get`) and effects (:func:`post_json`, :func:`send`).

Every function taking a ``label`` is an effect: the host derives its key from the operation, the
label and how many times this invocation used the label, records it before and after dispatch,
sends the key as ``Idempotency-Key``, and answers it from the record when the operation runs
again. Labels are constants ("charge", "send-receipt"): a label built from the time, a random
number or a counter kept outside the args changes the key, and the downstream sees a new request.

What the host does with answers: any definitive answer (2xx, 4xx) is returned and recorded. 429
raises :class:`~oncebox_tool.RateLimited`; a timeout, a reset, 408, 409 or a 5xx may come after
the downstream committed, so they raise :class:`~oncebox_tool.MayHaveCommitted` (resent with the
same key only where the operator declared that the host honours keys).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence, Tuple

from . import _json, _wit
from .errors import Permanent

Headers = Sequence[Tuple[str, str]]


@dataclass
class Response:
    """An HTTP answer: ``status``, ``headers`` (a list of ``(name, value)``), ``body`` (bytes)."""

    status: int
    headers: list = field(default_factory=list)
    body: bytes = b""

    def is_success(self) -> bool:
        """Any 2xx: 200, 201 Created, 202 Accepted, 204 No Content.

        Never compare with ``200`` alone: a downstream that answers 201 has done the work, and a
        tool that calls that a failure records its every commit as one.
        """
        return 200 <= self.status < 300

    def json(self) -> Any:
        """The body parsed as JSON; a body that does not parse raises :class:`Permanent`."""
        return _json.loads(self.body)

    def json_if_success(self) -> Any:
        """The body as JSON when the status is any 2xx.

        Any other status the tool sees (3xx, or a 4xx refusal: the host turns 408, 409, 429 and
        5xx into errors before the tool sees them) raises :class:`Permanent` naming it. Check the
        statuses that mean something to your tool (402: card declined) before calling this.
        """
        if self.is_success():
            return self.json()
        body = self.body.decode("utf-8", errors="replace")[:200]
        raise Permanent(f"the downstream answered {self.status}: {body}")

    def text(self) -> str:
        """The body decoded as UTF-8 (invalid bytes replaced)."""
        return self.body.decode("utf-8", errors="replace")

    def header(self, name: str) -> Optional[str]:
        """The first header with this name, compared case-insensitively."""
        wanted = name.lower()
        for key, value in self.headers:
            if key.lower() == wanted:
                return value
        return None


def _response(wit_response) -> Response:
    return Response(
        status=wit_response.status,
        headers=[(k, v) for k, v in wit_response.headers],
        body=bytes(wit_response.body),
    )


def _headers(headers: Optional[Iterable]) -> list:
    if headers is None:
        return []
    if hasattr(headers, "items"):
        headers = headers.items()
    return [(str(k), str(v)) for k, v in headers]


def get(url: str, headers: Optional[Iterable] = None) -> Response:
    """A side-effect-free GET to an origin granted to the tool. No ledger entry."""
    reads = _wit.reads()
    return _response(_wit.call(reads.http_get, url, _headers(headers)))


def post_json(label: str, url: str, body: Any) -> Response:
    """An HTTP effect: POST ``body`` as JSON. The host adds ``Idempotency-Key``."""
    return send(label, "POST", url, [("content-type", "application/json")], _json.dump_bytes(body))


def send(
    label: str,
    method: str,
    url: str,
    headers: Optional[Iterable] = None,
    body: bytes | str = b"",
) -> Response:
    """Any HTTP effect. ``headers``: pairs or a dict; the tool may not set ``Idempotency-Key`` nor ``Host``."""
    effects = _wit.effects(f"http.send({label!r})")
    request = effects.HttpRequest(
        method=method,
        url=url,
        headers=_headers(headers),
        body=_json.as_bytes(body, "the body"),
    )
    return _response(_wit.call(effects.http, label, request))
