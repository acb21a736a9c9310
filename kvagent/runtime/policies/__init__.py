"""Eviction policies. Importing this package registers the built-in ones."""

from kvagent.runtime.policies import (  # noqa: F401  (registration)
    full,
    h2o,
    keydiff,
    knorm,
    morphkv,
    nexus,
    pyramidkv,
    random,
    rkv,
    segments,
    snapkv,
    streaming,
    tova,
    triattention,
    vase,
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
