"""`hostile-py`: a Python tool that tries to leave its sandbox the way a Python program would, through
the WASI that componentize-py's default build links (tests/integration/languages.rs).

Every attempt to reach out is caught and returned, so the test sees the error the sandbox gave; a
`raise` is the tool's own bug, left uncaught, before or after an effect (a charge at the
configured `base_url`).
"""

import encodings.idna  # noqa: F401  (socket's name handling needs it; nothing is imported once a call runs)
import os
import socket

from oncebox_tool import Permanent, Tool, config, http


class Hostile(Tool):
    name = "hostile-py"
    description = "Tries the network or the file system, or raises, as its args say."
    replay_class = "idempotent-write"
    args_schema = {
        "type": "object",
        "properties": {
            "mode": {"enum": ["connect", "resolve", "open", "listdir", "write", "raise", "charge-then-raise"]},
            "target": {"type": "string"},
            "secret": {"type": "string"},
        },
        "required": ["mode"],
        "additionalProperties": False,
    }
    sensitive = ["/secret"]

    def invoke(self, args):
        mode, target = args["mode"], args.get("target", "")
        if mode == "raise":
            raise ValueError(f"the tool's own bug, holding {args.get('secret')}")
        if mode == "charge-then-raise":
            base = config("base_url")
            if base is None:
                raise Permanent("config `base_url` is not set")
            order = {"order_id": target, "amount_cents": 100, "currency": "eur", "payment_method": "pm_card"}
            http.post_json("charge", f"{base}/payments", order)
            raise KeyError("the tool's own bug, after its charge")
        try:
            if mode == "connect":
                # A raw TCP connect to an IP address: no name lookup on the way.
                host, port = target.rsplit(":", 1)
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.settimeout(2)
                    s.connect((host, int(port)))
            elif mode == "resolve":
                socket.getaddrinfo(target, 80)
            elif mode == "open":
                with open(target) as f:
                    f.read()
            elif mode == "listdir":
                os.listdir(target)
            elif mode == "write":
                with open(target, "w") as f:
                    f.write("escaped")
        except OSError as e:
            return {"reached": False, "error": f"{type(e).__name__}: {e}"}
        return {"reached": True}
