"""In-flight weight sync with real engines (vLLM in Ray actors) and real DeepSpeed learners.

1. KV kept, proven token by token: a long greedy request runs with the initial weights A; a real
   learner step (large learning rate) produces weights B; mid-generation the learner broadcasts B
   into the running engine. The tokens before the switch must equal greedy decoding with A; the
   tokens after must equal a transformers reference whose prefix KV comes from A and whose new
   tokens come from B. No request is preempted, aborted or recomputed; new requests after the
   update do not hit prefix blocks computed with A.
2. ZeRO-3 learners (2 ranks) → two engines in one sync, with `inflight=False`: running requests
   finish on the old weights first; afterwards both engines decode exactly like B.
3. Preempted across an update: in a KV cache too small for two long requests, the one vLLM preempts after
   the update is prefilled again under B; its tokens after that match a fresh prefill under B, its
   logprobs keep who sampled them, and its importance ratio against pi_old = B is 1 there.
4. A transfer that fails (stage 0 and ZeRO-3) names the step, frees every party at once, and the next
   sync goes through; the same for the shared-memory transport.

The module shares one Ray cluster, and a failure test reuses the stack of the test before it (`stack_for`).
"""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
import ray
import torch
from helpers.batches import rewarded_groups
from helpers.greedy import (
    assert_kept_kv_switch,
    assert_reprefilled_switch,
    continue_greedy,
    fresh_greedy,
    greedy,
    kept_kv_logprobs,
    sync_mid_generation,
    wait_until_running,
    whole_text_logprobs,
)
from helpers.weight_stack import (
    LONG,
    MAX_MODEL_LEN,
    SWITCH_AFTER,
    Stack,
    connected_sync,
    hf_model,
    release_stack,
    stack_for,
    zero3_syncs_two_engines_after_draining,
)

from open_instruct import batching, cluster
from open_instruct.config.generation import GenerationConfig
from open_instruct.replay_buffer import Group
from open_instruct.weights.transport import WeightSyncError


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    """One local Ray cluster for the module; tests that ask for the same stack share it (`stack_for`)."""
    cluster.init_ray(min_logical_cpus=5)
    yield
    release_stack()
    ray.shutdown()


def test_inflight_update_from_a_real_learner_keeps_the_kv_cache(model_path, tokenizer):
    stack = stack_for(model_path, tokenizer, 1, 1, stage=0)
    [engine], sync, weights_b = stack.engines, stack.sync, stack.weights_b
    at_trigger, metrics, completions = sync_mid_generation(engine, sync, tokenizer, 1, LONG, SWITCH_AFTER, "long")

    # Every long request was frozen with its KV, not dropped, and finished at full length.
    assert metrics["weight_sync/kept_requests"] == 2
    assert metrics["weight_sync/bytes"] > 4e6 and metrics["weight_sync/bandwidth_mb_s"] > 0
    assert 0 < metrics["time/weight_sync_pause_s"] < 60
    assert "weight_sync/step_end_to_resume_s/engine_0" in metrics
    assert all(c.finish_reason == "length" and len(c.response_token_ids) == LONG for c in completions)

    model_a, model_b = hf_model(model_path), hf_model(model_path, weights_b)
    for c in completions:
        switch, kept = assert_kept_kv_switch(c, model_a, model_b, at_trigger, SWITCH_AFTER)
        generated = list(c.response_token_ids)
        recomputed = continue_greedy(model_b, model_b, c.prompt_token_ids, generated, switch, LONG - switch)
        print(
            f"{c.prompt_id}: switch at token {switch}; keep-KV reference matches; "
            f"recompute reference differs: {recomputed != kept}"
        )
        assert c.behaviour_logprobs and len(c.behaviour_logprobs) == LONG

    stats = ray.get(engine.stats.remote())
    assert stats.weight_version == 1 and stats.weight_updates == 1
    assert stats.preempted_requests == 0  # nothing preempted ...
    assert stats.prefill_tokens == stats.submitted_prompt_tokens and stats.recomputed_tokens == 0  # ... or recomputed

    # Prefix cache: a prompt cached under version 0 is not reused by version 1 requests.
    # Prefix caching itself works: a second version-1 request does hit the version-1 blocks.
    shared = greedy(tokenizer, "Please add these numbers. " * 12 + "Go.", 4, "cached")
    assert len(shared.prompt_token_ids) > 256  # spans whole KV blocks
    ray.get(engine.generate.remote([shared]))  # computed at version 1 by now; salt "v1"
    hits_v1 = ray.get(engine.stats.remote()).prefix_cache_hit_tokens
    ray.get(engine.generate.remote([shared]))
    assert ray.get(engine.stats.remote()).prefix_cache_hit_tokens > hits_v1
    sync.sync(2)
    before = ray.get(engine.stats.remote()).prefix_cache_hit_tokens
    [after_update] = ray.get(engine.generate.remote([shared]))
    assert ray.get(engine.stats.remote()).prefix_cache_hit_tokens == before  # no version-1 block reused
    assert [s.version for s in after_update.version_spans] == [2]


