"""`kvagent serve`: an OpenAI-compatible HTTP server whose conversations each keep one live,
evicted KV cache (docs/serve.md). Imports fastapi and prometheus_client (the `serve` extra); only
`kvagent.cli.serve.run` and tests import it."""

from kvagent.serve.app import ServeConfig, create_app

__all__ = ["ServeConfig", "create_app"]
