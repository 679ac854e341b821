"""The OpenAI-compatible HTTP API in front of the engine process (``minisgl serve``).

app: ``create_app``, the routers and middleware put together; routes/: the route handlers, a router a module;
deps: what a handler is given (the bridge); protocol: request bodies, their SamplingParams and OpenAI's error
shape (structured, tools: structured output and tool calls); errors: every error in that shape; limits,
connection: the body size, read time, head size and connection count a server open to strangers is held to; calls, responses: a request's engine requests and its answer, gathered
or streamed; prompt_ids, logprobs: tokenizing and log probabilities; bridge: the asyncio side of the engine's
replies; middleware, auth, request_log: JSON by default, the API key and request ids; metrics, stats_log:
Prometheus text and the periodic stderr line; dashboard, figures: the live dashboard's ring and figures (its page
comes from render/, handed in by the command).
"""