def test_a_reprefill_update_continues_each_sample_from_its_tokens_under_the_new_weights(model_path, tokenizer):
    """--inflight_update_kv reprefill: the sync aborts the running requests; each sample keeps its tokens and
    logprobs and continues as prompt + tokens prefilled under the new weights (the recomputed reference of
    the keep test above), at full length, its versions spanning the switch."""
    stack = stack_for(model_path, tokenizer, 1, 1, stage=0, share=True)
    [engine] = stack.engines
    before = ray.get(engine.stats.remote())
    version, weights_old = before.weight_version, stack.learners.full_state_dict()
    stack.learners.train_step(rewarded_groups(tokenizer), version)
    weights_new = stack.learners.full_state_dict()
    generation = GenerationConfig(inflight_updates=True, inflight_update_kv="reprefill")
    sync = stack.sync.with_settings(generation=generation)
    _, _, completions = sync_mid_generation(
        engine, sync, tokenizer, version + 1, LONG, SWITCH_AFTER, "reprefill", starts=(3, 9)
    )

    assert all(c.finish_reason == "length" and len(c.response_token_ids) == LONG for c in completions)
    model_old, model_new = hf_model(model_path, weights_old), hf_model(model_path, weights_new)
    switches = []
    for c in completions:
        switches.append(assert_reprefilled_switch(c, version, model_old, model_new, LONG))
        assert len(c.behaviour_logprobs) == LONG and c.continued_tokens == 0  # not a fault's continuation

    after = ray.get(engine.stats.remote())
    assert after.reprefilled_samples - before.reprefilled_samples == 2
    prefilled = sum(len(c.prompt_token_ids) + switch for c, switch in zip(completions, switches))
    assert after.reprefill_tokens - before.reprefill_tokens == prefilled
    assert after.generated_tokens - before.generated_tokens == 2 * LONG  # each token counted once


def failed_transfer_recovers(tokenizer, stack: Stack) -> None:
    """Metadata that disagrees with the parameters: learner 0 refuses to send and closes its end of the
    group, so every engine waiting in it fails at once (not at the group timeout), finishes the reload with
    the old weights and serves on. Once reconnected, the next sync goes through."""
    timeout_s = 120
    sync = connected_sync(stack.pool, stack.learners, "gloo", inflight=True, timeout_s=timeout_s)
    [version] = {s.weight_version for s in ray.get([e.stats.remote() for e in stack.engines])}
    md = sync.metadata
    sync.metadata = dataclasses.replace(md, shapes=((1,),) + md.shapes[1:])
    failed_at = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"step 'transfer' failed on learner 0: .*embed_tokens"):
        sync.sync(version + 1)
    for engine in stack.engines:
        assert ray.get(engine.stats.remote()).weight_version == version  # the failed version was not committed
        [c] = ray.get(engine.generate.remote([greedy(tokenizer, "What is 1 + 1?", 8, "after")]), timeout=120)
        assert len(c.response_token_ids) == 8  # resumed and still serving

    sync.metadata = md
    sync.connect()  # the failed send closed the group
    sync.sync(version + 1)
    assert all(s.weight_version == version + 1 for s in ray.get([e.stats.remote() for e in stack.engines]))
    assert time.monotonic() - failed_at < timeout_s  # no party waited for a timeout


