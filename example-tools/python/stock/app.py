"""`stock-py`: how many units of a SKU are available. Read-only: its world cannot even link an effect.

The Python twin of example-tools/stock.
"""

from oncebox_tool import Permanent, Tool, Transient, config, http, pick


class Stock(Tool):
    name = "stock-py"
    description = "Tells how many units of a SKU are available."
    replay_class = "read-only"
    args_schema = {
        "type": "object",
        "properties": {"sku": {"type": "string"}},
        "required": ["sku"],
        "additionalProperties": False,
    }

    def invoke(self, args):
        base = config("base_url")
        if base is None:
            raise Permanent("config `base_url` is not set")
        # A read: no ledger entry, retried freely.
        response = http.get(f"{base}/inventory/{args['sku']}")
        if response.is_success():
            return pick(response.json(), "sku", "available")
        raise Transient(f"inventory answered {response.status}")
