"""The serve-load wing of kvagent.bench (`kvagent bench serve`): recorded episodes replayed as concurrent
conversations against OpenAI-compatible servers (`workload`, `run`), their KV figures (`metrics`) and report."""
