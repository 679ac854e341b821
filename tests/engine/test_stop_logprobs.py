"""Stop strings and logprobs offline: the incremental text, SamplingParams' checks, ``minisgl generate``."""

from __future__ import annotations

import pytest

from tests.support.cli import json_lines, run
from core import SamplingParams
from core.errors import InvalidParamsError
from core.llm.text import TextStream, window_decoder
from tests.support.models import EOS_ID, byte_tokenizer


def pieces(stream: TextStream, ids: list[int]) -> list[str]:
    out = []
    for token in ids:
        piece = stream.add(token)
        out.append(piece.text)
        if piece.stop is not None:
            return out
    return out + [stream.finish().text]


def byte_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text)["input_ids"]


def test_pieces_join_to_the_whole_text_even_across_split_characters():
    tok = byte_tokenizer()
    text = "héllo → wörld ✓"
    ids = byte_ids(tok, text)  # one token per byte: multi-byte characters arrive in parts
    out = pieces(TextStream(tok, byte_ids(tok, "prompt"), ()), ids)
    assert "".join(out) == text == tok.decode(ids)
    assert all("\ufffd" not in piece for piece in out)


def test_the_window_decoder_decodes_as_the_tokenizer_does():
    """A fast tokenizer's Rust decode is called directly only where the tokenizer would add nothing to it."""
    tok = byte_tokenizer()
    ids = [256, *byte_ids(tok, "héllo , wörld ."), EOS_ID]  # special tokens skipped, a space before punctuation
    assert window_decoder(tok)(ids) == tok.decode(ids, skip_special_tokens=True) == "héllo , wörld ."
    assert window_decoder(tok).func != tok.decode
    tok.clean_up_tokenization_spaces = True
    assert window_decoder(tok).func == tok.decode


def test_a_stop_string_cuts_the_text_and_is_never_streamed_in_part():
    tok = byte_tokenizer()
    ids = byte_ids(tok, "one two STOP three")
    stream = TextStream(tok, [], ("STOP", "never"))
    out = pieces(stream, ids)
    assert "".join(out) == "one two "
    assert stream.stopped == "STOP"
    assert not any("S" in piece for piece in out)  # 'S', 'ST', 'STO' were held back, then dropped


def test_held_back_text_comes_out_when_no_stop_string_follows():
    tok = byte_tokenizer()
    out = pieces(TextStream(tok, [], ("STOP",)), byte_ids(tok, "a STO"))
    assert out[-1] == "STO" and "".join(out) == "a STO"


@pytest.mark.parametrize("fields, fragment", [
    ({"stop": [""]}, "stop must be"),
    ({"stop": [1]}, "stop must be"),
    ({"stop": ["x"] * 17}, "at most 16"),
    ({"logprobs": -1}, "logprobs must be"),
    ({"logprobs": 21}, "logprobs must be"),
    ({"logprobs": True}, "logprobs must be"),
])
def test_bad_stop_and_logprobs_values_are_refused(fields, fragment):
    with pytest.raises(InvalidParamsError, match=fragment):
        SamplingParams(**fields)


def test_stop_is_normalised_to_a_tuple():
    assert SamplingParams(stop="x").stop == ("x",)
    assert SamplingParams(stop=["x", "y"]).stop == ("x", "y")


def test_generate_takes_stop_and_logprobs(model_dirs, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello there\n")
    base = ["generate", str(prompts), "--model", model_dirs["llama"], "--json", "-n", "12", "--ignore-eos"]
    full = json_lines(run(*base).stdout)[0]
    stop = full["text"][4:6]
    got = json_lines(run(*base, "--stop", stop, "--stop", "zzz", "--logprobs", "2").stdout)[0]
    assert (got["text"], got["finish_reason"], got["stop"]) == (full["text"][:full["text"].find(stop)], "stop", stop)
    assert got["token_ids"] == full["token_ids"][:len(got["token_ids"])]
    assert [e["token_id"] for e in got["logprobs"]] == got["token_ids"]
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] == e["top_logprobs"][0][1] for e in got["logprobs"])