def test_a_failed_transfer_names_the_step_and_leaves_the_engine_serving(model_path, tokenizer):
    failed_transfer_recovers(tokenizer, stack_for(model_path, tokenizer, 1, 1, stage=0, share=True))


# 4 KV blocks of 128 tokens (the tiny model keeps 4 KiB a token): two requests of 35 + LONG tokens outgrow them.
SMALL_KV_GIB = 0.0025


def test_a_request_preempted_after_an_inflight_update_is_recomputed_under_the_new_weights(model_path, tokenizer):
    """Two long requests in a KV cache of 512 tokens, without prefix caching (a run's default). After the
    in-flight update (KV kept) the cache fills: vLLM preempts one request and, once the other has finished,
    prefills its prompt and tokens again under the new weights. Its tokens and their logprobs are, exactly against
    transformers: the old weights' before the switch, the new weights' over the old KV up to the preemption, and
    after it the new weights' over their own recomputation. Its versions span the switch only (the same
    weights sampled on both sides of the preemption), the engine counts one preemption and the recomputed tokens,
    and against a learner holding the new weights its importance ratio is 1 exactly where it was recomputed."""
    from open_instruct import loss
    from open_instruct.learner.actor import token_logprobs
    from open_instruct.packing import collate

    stack = stack_for(model_path, tokenizer, 1, 1, stage=0, kv_cache_gib=SMALL_KV_GIB, prefix_caching=False)
    [engine] = stack.engines
    at_trigger, metrics, completions = sync_mid_generation(engine, stack.sync, tokenizer, 1, LONG, SWITCH_AFTER, "pre")
    stats = ray.get(engine.stats.remote())
    assert metrics["weight_sync/kept_requests"] == 2
    assert all(c.finish_reason == "length" and len(c.response_token_ids) == LONG for c in completions)
    assert stats.preempted_requests == 1
    [prompt_length] = {len(c.prompt_token_ids) for c in completions}
    preempted_at = stats.recomputed_tokens - prompt_length  # the tokens it had: prompt + these were recomputed
    assert SWITCH_AFTER < preempted_at < LONG

    model_a, model_b = hf_model(model_path), hf_model(model_path, stack.weights_b)
    recomputed_samples = []
    for c in completions:
        switch, kept = assert_kept_kv_switch(c, model_a, model_b, at_trigger, SWITCH_AFTER, until=preempted_at)
        prompt, generated, logprobs = c.prompt_token_ids, list(c.response_token_ids), c.behaviour_logprobs
        kept_logprobs = kept_kv_logprobs(model_a, model_b, prompt, generated, switch)
        if generated[switch:] == kept:  # kept its KV to the end
            assert logprobs[switch:] == pytest.approx(kept_logprobs, abs=2e-3)
            continue
        recomputed_samples.append(c)
        # Preempted after the switch; or before it, then resumed after it (its versions switch there).
        assert switch <= preempted_at
        recomputed = continue_greedy(model_b, model_b, prompt, generated, preempted_at, LONG - preempted_at)
        assert generated[preempted_at:] == recomputed
        assert logprobs[switch:preempted_at] == pytest.approx(kept_logprobs[: preempted_at - switch], abs=2e-3)
        whole_b = whole_text_logprobs(model_b, prompt, generated)
        assert logprobs[preempted_at:] == pytest.approx(whole_b[preempted_at:], abs=2e-3)
        assert max(abs(a - b) for a, b in zip(logprobs[:preempted_at], whole_b)) > 1e-2
    assert len(recomputed_samples) == 1

    # The learner's side: the batch as the driver packs it, pi_old from the new weights.
    [sample] = recomputed_samples
    settings = batching.batch_settings(
        tokenizer.pad_token_id, pack_length=MAX_MODEL_LEN, num_learners_per_node=[1], per_device_train_batch_size=1
    )
    # Two copies rewarded apart, so that the group's advantages are not zero.
    group = Group(sample.prompt_id, tuple(dataclasses.replace(sample, sample_index=j, reward=float(j)) for j in (0, 1)))
    [batch], _ = batching.assemble([group], 1, settings)
    mb = collate([batch.micro_batches[0][0]])
    pi_old = token_logprobs(model_b, mb, batch.temperature)
    mask = mb["response_mask"].bool()
    importance = loss.importance_weights(pi_old, mb["behaviour_logprobs"], mask, cap=2.0)
    log_rho = (pi_old - mb["behaviour_logprobs"])[mask]
    assert log_rho[preempted_at:].abs().max() < 2e-3  # recomputed under the weights pi_old holds
    assert log_rho[:preempted_at].abs().max() > 1e-2  # sampled over the old weights or their KV
    assert torch.allclose(importance.weights_BT[mask][preempted_at:], torch.ones(LONG - preempted_at), atol=3e-3)


