"""Prompt files: both formats, stdin, per-prompt settings and the exact place of every mistake."""

from __future__ import annotations

import io

import pytest

import sample_prompts
from core import SamplingParams
from core.errors import PromptFileError
from minisgl_cli.prompts import detect_format, read_prompts
from tests.support.cli import write


def test_txt_one_prompt_a_line_blank_lines_skipped(tmp_path):
    path = write(tmp_path / "p.txt", "first\n\n   \n  indented stays\r\nlast")
    specs = read_prompts(path)
    assert [s.prompt for s in specs] == ["first", "  indented stays", "last"]
    assert specs[1].where.endswith("p.txt line 4")
    assert all(s.overrides == {} for s in specs)


def test_jsonl_prompt_ids_and_per_prompt_settings(tmp_path):
    path = write(tmp_path / "p.jsonl", '{"prompt": "a", "max_tokens": 3, "ignore_eos": true}\n\n'
                                        '{"input_ids": [1, 2], "temperature": 0.5, "seed": 4, "top_k": 5}\n')
    first, second = read_prompts(path)
    assert first.prompt == "a" and first.params() == SamplingParams(max_tokens=3, ignore_eos=True)
    assert second.prompt == [1, 2]
    assert second.params() == SamplingParams(temperature=0.5, seed=4, top_k=5)


def test_command_line_values_override_the_file(tmp_path):
    spec, = read_prompts(write(tmp_path / "p.jsonl", '{"prompt": "a", "max_tokens": 3, "seed": 1}\n'))
    assert spec.params({"max_tokens": 9}) == SamplingParams(max_tokens=9, seed=1)


def test_stdin_is_sniffed_jsonl_or_text():
    assert read_prompts("-", io.StringIO('\n{"prompt": "x"}\n'))[0].prompt == "x"
    assert [s.prompt for s in read_prompts("-", io.StringIO("{not json}\nplain\n"))] == ["{not json}", "plain"]
    assert detect_format("prompts.JSONL", "") == "jsonl" and detect_format("a.txt", '{"prompt": "x"}') == "txt"


def test_default_set_is_the_chapters_five_prompts():
    specs = read_prompts(sample_prompts.path())
    assert [s.prompt for s in specs] == ["The capital of France is", "List three prime numbers:",
                                         "def fibonacci(n):", "1 + 1 =", "Once upon a time,"]
    assert [s.params().max_tokens for s in specs] == [6, 2, 5, 1, 4]
    assert all(s.params().ignore_eos for s in specs)


@pytest.mark.parametrize("name", ["questions.txt", "chat.txt", "code.txt", "shared_prefix.txt", "mixed.jsonl"])
def test_shipped_prompt_files_parse(name):
    assert read_prompts(sample_prompts.path(name))


@pytest.mark.parametrize("text, fragment", [
    ('{"prompt": "ok"}\n{"prompt": "a",}\n', "line 2: not valid JSON"),
    ('{"prompt": "ok"}\n\n["a list"]\n', "line 3: expected a JSON object"),
    ('{"promt": "typo"}\n', "line 1: unknown key 'promt'"),
    ('{"max_tokens": 3}\n', "line 1: give exactly one of"),
    ('{"prompt": "a", "input_ids": [1]}\n', "line 1: give exactly one of"),
    ('{"prompt": ""}\n', "line 1: \"prompt\" must be a non-empty string"),
    ('{"input_ids": [1, "2"]}\n', "line 1: \"input_ids\" must be a non-empty list of integers"),
    ('{"prompt": "a", "max_tokens": 0}\n', "line 1: max_tokens must be an integer >= 1"),
    ('{"prompt": "a", "temperature": -1}\n', "line 1: temperature must be a number >= 0"),
    ('{"prompt": "a", "ignore_eos": "yes"}\n', "line 1: ignore_eos must be a bool"),
])
def test_malformed_jsonl_names_the_line(tmp_path, text, fragment):
    with pytest.raises(PromptFileError, match="p.jsonl " + fragment.replace("(", r"\(")):
        read_prompts(write(tmp_path / "p.jsonl", text))


def test_missing_directory_empty_and_undecodable_files(tmp_path):
    with pytest.raises(PromptFileError, match="not found"):
        read_prompts(tmp_path / "nope.txt")
    with pytest.raises(PromptFileError, match="is a directory"):
        read_prompts(tmp_path)
    with pytest.raises(PromptFileError, match="has no prompts"):
        read_prompts(write(tmp_path / "blank.txt", "\n  \n"))
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PromptFileError, match="not UTF-8"):
        read_prompts(tmp_path / "bin.txt")
