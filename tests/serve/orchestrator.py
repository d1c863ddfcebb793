"""An orchestrator loop for oncebox serve: python3 orchestrator.py http://127.0.0.1:7420 ORDER

Each step's identity comes from the orchestrator's own durable plan (the run is the order, the
step its place in the plan), never from the model. Sending a step again, after a timeout, a
crash or a restart, is always safe: oncebox answers it from its ledger instead of doing it twice.
"""
import json
import sys
import time
import urllib.error
import urllib.request


def call(base, run_id, step_id, tool, args):
    body = {"run_id": run_id, "step_id": step_id, "tool": tool, "args": args, "wait": 30}
    request = urllib.request.Request(
        f"{base}/v1/calls", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    for _ in range(10):
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.load(response)
        except urllib.error.HTTPError as e:
            if e.code < 500:
                raise  # a bad request: fix it, do not resend it
        except (urllib.error.URLError, TimeoutError):
            pass  # the answer was lost: the same ids again, never new ones
        time.sleep(1)
    raise RuntimeError(f"{step_id}: no answer")


def run(base, order):
    run_id = f"order-{order}"
    plan = [
        ("charge", {"order_id": order, "amount_cents": 1200, "currency": "eur", "payment_method": "pm_card_visa"}),
        ("fulfill", {"order_id": order, "address": "1 Main St", "items": [{"sku": "sku-1", "quantity": 1}]}),
    ]
    for n, (tool, args) in enumerate(plan):
        step_id = f"{n}-{tool}"
        outcome = call(base, run_id, step_id, tool, args)
        print(json.dumps({"step": step_id, "status": outcome["status"], "replayed": outcome["replayed"]}))
        if outcome["status"] == "awaiting-approval":
            return "a person must approve it in the console; run again afterwards"
        if outcome["status"] == "unknown":
            return f"reconcile first: POST {base}/v1/runs/{run_id}/reconcile"
        if outcome["status"] != "completed":
            return f"{step_id}: {outcome['status']}: {outcome.get('error')}"
    return "done"


if __name__ == "__main__":
    print(json.dumps({"result": run(sys.argv[1], sys.argv[2])}))
