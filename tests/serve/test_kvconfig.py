"""The request's cache fields are the run's CacheConfig fields (runspec.IDENTITY), each `kv_<field>`
typed by its default and checked by CacheConfig itself: every field there is a request field (its
default round-trips), and a field added to CacheConfig becomes one with no edit in kvagent/serve
(a hypothetical `widget` here: accepted, type-checked, validated by the config, reaching the
request's CacheConfig)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvagent import runspec
from kvagent.errors import ConfigError
from kvagent.runtime import CacheConfig
from kvagent.serve import protocol
from kvagent.serve.errors import RequestError
from kvagent.serve.kvconfig import request_config, request_spelling

from .conftest import MODEL


def chat(**kv) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **kv}).encode()


def test_every_field_of_a_run_is_a_request_field_and_its_default_round_trips():
    defaults = CacheConfig()
    for name in runspec.IDENTITY:
        if name == "budget":  # None is "not set"; a budget needs an evicting policy
            continue
        req = protocol.parse_chat(chat(**{f"kv_{name}": runspec.DEFAULTS[name]}))
        assert set(req.kv) == {f"kv_{name}"}
        assert request_config(defaults, req.kv) == defaults, name
    evicting = request_config(defaults, protocol.parse_chat(chat(kv_policy="snapkv", kv_budget="0.2")).kv)
    assert (evicting.policy, evicting.budget) == ("snapkv", 0.2)


@dataclasses.dataclass(frozen=True)
class Widened(CacheConfig):
    """CacheConfig with a field serve has never heard of, checked the way CacheConfig checks its own."""

    widget: str = "plain"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.widget not in ("plain", "fancy"):
            raise ConfigError(f"widget: got {self.widget!r}; choose one of plain, fancy")


@pytest.fixture
def widened(monkeypatch):
    """runspec as it would be with `widget` in CacheConfig (IDENTITY and DEFAULTS are read off the
    dataclass's fields, as runspec derives them)."""
    fields = [f.name for f in dataclasses.fields(Widened)]
    monkeypatch.setattr(runspec, "IDENTITY", tuple(f for f in fields if f not in runspec.HOW_NOT_WHICH))
    monkeypatch.setattr(runspec, "DEFAULTS", {**runspec.DEFAULTS, "widget": "plain"})
    return Widened()


def test_a_new_cache_config_field_is_a_request_field_with_no_serve_edit(widened):
    req = protocol.parse_chat(chat(kv_widget="fancy", kv_policy="snapkv", kv_budget=64))
    config = request_config(widened, req.kv)
    assert (config.widget, config.policy, config.budget) == ("fancy", "snapkv", 64)
    assert request_config(widened, protocol.parse_chat(chat()).kv).widget == "plain"
    with pytest.raises(RequestError, match=r"^kv_widget: expected a string, got 3$"):
        request_config(widened, protocol.parse_chat(chat(kv_widget=3)).kv)
    with pytest.raises(RequestError, match=r"^kv_widget: got 'odd'; choose one of plain, fancy$"):
        request_config(widened, protocol.parse_chat(chat(kv_widget="odd")).kv)
    assert request_spelling("widget: bad") == "kv_widget: bad"
    with pytest.raises(RequestError, match="kv_gadget"):  # a field CacheConfig does not have
        protocol.parse_chat(chat(kv_gadget=1))


@pytest.mark.parametrize(
    ("kv", "message"),
    [
        ({"kv_policy": "snapkv"}, "kv_budget: kv_policy snapkv evicts only under a budget; add kv_budget K"),
        ({"kv_budget": 64}, "kv_budget: kv_policy full never evicts, so kv_budget 64 would do nothing"),
        ({"kv_window": True}, "kv_window: expected an integer, got true"),
        ({"kv_policy_args": [1]}, "kv_policy_args: expected an object, got [1]"),
        ({"kv_mode": "dense"}, "kv_mode: got 'dense'; choose one of persistent, reprefill"),
        (
            {"kv_policy": "snapkv", "kv_budget": 1.5},
            "kv_budget: a float budget is a fraction in (0,1), got 1.5",
        ),
    ],
)
def test_bad_settings_are_one_line_naming_the_request_field(kv, message):
    with pytest.raises(RequestError) as e:
        request_config(CacheConfig(), kv)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
