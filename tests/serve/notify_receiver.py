"""A receiver of oncebox's notifications: python3 notify_receiver.py PORT

Checks each notification's signature and age before it trusts it, and acts on each event once,
however many times it is sent (a send whose answer was lost is sent again, with the same key).
ONCEBOX_NOTIFY_SECRET holds the `[notify]` secret. Each new event is printed as a JSON line.
"""
import hashlib
import hmac
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = os.environ["ONCEBOX_NOTIFY_SECRET"].encode()
TOLERANCE_S = 300  # refuse a signature older (or newer) than five minutes: a replay
seen = set()  # a real receiver keeps the keys it acted on in its own database


def signed(header, body):
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    stamp = fields.get("t", "")
    if not stamp.isdigit() or abs(time.time() - int(stamp)) > TOLERANCE_S:
        return False
    expected = hmac.new(SECRET, stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, fields.get("v1", ""))


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if not signed(self.headers.get("Oncebox-Signature", ""), body):
            self.send_response(401)
            self.end_headers()
            return
        key = self.headers["Idempotency-Key"]
        if key in seen:
            print("repeat", key, file=sys.stderr, flush=True)
        else:
            seen.add(key)
            event = json.loads(body)
            print(json.dumps(event), flush=True)  # page someone, post to the team's channel...
        self.send_response(204)  # a 2xx: delivered; anything else is sent again later
        self.end_headers()

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Receiver).serve_forever()
