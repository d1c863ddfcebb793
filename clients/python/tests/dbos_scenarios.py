"""DBOS scenarios for tests/integration/clients.rs: python dbos_scenarios.py start WORKFLOW ORDER | recover

Real DBOS on SQLite (its system database in $WORK), a real oncebox serve ($ONCEBOX_URL) and the
example provider ($PROVIDER_URL), where the Rust test counts the charges. DBOS records a step's
output after the step returns: `start` is killed (SIGKILL) inside the charge step, after the
provider's commit and before that record; `recover` launches DBOS again, which recovers the
pending workflows and runs the step again. Each line printed is one JSON event.
"""

import json
import os
import signal
import sys
from typing import Any

import httpx
from dbos import DBOS, DBOSConfig, SetWorkflowID

import oncebox
import oncebox.dbos

URL = os.environ["ONCEBOX_URL"]
PROVIDER = os.environ["PROVIDER_URL"]
WORK = os.environ["WORK"]

config: DBOSConfig = {
    "name": "oncebox-scenarios",
    "system_database_url": f"sqlite:///{os.path.join(WORK, 'dbos.sqlite')}",
    "log_level": "WARNING",
}
DBOS(config=config)
client = oncebox.Client(URL)
operator = oncebox.Client(URL, token=os.environ["ONCEBOX_TOKEN"])


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def charge_args(order: str) -> dict:
    return {"order_id": order, "amount_cents": 1200, "currency": "eur", "payment_method": "pm_card_visa"}


def killed_here() -> None:
    """Dies after the charge, before DBOS records the step's output (when the test asks for it)."""
    if os.environ.get("KILL_AFTER_CHARGE"):
        os.kill(os.getpid(), signal.SIGKILL)


@DBOS.step()
def charge(order: str) -> dict:
    outcome = oncebox.dbos.call(client, "charge", charge_args(order))
    emit("charged", run_id=outcome.run_id, step_id=outcome.step_id, replayed=outcome.replayed, payment=outcome.output["id"])
    killed_here()
    return outcome.output


@DBOS.step()
def charge_plain(order: str) -> dict:
    """The control: the same step without oncebox (a POST with no stable key)."""
    response = httpx.post(f"{PROVIDER}/payments", json=charge_args(order))
    response.raise_for_status()
    emit("charged-plain", payment=response.json()["id"])
    killed_here()
    return response.json()


@DBOS.workflow()
def pay(order: str) -> str:
    return charge(order)["id"]


@DBOS.workflow()
def pay_plain(order: str) -> str:
    return charge_plain(order)["id"]


@DBOS.step()
def ship(order: str) -> None:
    raise RuntimeError(f"the warehouse cannot ship {order}")


@DBOS.step()
def compensate(run_id: str) -> Any:
    """Undoes the run's compensatable steps through the server (each once; the operator's token)."""
    return operator.compensate(run_id)


@DBOS.workflow()
def pay_then_ship(order: str) -> Any:
    payment = charge(order)
    try:
        ship(order)
    except RuntimeError as e:
        report = compensate(f"dbos:{DBOS.workflow_id}")
        return {"payment": payment["id"], "shipped": False, "why": str(e), "compensation": report}
    return {"payment": payment["id"], "shipped": True}


WORKFLOWS = {"pay": pay, "pay_plain": pay_plain, "pay_then_ship": pay_then_ship}


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    DBOS.launch()
    if command == "start":
        workflow, order = rest
        with SetWorkflowID(f"wf-{order}"):
            result = WORKFLOWS[workflow](order)
        emit("not-killed", result=result)
    else:
        # DBOS.launch() recovered the pending workflows; wait for each one's result.
        for order in rest:
            result = DBOS.retrieve_workflow(f"wf-{order}").get_result()
            emit("recovered", order=order, result=result)
    DBOS.destroy()
