"""`charge-py`: charges an order once. Compensatable (undone by `refund`), reconciles by effect key.

The Python twin of example-tools/charge.
"""

from oncebox_tool import STILL_UNKNOWN, Permanent, Tool, config, http, lookup, pick


class Charge(Tool):
    name = "charge-py"
    description = "Charges an order's payment method once."
    replay_class = "compensatable"
    args_schema = {
        "type": "object",
        "properties": {
            "order_id": {"type": "string"},
            "amount_cents": {"type": "integer", "minimum": 0},
            "currency": {"type": "string"},
            "payment_method": {"type": "string"},
        },
        "required": ["order_id", "amount_cents", "currency", "payment_method"],
        "additionalProperties": False,
    }
    compensated_by = "refund"
    # refund's args, from this operation's: its order_id and the amount actually charged.
    compensation_args = {"order_id": "/args/order_id", "amount_cents": "/output/amount_cents"}
    sensitive = ["/payment_method"]

    def invoke(self, args):
        # The host sends `Idempotency-Key` and records the answer: a retry never charges twice.
        response = http.post_json("charge", f"{base_url()}/payments", args)
        if response.is_success():
            return payment(response.json())
        if response.status == 402:
            raise Permanent("card declined")
        raise Permanent(f"payments answered {response.status}")

    def reconcile(self, effect_key, args):
        # The answer to the effect was lost: ask the provider whether it knows the key (the
        # Idempotency-Key the host sent). The lookup is a GET, under the tool's http grant.
        base = config("base_url")
        if base is None:
            return STILL_UNKNOWN
        return lookup(f"{base}/payments/by-key/{effect_key}", output=payment)


def payment(body):
    """What the tool returns (and records): the payment's id, order, amount and status."""
    return pick(body, "id", "order_id", "amount_cents", "status")


def base_url():
    base = config("base_url")
    if base is None:
        raise Permanent("config `base_url` is not set")
    return base
