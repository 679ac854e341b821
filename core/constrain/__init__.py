"""Structured output: a request's tokens kept inside a grammar (a JSON schema, a regular expression, a choice of
strings, a Lark grammar) by masking, at every step, the tokens the grammar does not allow next.

The grammar engine is llguidance's (a Rust library with no dependencies; docs/ARCHITECTURE.md says why this one).
What a request asks for is core/constraint.py, checked when it is made, below the request it is part of;
``grammars`` compiles each distinct one once for the engine's tokenizer and gives each request a matcher of its
own, kept on the request (``Req.matcher``); ``masks`` fills a step's token bitmasks on the CPU and applies them to
the logits before sampling.
"""
