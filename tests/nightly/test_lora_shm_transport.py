"""The adapter over --single_gpu_mode's transport on a CPU node (shared memory): the variant of the adapter
syncs CI checks over gloo (tests/integration/test_lora.py) and of the full-weight shared-memory sync
(tests/integration/test_weight_sync.py)."""

from __future__ import annotations

import pytest
import ray
from helpers.greedy import fresh_greedy, greedy, wait_until_running
from helpers.lora_learners import LORA
from helpers.lora_stack import LONG, MAX_MODEL_LEN, SWITCH_AFTER, adapter_bytes, lora_stack, peft_model, trained_adapter

from open_instruct import cluster
from open_instruct.config.generation import GenerationConfig
from open_instruct.generation.engine_setup import engine_settings
from open_instruct.generation.pool import EnginePool
from open_instruct.weights.sync import SyncSettings, WeightSync


@pytest.fixture(scope="module")
def stack(model_path, tokenizer):
    with lora_stack(model_path, tokenizer) as parts:
        yield parts


def test_the_shared_memory_transport_moves_the_adapter_into_a_running_engine(model_path, tokenizer, stack):
    """--single_gpu_mode's transport on a CPU node: the learner stages the adapter in a shared-memory file, the
    engine loads it as its adapter while its requests keep their KV cache. (The stack's learner serves here.)"""
    _, learners, gloo_sync = stack
    settings = engine_settings(model_path, MAX_MODEL_LEN, vllm_kv_cache_gib=0.25, weight_transfer_backend="shm", **LORA)
    pool = EnginePool(cluster.create_generation_actors(settings, 1), prompt_capacity=16)
    try:
        pool.start_engines()
        [engine] = pool.actors
        sync = WeightSync(learners, pool, SyncSettings("shm", "float32", GenerationConfig(), timeout_s=300))
        sync.connect()
        state = trained_adapter(learners, tokenizer, gloo_sync.version)
        generating = engine.generate.remote([greedy(tokenizer, "Count from 6 onwards.", LONG, "shm")])
        wait_until_running([engine], count=1, min_tokens=SWITCH_AFTER)
        metrics = sync.sync(1)
        [c] = ray.get(generating, timeout=600)
        assert metrics["weight_sync/kept_requests"] == 1 and metrics["weight_sync/bytes"] >= adapter_bytes(state)
        assert [s.version for s in c.version_spans] == [0, 1] and len(c.response_token_ids) == LONG
        [after] = ray.get(engine.generate.remote([greedy(tokenizer, "Count from 4 onwards.", 40, "shm_after")]))
        assert list(after.response_token_ids) == fresh_greedy(peft_model(model_path, state), after.prompt_token_ids, 40)
    finally:
        pool.shutdown()
