"""How `oncebox.langgraph` numbers the tool calls ToolNode runs at once: by their place among the
calls of the same tool (as the message names it) in the message that asked for them.

python -m unittest discover -s clients/python/tests -p 'test_*.py' (needs langgraph installed)
"""

import unittest
from types import SimpleNamespace

try:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    import oncebox.langgraph as olg
except ImportError:  # the client without its langgraph extra
    olg = None


def runtime(state, call_id):
    return SimpleNamespace(state=state, tool_call_id=call_id)


def message(*calls):
    return AIMessage("", tool_calls=[{"name": name, "args": {}, "id": id} for name, id in calls])


@unittest.skipIf(olg is None, "langgraph is not installed")
class NthCall(unittest.TestCase):
    def test_each_call_of_a_tool_has_its_own_place_and_other_tools_do_not_count(self):
        asked = message(("charge", "a"), ("refund", "b"), ("charge", "c"), ("charge", "d"))
        state = {"messages": [HumanMessage("go"), asked]}
        self.assertEqual([olg.nth_call(runtime(state, i)) for i in "abcd"], [0, 0, 1, 2])

    def test_a_prefixed_name_counts_as_the_message_names_it(self):
        # langchain-mcp-adapters' `tool_name_prefix`: the model asks for `pay_charge`.
        asked = message(("pay_charge", "a"), ("pay_charge", "b"))
        self.assertEqual([olg.nth_call(runtime({"messages": [asked]}, i)) for i in "ab"], [0, 1])

    def test_the_place_holds_on_a_resume_with_later_messages_and_in_any_state(self):
        first = message(("charge", "a"), ("charge", "b"))
        later = [ToolMessage("ok", tool_call_id="a"), message(("charge", "x"))]
        self.assertEqual(olg.nth_call(runtime({"messages": [first, *later]}, "b")), 1)
        self.assertEqual(olg.nth_call(runtime([first], "b")), 1, "a list state")
        self.assertEqual(olg.nth_call(runtime({"history": [first]}, "b")), 1, "another messages key")

    def test_a_call_not_found_or_ids_shared_is_refused(self):
        with self.assertRaises(RuntimeError):
            olg.nth_call(runtime({"messages": [message(("charge", "a"))]}, "z"))
        with self.assertRaises(RuntimeError):
            olg.nth_call(runtime({"messages": [message(("charge", "a"), ("charge", "a"))]}, "a"))


if __name__ == "__main__":
    unittest.main()
