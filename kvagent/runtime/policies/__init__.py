"""Eviction policies. Importing this package registers the built-in ones."""

from kvagent.runtime.policies import full, random, streaming  # noqa: F401  (registration)
from kvagent.runtime.policies.base import BasePolicy, LayerView, Policy, available, make_policy, register

__all__ = ["BasePolicy", "LayerView", "Policy", "available", "make_policy", "register"]
