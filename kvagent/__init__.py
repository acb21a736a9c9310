"""kvagent: multi-turn coding agents over one live, evictable KV cache."""

__version__ = "0.1.0"
