"""`kvagent chat`: `commands.py` declares it; `run.py` is the terminal around a ChatAgent,
`resume.py` saves a chat and continues it (--session)."""