def test_zero3_learners_update_two_engines_after_draining(model_path, tokenizer):
    """One parameter gathered at a time, the default (the whole model at once: tests/nightly/
    test_zero3_whole_model_sync.py)."""
    zero3_syncs_two_engines_after_draining(model_path, tokenizer, gather_whole_model=False)


def test_a_failed_zero3_transfer_ends_every_ranks_gathers_and_leaves_the_engines_serving(model_path, tokenizer):
    """Under ZeRO-3 (every parameter partitioned, gathered one at a time) learner 1 finishes the parameter
    gathers with rank 0 instead of waiting in one until its watchdog breaks it."""
    stack = stack_for(
        model_path, tokenizer, 2, 2, stage=3, share=True, gather_whole_model=False, param_persistence_threshold=0
    )
    failed_transfer_recovers(tokenizer, stack)


def staged_files(pids: list[int]) -> set[str]:
    """The files these learners staged: only theirs, since the suite's other worker may be staging its own."""
    from open_instruct.weights.shm import FILE_PREFIX

    prefixes = tuple(f"{FILE_PREFIX}{pid}-" for pid in pids)
    return {name for name in os.listdir("/dev/shm") if name.startswith(prefixes)}


def test_shared_memory_transport_updates_running_engines_without_a_group(model_path, tokenizer):
    """--single_gpu_mode on a CPU node: ZeRO-3 learner rank 0 stages the gathered weights in one
    shared-memory file, both engines load them in flight (running requests keep their KV and switch
    version), and the file is gone afterwards. A staged transfer that fails (metadata that disagrees with
    the parameters) names the step, leaves no file, and the engines keep serving the previous version."""
    stack = stack_for(model_path, tokenizer, 2, 2, stage=3, backend="shm")
    engines, sync, weights_b = stack.engines, stack.sync, stack.weights_b
    # Long enough to be running still after the staging, which happens before the pause.
    prompts = [greedy(tokenizer, f"Count from {i}.", LONG, f"l{i}") for i in (0, 1)]
    generating = [engines[i].generate.remote([prompts[i]]) for i in (0, 1)]
    wait_until_running(engines, count=1, min_tokens=5, every_engine=False)
    metrics = sync.sync(1)
    running = [c for ref in generating for c in ray.get(ref, timeout=600)]
    assert metrics["weight_sync/bytes"] > 4e6
    assert metrics["time/weight_sync_stage_s"] > 0  # staged before the pause, engines still generating
    # Every request still running at the pause switched version mid-generation with its KV kept (on a
    # loaded machine one may have finished during the staging: it then has version 0 only).
    switched = [c for c in running if [s.version for s in c.version_spans] == [0, 1]]
    assert 1 <= len(switched) == metrics["weight_sync/kept_requests"]
    assert all(len(c.response_token_ids) == LONG for c in running)
    assert staged_files(stack.learner_pids) == set()

    probe = greedy(tokenizer, "What is 4 + 5?", 24, "probe")
    expected = fresh_greedy(hf_model(model_path, weights_b), probe.prompt_token_ids, 24)
    for engine in engines:
        [c] = ray.get(engine.generate.remote([probe]))
        assert list(c.response_token_ids) == expected and [s.version for s in c.version_spans] == [1]

    md = sync.metadata
    sync.metadata = dataclasses.replace(md, shapes=((1,),) + md.shapes[1:])
    with pytest.raises(WeightSyncError, match=r"step 'stage' failed on learner 0: .*embed_tokens"):
        sync.sync(2)
    assert staged_files(stack.learner_pids) == set()
    for engine in engines:
        [c] = ray.get(engine.generate.remote([probe]), timeout=120)
        assert list(c.response_token_ids) == expected and ray.get(engine.stats.remote()).weight_version == 1
