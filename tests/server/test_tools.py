"""Reading tool calls from a reply (serving/api/tools.py), with no server: Hermes' ``<tool_call>`` form under
``auto``, the JSON of ``required`` and of a named function, and where a stream holds its text back."""

from __future__ import annotations

import json

from serving.api.tools import ToolMode


def test_auto_reads_hermes_calls_and_keeps_the_rest_as_content():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    message, reason = ToolMode("auto").message(text, "stop")
    assert reason == "tool_calls" and message["content"] == "Let me check."
    calls = message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "add"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert len({c["id"] for c in calls}) == 2


def test_a_reply_without_a_readable_call_is_content():
    assert ToolMode("auto").message("Just text.", "stop") == ({"role": "assistant", "content": "Just text."}, "stop")
    cut = '<tool_call>{"name": "add", "argum'
    assert ToolMode("auto").message(cut, "length") == ({"role": "assistant", "content": cut}, "length")
    assert ToolMode("required").message('[{"name": "add"', "length")[1] == "length"


def test_required_and_named_read_their_json():
    message, reason = ToolMode("required").message('[{"name":"add","arguments":{"a":1,"b":2}}]', "stop")
    assert reason == "tool_calls" and message["content"] is None
    named, _ = ToolMode("named", "add").message('{"a":1,"b":2}', "stop")
    assert named["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1, "b": 2}'}


def test_a_stream_holds_back_from_where_a_call_may_begin():
    auto = ToolMode("auto")
    assert auto.holds_from("Sure, here") is None
    assert auto.holds_from("Sure <tool") == 5  # could still become the tag
    assert auto.holds_from("Sure <tool_call>{") == 5
    assert auto.holds_from("a < b") is None
    assert ToolMode("required").holds_from("[") == 0 and ToolMode("none").holds_from("<tool_call>") is None


def test_a_streamed_auto_reply_sends_its_text_then_its_calls_as_deltas():
    """The text before the tag streams; the tag and what follows are held, then come as one tool-call delta."""
    from serving.api.responses import Piece
    from serving.api.routes.chat import ChatChunks

    chunks = ChatChunks(tokenizer=None, mode=ToolMode("auto"), choices=1)
    first = chunks(Piece(text="Sure <tool"), True, 0)
    middle = chunks(Piece(text='_call>{"name": "add", "arguments": {"a": 1}}'), False, 0)
    last = chunks(Piece(text="</tool_call>", finished=True, finish_reason="stop"), False, 0)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "Sure "}
    assert middle is None
    delta, reason = last["choices"][0]["delta"], last["choices"][0]["finish_reason"]
    assert reason == "tool_calls" and "content" not in delta
    [call] = delta["tool_calls"]
    assert call["index"] == 0 and call["function"] == {"name": "add", "arguments": '{"a": 1}'}
