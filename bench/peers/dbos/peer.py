"""The DBOS peer of oncebox's bench: one workflow whose one step POSTs a charge to the provider.

`python peer.py --db URL --provider URL --prefix P --warmup W --n N --callers C --each E`

The workflow `charge` is one `@DBOS.step` making one POST /payments, the same request oncebox's
`charge` tool makes, with an `Idempotency-Key` derived from the step: the workflow's id (set by the
caller, one per step of the bench) and the step's id within it. DBOS is a library: the caller runs
the workflow in its own process, as oncebox's bench calls `Host::call`, and a call returns once
the workflow's output is durable in the system database at `--db`.

The bench's order ids (also the workflows' ids): `P-w{i}` for the warm-up, `P-s{i}` timed one after
another, `P-c{c}-{i}` for caller `c` of `C` concurrent callers (threads, `E` steps each). Prints
one line of JSON: the version, the sequential samples in seconds, and the concurrent run's elapsed
seconds. The bench computes the percentiles and the rate, as for every system, and counts the
payments at the provider.
"""

import argparse
import http.client
import importlib.metadata
import json
import sqlite3
import sys
import threading
import time
import urllib.parse

from dbos import DBOS, SetWorkflowID

_local = threading.local()
_provider: urllib.parse.SplitResult


def _connection() -> http.client.HTTPConnection:
    # One kept-alive connection per thread, as the other systems' HTTP clients keep theirs.
    if getattr(_local, "conn", None) is None:
        _local.conn = http.client.HTTPConnection(_provider.hostname, _provider.port, timeout=10)
    return _local.conn


@DBOS.step(retries_allowed=True, max_attempts=5, interval_seconds=0.1)
def post_payment(order: dict) -> dict:
    key = f"dbos-{DBOS.workflow_id}-{DBOS.step_id}"
    body = json.dumps(order)
    headers = {"content-type": "application/json", "idempotency-key": key}
    try:
        conn = _connection()
        conn.request("POST", "/payments", body=body, headers=headers)
        response = conn.getresponse()
        text = response.read().decode()
    except (OSError, http.client.HTTPException):
        # A dropped kept-alive connection: the next attempt opens a new one and sends the same key.
        _local.conn = None
        raise
    if response.status >= 300:
        raise RuntimeError(f"payments answered {response.status}: {text}")
    return json.loads(text)


@DBOS.workflow()
def charge(order: dict) -> dict:
    return post_payment(order)


def step(order_id: str) -> None:
    order = {"order_id": order_id, "amount_cents": 100, "currency": "eur", "payment_method": "pm_card"}
    with SetWorkflowID(order_id):
        payment = charge(order)
    if payment.get("order_id") != order_id:
        raise RuntimeError(f"a step answered another order: {payment}")


def main() -> int:
    global _provider
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--callers", type=int, required=True)
    parser.add_argument("--each", type=int, required=True)
    args = parser.parse_args()
    _provider = urllib.parse.urlsplit(args.provider)

    DBOS(config={"name": "oncebox-bench", "system_database_url": args.db, "log_level": "WARNING"})
    DBOS.launch()
    try:
        for i in range(args.warmup):
            step(f"{args.prefix}-w{i}")
        samples = []
        for i in range(args.n):
            start = time.perf_counter()
            step(f"{args.prefix}-s{i}")
            samples.append(time.perf_counter() - start)

        failures = []

        def caller(c: int) -> None:
            try:
                for i in range(args.each):
                    step(f"{args.prefix}-c{c}-{i}")
            except Exception as e:  # noqa: BLE001 - reported to the bench, which fails the run
                failures.append(f"caller {c}: {e!r}")

        threads = [threading.Thread(target=caller, args=(c,)) for c in range(args.callers)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        if failures:
            print(f"{len(failures)} callers failed, first: {failures[0]}", file=sys.stderr)
            return 1
    finally:
        DBOS.destroy()
    result = {"version": importlib.metadata.version("dbos"), "samples_s": samples, "concurrent_s": elapsed}
    if args.db.startswith("sqlite:///"):
        # DBOS leaves `synchronous` at what this process's SQLite gives a new connection.
        with sqlite3.connect(args.db[len("sqlite:///") :]) as conn:
            level = conn.execute("PRAGMA synchronous").fetchone()[0]
        result["sqlite_synchronous"] = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(level, str(level))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
