"""The OpenAI-compatible HTTP API in front of the engine process (``minisgl serve``).

protocol: request bodies, their SamplingParams and OpenAI's error shape; bridge: the asyncio side of the engine's
replies; app: the FastAPI routes and server-sent events; auth, request_log: the API key and request ids
(middleware); metrics, stats_log: Prometheus text and the periodic stderr line; dashboard, figures: the live
dashboard's stream (its page comes from render/, handed in by the command).
"""
