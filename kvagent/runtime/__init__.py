"""The runtime: one live, evictable KV cache per episode."""

from kvagent.runtime.config import CacheConfig, Sampling
from kvagent.runtime.engine import Engine
from kvagent.runtime.generation import Generation
from kvagent.runtime.session import Session
from kvagent.runtime.stats import CacheStats

__all__ = ["CacheConfig", "CacheStats", "Engine", "Generation", "Sampling", "Session"]
