"""--use_peft on the real stack: a DeepSpeed learner training a peft LoRA adapter, vLLM engines serving base +
adapter, and adapter-only weight syncs into running engines.

1. KV kept, proven token by token (the full-weight test of test_weight_sync.py, for the adapter): long greedy
   requests run with the fresh adapter (zero: the base model's tokens); a real learner step (large learning
   rate) trains adapter B; mid-generation the learner sends B alone into the running engine. The tokens before
   the switch equal the base model's greedy tokens; the tokens after equal a transformers + peft reference
   whose prefix KV comes from the base and whose new tokens come from base + B. Nothing is preempted or
   recomputed, and the sync moved exactly the adapter's bytes.
2. Reprefill with the adapter: each sample continues from its tokens, prefilled under the new adapter.
3. A failed adapter transfer names the step and the engine serves on with its previous adapter.
4. A killed engine's replacement starts with a zero adapter and serves the current one once it joined.
The adapter over the shared-memory transport: tests/nightly/test_lora_shm_transport.py.
"""

from __future__ import annotations

import time

import pytest
import ray
from helpers.greedy import (
    assert_kept_kv_switch,
    assert_reprefilled_switch,
    continue_greedy,
    fresh_greedy,
    greedy,
    sync_mid_generation,
)
from helpers.lora_stack import LONG, SWITCH_AFTER, adapter_bytes, lora_stack, peft_model, trained_adapter

from open_instruct.config.generation import GenerationConfig


@pytest.fixture(scope="module")
def stack(model_path, tokenizer):
    """One engine serving base + adapter, one stage-0 learner training the adapter, a connected gloo sync."""
    with lora_stack(model_path, tokenizer) as parts:
        yield parts


def test_an_inflight_adapter_update_keeps_the_kv_cache_and_decodes_like_peft(model_path, tokenizer, stack):
    pool, learners, sync = stack
    [engine] = pool.actors
    base = peft_model(model_path)  # a fresh adapter generates exactly the base model's tokens
    state_b = trained_adapter(learners, tokenizer, 0)
    at_trigger, metrics, completions = sync_mid_generation(engine, sync, tokenizer, 1, LONG, SWITCH_AFTER, "long")

    assert metrics["weight_sync/kept_requests"] == 2
    assert metrics["weight_sync/bytes"] == adapter_bytes(state_b)  # the adapter, nothing of the base
    assert all(c.finish_reason == "length" and len(c.response_token_ids) == LONG for c in completions)
    with_b = peft_model(model_path, state_b)
    for c in completions:
        switch, kept = assert_kept_kv_switch(c, base, with_b, at_trigger, SWITCH_AFTER)  # zero-adapter KV prefix
        generated = list(c.response_token_ids)
        unchanged = continue_greedy(base, base, c.prompt_token_ids, generated, switch, LONG - switch)
        assert kept != unchanged  # the adapter B really changes what is generated
    stats = ray.get(engine.stats.remote())
    assert stats.weight_version == 1 and stats.preempted_requests == 0
    assert stats.prefill_tokens == stats.submitted_prompt_tokens  # nothing recomputed

    # A request after the update decodes under B from its first token.
    [after] = ray.get(engine.generate.remote([greedy(tokenizer, "Count from 4 onwards.", 40, "after")]))
    assert list(after.response_token_ids) == fresh_greedy(with_b, after.prompt_token_ids, 40)


def test_a_reprefill_adapter_update_continues_each_sample_under_the_new_adapter(model_path, tokenizer, stack):
    pool, learners, sync = stack
    [engine] = pool.actors
    version = ray.get(engine.stats.remote()).weight_version
    state_old = learners.full_state_dict()
    state_new = trained_adapter(learners, tokenizer, version)
    reprefill = sync.with_settings(generation=GenerationConfig(inflight_update_kv="reprefill"))
    _, _, completions = sync_mid_generation(
        engine, reprefill, tokenizer, version + 1, LONG, SWITCH_AFTER, "re", starts=(3, 9)
    )

    old, new = peft_model(model_path, state_old), peft_model(model_path, state_new)
    for c in completions:
        assert_reprefilled_switch(c, version, old, new, LONG)


def test_a_failed_adapter_transfer_names_the_step_and_the_engine_serves_its_previous_adapter(
    model_path, tokenizer, stack
):
    """Metadata that disagrees with the adapter: the learner refuses to send, the engine's receive fails at once,
    nothing is written, and the engine serves on with the adapter it had; the next sync goes through."""
    import dataclasses

    from open_instruct.weights.transport import WeightSyncError

    pool, learners, sync = stack
    [engine] = pool.actors
    version = ray.get(engine.stats.remote()).weight_version
    served = peft_model(model_path, learners.full_state_dict())  # what the engine holds now
    trained_adapter(learners, tokenizer, version)
    good = sync.metadata
    sync.metadata = dataclasses.replace(good, shapes=((1,),) + good.shapes[1:])
    with pytest.raises(WeightSyncError, match=r"step 'transfer' failed on learner 0: .*lora_A"):
        sync.sync(version + 1)
    assert ray.get(engine.stats.remote()).weight_version == version
    [c] = ray.get(engine.generate.remote([greedy(tokenizer, "Count from 2 onwards.", 40, "kept")]), timeout=120)
    assert list(c.response_token_ids) == fresh_greedy(served, c.prompt_token_ids, 40)

    sync.metadata = good
    sync.connect()  # the failed send closed the group
    sync.sync(version + 1)
    assert ray.get(engine.stats.remote()).weight_version == version + 1


def test_a_killed_engines_replacement_serves_the_current_adapter_once_it_joins(model_path, tokenizer, stack):
    pool, learners, sync = stack
    [engine] = pool.actors
    version = ray.get(engine.stats.remote()).weight_version
    current = peft_model(model_path, learners.full_state_dict())
    ray.kill(engine)
    assert pool.notice_dead() == 1  # it left the members; its replacement is being built
    deadline = time.monotonic() + 600
    while not any(r.engine_id not in pool.members for r in pool.replacing.ready()):  # a handshake: it is built
        assert time.monotonic() < deadline, [r.phase for r in pool.replacements]
        pool.poll(timeout_s=0.5)
    metrics = sync.sync(version)  # the group is formed again with it, and the current adapter sent
    assert metrics["weight_sync/joined"] == 1 and metrics["weight_sync/bytes"] > 0
    [replacement] = pool.actors
    assert replacement is not engine and ray.get(replacement.stats.remote()).weight_version == version
    [c] = ray.get(replacement.generate.remote([greedy(tokenizer, "Count from 5 onwards.", 40, "new")]), timeout=120)
    assert list(c.response_token_ids) == fresh_greedy(current, c.prompt_token_ids, 40)
    assert list(c.response_token_ids) != fresh_greedy(peft_model(model_path), c.prompt_token_ids, 40)
