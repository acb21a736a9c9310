"""Sampling defaults from the model's generation_config.json, as vLLM takes them: top_p / top_k not
given are the file's (the values it sets, read through `to_diff_dict` as vLLM reads them); no file,
no defaults (neutral 1.0 / off); an explicit value wins; temperature is always the config's (R2E-Gym
sends it). What was used, and from where, is in the episode's record."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from transformers import GenerationConfig

from kvagent.agent import Agent, AgentConfig
from kvagent.agent.config import generation_defaults
from kvagent.testing import ScriptedSession
from tests.helpers import SUBMIT

from .test_r2egym_profile import Env

QWEN3_LIKE = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": [1, 2]}


def generation_config(tmp_path, values):
    (tmp_path / "generation_config.json").write_text(json.dumps(values))
    return GenerationConfig.from_pretrained(str(tmp_path))


def session_with(tokenizer, generation):
    session = ScriptedSession(tokenizer, [SUBMIT])
    session.engine = SimpleNamespace(model=SimpleNamespace(generation_config=generation))
    return session


def sampled(tokenizer, generation, **config):
    session = session_with(tokenizer, generation)
    result = Agent(session, Env(), tokenizer, AgentConfig(**config)).run("x")
    return session.calls[0]["sampling"], result.config


def test_top_p_top_k_come_from_the_models_file(tmp_path, tokenizer):
    sampling, config = sampled(tokenizer, generation_config(tmp_path, QWEN3_LIKE))
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (1.0, 0.95, 20)
    record = config.sampling_record()
    assert record["source"] == {
        "temperature": "flag",
        "top_p": "generation_config.json",
        "top_k": "generation_config.json",
    }
    assert record["generation_config"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert config.to_dict()["sampling_from_model"] == ["top_p", "top_k"]


def test_explicit_values_win(tmp_path, tokenizer):
    sampling, config = sampled(tokenizer, generation_config(tmp_path, QWEN3_LIKE), top_p=0.5, temperature=0.7)
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.7, 0.5, 20)
    assert config.sampling_record()["source"]["top_p"] == "flag"


@pytest.mark.parametrize("generation", [None, "derived"], ids=["no-config", "derived-from-model-config"])
def test_no_file_means_neutral(tokenizer, generation):
    if generation == "derived":  # what transformers gives a model without the file
        from transformers import Qwen3Config

        generation = GenerationConfig.from_model_config(Qwen3Config())
    sampling, config = sampled(tokenizer, generation)
    assert (sampling.top_p, sampling.top_k) == (1.0, 0)
    assert config.sampling_record()["source"]["top_k"] == "neutral"


def test_only_the_files_sampling_values_are_read_and_only_top_p_top_k_applied(tmp_path, tokenizer):
    gen = generation_config(
        tmp_path, {"top_k": 40, "repetition_penalty": 1.1, "do_sample": True, "max_length": 9}
    )
    session = SimpleNamespace(engine=SimpleNamespace(model=SimpleNamespace(generation_config=gen)))
    assert generation_defaults(session) == {"top_k": 40, "repetition_penalty": 1.1}
    sampling, config = sampled(tokenizer, gen)
    assert (sampling.top_p, sampling.top_k) == (1.0, 40)
    assert config.sampling_record()["generation_config"]["repetition_penalty"] == 1.1  # recorded, not applied


def test_a_real_model_directory(tmp_path, tokenizer):
    """Engine.load of a directory: transformers reads its generation_config.json into the model."""
    from kvagent.runtime import CacheConfig, Engine
    from kvagent.runtime.models import tiny_random_model

    tiny_random_model("qwen3", vocab_size=len(tokenizer)).save_pretrained(str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))
    (tmp_path / "generation_config.json").write_text(json.dumps(QWEN3_LIKE))
    engine = Engine.load(str(tmp_path), device="cpu")
    assert generation_defaults(engine.session(CacheConfig())) == {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
    }
