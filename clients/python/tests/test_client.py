"""The client's own rules, against a real local HTTP server (no oncebox needed): a lost answer is
sent again with the same ids, within the bound; a 4xx is raised, not resent; outcomes are typed.

python -m unittest discover -s clients/python/tests -p 'test_*.py'
"""

import asyncio
import json
import socket
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import oncebox


class Script:
    """What the server does with each request, in order: "drop" (closes the connection without
    an answer), an int (that status, with an error body), or a dict (200 with it)."""

    def __init__(self, *steps):
        self.steps = list(steps)
        self.bodies = []


def serve(script):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def handle_one(self):
            length = int(self.headers.get("content-length") or 0)
            script.bodies.append(self.rfile.read(length))
            step = script.steps.pop(0) if script.steps else "drop"
            if step == "drop":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if isinstance(step, int):
                body, status = {"error": {"kind": "bad-request", "message": "no such tool"}}, step
            else:
                body, status = step, 200
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.send_header("oncebox-source", "fresh")
            self.end_headers()
            self.wfile.write(data)

        do_POST = handle_one
        do_GET = handle_one

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


COMPLETED = {"status": "completed", "replayed": True, "attempts": 1, "operation_key": "op-1", "output": {"id": "pay_1"}}
ARGS = {"order_id": "o-1", "amount_cents": 1200}


class Resending(unittest.TestCase):
    def test_a_dropped_answer_is_sent_again_with_the_same_ids(self):
        script = Script("drop", 502, COMPLETED)
        server, url = serve(script)
        with oncebox.Client(url) as client:
            outcome = client.call("charge", ARGS, run_id="r-1", step_id="s-1")
        server.shutdown()
        server.server_close()
        self.assertIsInstance(outcome, oncebox.Completed)
        self.assertEqual((outcome.status, outcome.replayed, outcome.operation_key), ("completed", True, "op-1"))
        self.assertEqual(outcome.output, {"id": "pay_1"})
        self.assertEqual(len(script.bodies), 3, "dropped, 502, answered")
        sent = [json.loads(b) for b in script.bodies]
        self.assertTrue(all(s == sent[0] for s in sent), sent)
        self.assertEqual((sent[0]["run_id"], sent[0]["step_id"]), ("r-1", "s-1"))

    def test_the_async_client_resends_the_same_way(self):
        script = Script("drop", COMPLETED)
        server, url = serve(script)

        async def go():
            async with oncebox.AsyncClient(url) as client:
                return await client.call("charge", ARGS, run_id="r-2", step_id="s-2", wait=5)

        outcome = asyncio.run(go())
        server.shutdown()
        server.server_close()
        self.assertIsInstance(outcome, oncebox.Completed)
        self.assertEqual(len(script.bodies), 2)
        self.assertEqual(script.bodies[0], script.bodies[1])
        self.assertEqual(json.loads(script.bodies[0])["wait"], 5.0)

    def test_resending_is_bounded(self):
        script = Script()  # drops every request
        server, url = serve(script)
        with oncebox.Client(url, retries=2) as client:
            with self.assertRaises(oncebox.AnswerLost) as raised:
                client.call("charge", ARGS, run_id="r-3", step_id="s-3")
        server.shutdown()
        server.server_close()
        self.assertEqual(len(script.bodies), 3, "the first try and two resends")
        self.assertIn("same ids", str(raised.exception))

    def test_a_4xx_is_raised_and_not_resent(self):
        script = Script(404, COMPLETED)
        server, url = serve(script)
        with oncebox.Client(url) as client:
            with self.assertRaises(oncebox.RequestError) as raised:
                client.call("nope", ARGS, run_id="r-4", step_id="s-4")
        server.shutdown()
        server.server_close()
        self.assertEqual(len(script.bodies), 1)
        self.assertEqual((raised.exception.status_code, raised.exception.kind), (404, "bad-request"))


class Outcomes(unittest.TestCase):
    def test_each_status_is_its_own_type(self):
        answers = {
            "failed": oncebox.Failed,
            "unknown": oncebox.Unknown,
            "awaiting-approval": oncebox.AwaitingApproval,
            "in-progress": oncebox.InProgress,
            "conflict": oncebox.Conflict,
        }
        script = Script(*({"status": s, "replayed": False, "attempts": 0, "operation_key": "k"} for s in answers))
        server, url = serve(script)
        with oncebox.Client(url) as client:
            for status, kind in answers.items():
                outcome = client.call("charge", ARGS, run_id="r-5", step_id=status)
                self.assertIsInstance(outcome, kind)
                self.assertEqual(outcome.status, status)
        server.shutdown()
        server.server_close()

    def test_a_step_undone_by_hand_is_said_with_who_and_why(self):
        word = {"recorded": True, "by": "ops", "recorded_as": "k2"}
        script = Script(word, word)
        server, url = serve(script)
        client = oncebox.Client(url, token="t")
        self.assertEqual(client.undone_by_hand("op/1", by="ops", note="refund R-1"), word)
        self.assertEqual(json.loads(script.bodies[0]), {"by": "ops", "note": "refund R-1"})
        async def go():
            async with oncebox.AsyncClient(url, token="t") as client:
                return await client.undone_by_hand("op/1", by="ops")

        self.assertEqual(asyncio.run(go()), word)
        self.assertEqual(json.loads(script.bodies[1]), {"by": "ops"})
        with self.assertRaises(ValueError):
            client.undone_by_hand("op/1", by=" ")
        self.assertEqual(len(script.bodies), 2, "nothing sent for the refused one")
        server.shutdown()
        server.server_close()

    def test_bad_input_is_refused_before_sending(self):
        client = oncebox.Client("http://127.0.0.1:9")
        for bad in [dict(run_id="", step_id="s"), dict(run_id="r", step_id=None), dict(run_id="r\u200b\n", step_id="s")]:
            with self.assertRaises(ValueError):
                client.call("charge", ARGS, **bad)
        with self.assertRaises(ValueError):
            client.call("charge", ["not", "an", "object"], run_id="r", step_id="s")
        with self.assertRaises(ValueError):
            oncebox.Client("127.0.0.1:7420")


if __name__ == "__main__":
    unittest.main()
