"""The trace file: what is written reads back as the same events; a cut, edited or newer file is refused with
the line that is wrong."""

from __future__ import annotations

import json

import pytest

from render.trace_format import VERSION, TraceFormatError, TraceWriter, parse_trace, read_trace, trace_lines
from tests.support.trace_samples import sample_trace


def lines_of(trace) -> list[str]:
    return trace_lines(trace).splitlines()


def edited(line_number: int, change) -> str:
    """The sample trace's text with one line's JSON object changed by ``change``."""
    lines = lines_of(sample_trace())
    record = json.loads(lines[line_number - 1])
    change(record)
    lines[line_number - 1] = json.dumps(record)
    return "\n".join(lines) + "\n"


def refused(text: str, line: int, fragment: str) -> None:
    with pytest.raises(TraceFormatError) as info:
        parse_trace(text, name="t.jsonl")
    message = str(info.value)
    assert message.startswith(f"t.jsonl, line {line}: "), message
    assert fragment in message, message
    assert "\n" not in message


def test_the_writer_writes_what_the_reader_reads_back(tmp_path):
    trace = sample_trace()
    path = tmp_path / "t.jsonl"
    writer = TraceWriter(path, trace.header)
    for event in trace.events:
        writer.write_step(event)
    writer.write_results(trace.results)
    writer.close()
    assert path.read_text() == trace_lines(trace)
    back = read_trace(path)
    assert back == trace  # every field of every event, the waits, the KV parts and the radix trees included
    assert back.events[3].waits[0].pages_needed == 40 and back.events[2].radix[1].parent_id == 1
    header = json.loads(path.read_text().splitlines()[0])
    assert header["type"] == "header" and header["format"] == "minisgl-trace" and header["version"] == VERSION


def test_an_interrupted_run_reads_back_without_results():
    trace = sample_trace(finished=False)
    back = parse_trace(trace_lines(trace))
    assert back.results is None and not back.finished and back.events == trace.events


def test_a_truncated_file_is_refused_at_the_cut_line():
    text = trace_lines(sample_trace())
    cut = text[: text.index("\n", text.index('"step": 4')) - 30]  # inside step 4's line (line 6)
    refused(cut, 6, "truncated")


def test_a_newer_format_is_refused_on_line_one():
    refused(edited(1, lambda r: r.update(version=VERSION + 1)), 1, f"version {VERSION + 1} is newer")


@pytest.mark.parametrize("line, change, fragment", [
    (3, lambda r: r.update(phase="prefil"), "phase is 'prefil'"),
    (3, lambda r: r.update(batch_size=5), "batch_size 5 but 2 requests"),
    (4, lambda r: r.update(step=7), "step 7 where step 2 was expected"),
    (4, lambda r: r["reqs"][0].update(extend_len="1"), "reqs[0].extend_len must be an integer"),
    (4, lambda r: r["reqs"][0].update(uid=9), "uid 9 but the header has 4 prompts"),
    (5, lambda r: r.update(num_tokens=3), "num_tokens 3 is not the sum"),
    (5, lambda r: r.update(colour="red"), "unknown field 'colour'"),
    (5, lambda r: r["kv"].pop("free"), "missing field 'kv.free'"),
    (6, lambda r: r["waits"][0].update(kind="bored"), "waits[0].kind is 'bored'"),
    (2, lambda r: r.update(type="stepp"), "unknown line type 'stepp'"),
    (9, lambda r: r["results"].pop(), "one result per prompt (4)"),
    (1, lambda r: r.pop("format"), "not a minisgl trace"),
])
def test_an_edited_file_is_refused_at_the_edited_line(line, change, fragment):
    refused(edited(line, change), line, fragment)


def test_a_retired_field_at_its_quiet_value_is_dropped_and_otherwise_refused():
    """Earlier builds wrote ``decoding: false`` on every request row (true only for a decoding request riding in a
    prefill step, which this version neither runs nor shows): such a file reads back as if it were absent."""
    def mark(value):
        return lambda r: [req.update(decoding=value) for req in r["reqs"]]

    assert parse_trace(edited(4, mark(False))) == sample_trace()
    refused(edited(4, mark(True)), 4, "reqs[0].decoding is True: a step this version cannot show")


def test_broken_json_and_lines_after_the_results_are_refused():
    lines = lines_of(sample_trace())
    refused("\n".join(lines[:3] + ['{"type": "step", "step": 2,,}'] + lines[4:]) + "\n", 4, "not valid JSON")
    refused("\n".join(lines + [lines[2]]) + "\n", 10, "after the results")
    refused("", 1, "empty file")


def test_a_headerless_file_from_before_the_format_is_refused():
    old = "\n".join(json.dumps({k: v for k, v in json.loads(line).items() if k != "type"})
                    for line in lines_of(sample_trace())[1:-1]) + "\n"
    refused(old, 1, "not a minisgl trace")
