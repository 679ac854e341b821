"""The API's routes, a router a module: completions.py (POST /v1/completions), chat.py (POST
/v1/chat/completions), tokens.py (POST /tokenize, /detokenize), info.py (GET /v1/models, /health, /metrics,
/engines); dashboard.py (GET /dashboard and its stream, added with --dashboard)."""

from serving.api.routes import chat, completions, info, tokens

ROUTERS = (completions.router, chat.router, tokens.router, info.router)
