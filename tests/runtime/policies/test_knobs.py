"""Policy knobs are dataclass fields: one shared path refuses unknown knobs and checks the rest, and
the repr is generated (no policy writes __init__ or __repr__ by hand)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from kvagent.errors import ConfigError
from kvagent.runtime.policies import BasePolicy, available, make_policy, register
from kvagent.runtime.policies._args import int_knob, knob_names
from kvagent.runtime.policies.base import _REGISTRY


@pytest.mark.parametrize("name", available())
def test_every_policy_declares_its_knobs_as_fields(name):
    cls = _REGISTRY[name]
    assert dataclasses.is_dataclass(cls)
    src = inspect.getsource(inspect.getmodule(cls))
    assert "def __init__" not in src and "def __repr__" not in src
    # The generated repr names every knob with its value.
    pol = make_policy(name)
    shown = ", ".join(f"{f.name}={getattr(pol, f.name)!r}" for f in dataclasses.fields(pol) if f.repr)
    assert repr(pol) == f"{cls.__name__}({shown})"


@pytest.mark.parametrize("name", available())
def test_unknown_knobs_are_one_line_naming_the_valid_ones(name):
    with pytest.raises(ConfigError) as e:
        make_policy(name, no_such_knob=1)
    msg = str(e.value)
    valid = ", ".join(knob_names(_REGISTRY[name])) or "none"
    assert msg == f"policy_args: {name} has no option(s) no_such_knob; valid: {valid}"


def test_checks_run_from_field_metadata_and_store_what_they_return():
    @dataclasses.dataclass
    class Knobbed(BasePolicy):
        name = "_test_knobbed"
        width: int = int_knob(3, 2)

    register(Knobbed)
    try:
        assert make_policy("_test_knobbed", width=5).width == 5
        with pytest.raises(ConfigError, match=r"^policy_args.width: must be an int >= 2, got 1$"):
            make_policy("_test_knobbed", width=1)
        with pytest.raises(ConfigError, match="policy_args.width"):
            Knobbed(width=True)  # direct construction runs the same checks
    finally:
        _REGISTRY.pop("_test_knobbed", None)


def test_a_hand_written_init_is_refused_at_registration():
    class Old(BasePolicy):
        name = "_test_old"

        def __init__(self, k=1, **unknown):
            self.k = k

    with pytest.raises(TypeError, match="dataclass fields"):
        register(Old)
    assert "_test_old" not in _REGISTRY


def test_knobs_derive_the_contracts_class_attributes():
    assert make_policy("random", shared=True).shared_across_heads
    assert not make_policy("random").shared_across_heads
    assert not make_policy("tova", shared=False).shared_across_heads
    assert make_policy("nexus", block=8).block == 8 and make_policy("snapkv").block == 1
