"""The SDK's glue on the build machine's Python, against fake bindings (no componentize-py run).

    python -m unittest discover -s guest-sdk/python/tests

The fakes mirror what componentize-py 0.25.1 generates for the contract (`wit_world.imports.*`,
`wit_world.exports.reconcile`, `componentize_py_types.Err`); the real thing is exercised by
building the example tools and running them under `oncebox test`.
"""

import json
import sys
import types as pytypes
import unittest
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def install_fakes(effects=True):
    for name in [m for m in sys.modules if m.startswith(("wit_world", "componentize_py_types", "fake_tool"))]:
        del sys.modules[name]

    def module(name, **attrs):
        m = pytypes.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    @dataclass(frozen=True)
    class Err(Exception):
        value: object

    module("componentize_py_types", Err=Err)

    def variant(name):
        return dataclass(type(name, (), {"__annotations__": {"value": object}}))

    @dataclass
    class RateLimit:
        retry_after_ms: int
        message: str

    @dataclass
    class Manifest:
        name: str
        version: str
        description: str
        class_: object
        input_schema: str
        compensated_by: object
        compensation_args: list
        consequence: object
        sensitive: list

    @dataclass
    class HttpResponse:
        status: int
        headers: list
        body: bytes

    class ReplayClass:
        READ_ONLY, IDEMPOTENT_WRITE, COMPENSATABLE, IRREVERSIBLE = range(4)

    types = module(
        "wit_world.imports.types",
        ToolError_Transient=variant("ToolError_Transient"),
        ToolError_RateLimited=variant("ToolError_RateLimited"),
        ToolError_Permanent=variant("ToolError_Permanent"),
        ToolError_UnknownOutcome=variant("ToolError_UnknownOutcome"),
        RateLimit=RateLimit,
        Manifest=Manifest,
        HttpResponse=HttpResponse,
        ReplayClass=ReplayClass,
    )
    world = {"gets": {}, "sent": [], "kv": {}}

    def http_get(url, headers):
        status, body = world["gets"].get(url, (404, b""))
        if status == 503:
            raise Err(types.ToolError_UnknownOutcome("503"))
        return HttpResponse(status, [("Content-Type", "application/json")], body)

    def kv_get(namespace, key):
        entry = world["kv"].get((namespace, key))
        return None if entry is None else pytypes.SimpleNamespace(value=entry[0], version=entry[1])

    module("wit_world.imports.reads", http_get=http_get, kv_get=kv_get)
    module("wit_world.imports.config", get=lambda key: {"base_url": "http://b"}.get(key))
    if effects:
        @dataclass
        class HttpRequest:
            method: str
            url: str
            headers: list
            body: bytes

        def http(label, request):
            world["sent"].append((label, request))
            if label == "rate":
                raise Err(types.ToolError_RateLimited(RateLimit(250, "slow")))
            return HttpResponse(201, [], request.body)

        def kv_set_if(label, namespace, key, value, expected):
            current = world["kv"].get((namespace, key), (None, 0))[1]
            if current != expected:
                return False
            world["kv"][(namespace, key)] = (value, current + 1)
            return True

        module("wit_world.imports.effects", HttpRequest=HttpRequest, http=http, kv_set_if=kv_set_if,
               operation_key=lambda: "op-key")
    module(
        "wit_world.exports.reconcile",
        Reconciliation_Committed=variant("Reconciliation_Committed"),
        Reconciliation_NotCommitted=dataclass(type("Reconciliation_NotCommitted", (), {})),
        Reconciliation_StillUnknown=dataclass(type("Reconciliation_StillUnknown", (), {})),
    )
    import oncebox_tool._wit

    oncebox_tool._wit.preloaded = False
    return world, Err, types


TOOL = '''
from oncebox_tool import Permanent, Tool, http, kv, lookup, pick, STILL_UNKNOWN

class Charge(Tool):
    name = "charge-py"
    description = "Charges."
    replay_class = "compensatable"
    args_schema = {"type": "object"}
    compensated_by = "refund"
    compensation_args = {"order_id": "/args/order_id"}
    sensitive = ["/payment_method"]

    def invoke(self, args):
        if args.get("bug"):
            raise ZeroDivisionError("bug")
        if args.get("count"):
            return kv.update_json("count", "n", lambda n: (n or 0) + 1)
        response = http.post_json(args.get("label", "charge"), "http://b/payments", args)
        if response.status == 402:
            raise Permanent("card declined")
        return pick(response.json_if_success(), "order_id")

    def reconcile(self, effect_key, args):
        return lookup(f"http://b/payments/by-key/{effect_key}", output=lambda b: pick(b, "id"))
'''


