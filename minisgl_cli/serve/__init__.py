"""The OpenAI-compatible HTTP server on the engine (``minisgl serve``).

protocol: request bodies and their SamplingParams; bridge: the asyncio side of the engine's loop thread;
api: the FastAPI routes and server-sent events; metrics: Prometheus text; command: the Typer command.
"""
