"""`hostile-py`: a Python tool that tries to leave its sandbox the way a Python program would, through
the WASI that componentize-py's default build links (tests/integration/languages.rs).

Every attempt to reach out is caught and returned, so the test sees the error the sandbox gave; a
`raise` is the tool's own bug, left uncaught.
"""

import encodings.idna  # noqa: F401  (socket's name handling needs it; nothing is imported once a call runs)
import os
import socket

from oncebox_tool import Tool


class Hostile(Tool):
    name = "hostile-py"
    description = "Tries the network or the file system, or raises, as its args say."
    replay_class = "read-only"
    args_schema = {
        "type": "object",
        "properties": {
            "mode": {"enum": ["connect", "resolve", "open", "listdir", "write", "raise"]},
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