def export(source=TOOL, replay_class="compensatable", effects=True):
    world, err, types = install_fakes(effects)
    module = pytypes.ModuleType("fake_tool")
    exec(compile(source, "fake_tool.py", "exec"), module.__dict__)
    sys.modules["fake_tool"] = module
    from oncebox_tool import _glue

    return _glue.export("fake_tool", replay_class, "1.2.3"), world, err, types


class Glue(unittest.TestCase):
    def test_describe(self):
        ex, _, _, types = export()
        m = ex.describe()
        self.assertEqual((m.name, m.version, m.class_), ("charge-py", "1.2.3", types.ReplayClass.COMPENSATABLE))
        self.assertEqual(m.compensation_args, [("order_id", "/args/order_id")])
        self.assertEqual(m.sensitive, ["/payment_method"])
        self.assertEqual(json.loads(m.input_schema), {"type": "object"})

    def test_invoke_and_errors(self):
        ex, world, err, types = export()
        self.assertEqual(json.loads(ex.invoke('{"order_id": "o-1"}')), {"order_id": "o-1"})
        self.assertEqual(world["sent"][0][1].headers, [("content-type", "application/json")])
        with self.assertRaises(err) as caught:
            ex.invoke('{"label": "rate"}')
        self.assertEqual((caught.exception.value.value.retry_after_ms, caught.exception.value.value.message), (250, "slow"))
        with self.assertRaises(err) as caught:
            ex.invoke("not json")
        self.assertIsInstance(caught.exception.value, types.ToolError_Permanent)
        with self.assertRaises(ZeroDivisionError):  # a bug propagates: the component traps
            ex.invoke('{"bug": true}')
        self.assertEqual(ex.invoke('{"count": true}'), "1")
        self.assertEqual(ex.invoke('{"count": true}'), "2")

    def test_reconcile(self):
        ex, world, _, _ = export()
        world["gets"]["http://b/payments/by-key/k1"] = (200, b'{"id": "p1", "x": 2}')
        world["gets"]["http://b/payments/by-key/k2"] = (200, b"{not json")
        world["gets"]["http://b/payments/by-key/k3"] = (503, b"")
        world["gets"]["http://b/payments/by-key/k4"] = (500, b"")
        self.assertEqual(ex.reconcile("k1", "{}").value, '{"id":"p1"}')
        self.assertEqual(type(ex.reconcile("k0", "{}")).__name__, "Reconciliation_NotCommitted")
        for key in ["k2", "k3", "k4"]:
            self.assertEqual(type(ex.reconcile(key, "{}")).__name__, "Reconciliation_StillUnknown", key)

    def test_build_checks(self):
        from oncebox_tool._glue import BuildError

        with self.assertRaisesRegex(BuildError, "class is 'read-only'"):
            export(replay_class="read-only", effects=False)
        with self.assertRaisesRegex(BuildError, "define `def reconcile"):
            export(TOOL.replace("def reconcile", "def not_reconcile"))
        with self.assertRaisesRegex(BuildError, "exactly one subclass"):
            export("import oncebox_tool\n")

    def test_read_only_world_has_no_effects(self):
        source = TOOL.replace('replay_class = "compensatable"', 'replay_class = "read-only"').replace(
            "def reconcile", "def _reconcile"
        )
        ex, _, _, _ = export(source, replay_class="read-only", effects=False)
        # A permanent tool-error (nothing took effect, no retry helps), as in the JS SDK.
        with self.assertRaises(Exception) as caught:
            ex.invoke('{"order_id": "o-1"}')
        self.assertEqual(type(caught.exception.value).__name__, "ToolError_Permanent")
        self.assertIn("cannot make effects", caught.exception.value.value)


if __name__ == "__main__":
    unittest.main()
