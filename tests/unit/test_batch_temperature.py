"""Samples carry the temperature they were drawn at, and a batch carries it to the learner: the learner never
reads the generation flags to know at which temperature to score tokens."""

from __future__ import annotations

from dataclasses import replace

import pytest

from open_instruct.batching import assemble, batch_settings
from open_instruct.messages import Completion
from open_instruct.replay_buffer import ReplayBuffer


def sample(prompt_id: str, j: int, temperature: float) -> Completion:
    return Completion(
        prompt_id=prompt_id,
        sample_index=j,
        prompt_token_ids=(5, 6),
        response_token_ids=(7, 8, 9),
        behaviour_logprobs=(-0.5,) * 3,
        finish_reason="stop",
        version_spans=(),
        admitted_version=0,
        engine_id=0,
        reward=float(j),
        temperature=temperature,
    )


def batch_of(temperatures: dict[str, float]):
    buffer = ReplayBuffer(samples_per_prompt=2, max_samples=16)
    for prompt_id, temperature in temperatures.items():
        for j in range(2):
            buffer.add(sample(prompt_id, j, temperature))
    groups = buffer.take(len(temperatures), learner_version=0)
    return assemble(groups, 0, batch_settings(0, pack_length=64, micro_batch_token_budget=0))[0]


def test_a_batch_carries_its_samples_temperature_and_greedy_samples_are_scored_at_1():
    assert {b.temperature for b in batch_of({"a": 0.7, "b": 0.7})} == {0.7}
    assert {b.temperature for b in batch_of({"a": 0.0})} == {1.0}


def test_a_batch_refuses_samples_drawn_at_different_temperatures():
    with pytest.raises(ValueError, match=r"a batch mixes samples drawn at temperatures \[0.7, 1.2\]"):
        batch_of({"a": 0.7, "b": 1.2})


def test_an_engine_sample_is_stamped_with_its_requests_temperature():
    """What the engine builds before vLLM answers (and on failure): the request's sampling temperature."""
    from open_instruct.generation.actor import GenerationActor
    from open_instruct.generation.engine_setup import engine_settings
    from open_instruct.messages import PromptRequest, SamplingSettings

    actor = GenerationActor(0, engine_settings("m", 64))
    request = PromptRequest("p", (1, 2), (), (), SamplingSettings(max_tokens=4, temperature=0.6), 2, 0, 0)
    assert actor.empty_sample(request, 1, "error", "x").temperature == 0.6
    assert replace(actor.empty_sample(request, 0, "abort", "y"), reward=1.0).temperature == 0.6
