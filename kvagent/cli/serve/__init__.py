"""`kvagent serve`: `commands.py` declares it; `run.py` loads the engine, binds the address and
runs the OpenAI-compatible app (kvagent.serve) on uvicorn."""
