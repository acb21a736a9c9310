"""Eviction policies. Importing this package registers the built-in ones."""

from kvagent.runtime.policies import (  # noqa: F401  (registration)
    full,
    h2o,
    keydiff,
    knorm,
    nexus,
    pyramidkv,
    random,
    rkv,
    snapkv,
    streaming,
    tova,
    triattention,
)
from kvagent.runtime.policies.base import (
    BasePolicy,
    LayerView,
    available,
    check_policy,
    make_policy,
    register,
)

__all__ = ["BasePolicy", "LayerView", "available", "check_policy", "make_policy", "register"]
