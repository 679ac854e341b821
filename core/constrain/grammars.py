"""Each request's matcher: the tokenizer's tables built once, when the first constrained request arrives, and each
distinct constraint compiled once (a matcher in its start state is kept, and each request gets a copy)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Iterable

from core.constraint import Constraint
from core.errors import InvalidConstraintError
from core.request import SamplingParams

COMPILED_KEPT = 256  # distinct constraints kept compiled, least recently used dropped first


class Grammars:
    """Matchers for one engine's requests. ``tokenizer`` loads the model's tokenizer (a transformers tokenizer,
    or a ``random:`` model's byte tokenizer); it is called once, at the first constrained request, so an engine
    that never sees one never loads it. ``vocab_size`` is the logits' width, ``eos_token_ids`` the tokens a
    matcher allows only once its grammar accepts (read with the tokenizer)."""

    def __init__(self, tokenizer: Callable[[], Any], vocab_size: int,
                 eos_token_ids: Callable[[], Iterable[int]]) -> None:
        self._load_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos_token_ids = eos_token_ids
        self._info: Any = None
        self._compiled: OrderedDict[Constraint, Any] = OrderedDict()

    def matcher_for(self, params: SamplingParams) -> Any:
        """The request's matcher, or None when it has no constraint."""
        return None if params.constraint is None else self.matcher(params.constraint)

    def matcher(self, constraint: Constraint) -> Any:
        """A matcher of its own for one request, at the start of ``constraint``'s grammar. Raises
        InvalidConstraintError where the grammar cannot be built for this tokenizer."""
        from llguidance import LLMatcher

        start = self._compiled.get(constraint)
        if start is None:
            start = LLMatcher(self.tokenizer_info(), constraint.grammar, log_level=0)
            if start.is_error():
                raise InvalidConstraintError(f"{constraint.describe()} cannot be used: {start.get_error()}")
            self._compiled[constraint] = start
            if len(self._compiled) > COMPILED_KEPT:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(constraint)
        return start.deep_copy()

    def tokenizer_info(self) -> Any:
        """llguidance's view of the vocabulary (every token's bytes), built on first use."""
        if self._info is None:
            eos = sorted(self._eos_token_ids())
            self._info = _tokenizer_info(self._load_tokenizer(), self.vocab_size, eos)
        return self._info


def _tokenizer_info(tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> Any:
    from llguidance import LLTokenizer, TokenizerWrapper

    eos = eos_token_ids or None
    if hasattr(tokenizer, "backend_tokenizer"):  # a transformers tokenizer over Hugging Face's tokenizers
        import llguidance.hf

        return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos)
    return LLTokenizer(TokenizerWrapper(ByteTokens(vocab_size, eos_token_ids)), n_vocab=vocab_size, eos_token=eos)


class ByteTokens:
    """A ``random:`` model's byte tokenizer as llguidance reads one: ids below 256 are those bytes, the rest are
    special tokens that no grammar's text can contain."""

    def __init__(self, vocab_size: int, eos_token_ids: list[int]) -> None:
        self.tokens = [bytes([i]) if i < 256 else f"<|{i}|>".encode() for i in range(vocab_size)]
        self.special_token_ids = list(range(256, vocab_size))
        self.eos_token_id = eos_token_ids[0] if eos_token_ids else vocab_size - 1
        self.bos_token_id = None

    def __call__(self, text: bytes | str) -> list[int]:
        return list(text.encode("utf-8") if isinstance(text, str) else text)
