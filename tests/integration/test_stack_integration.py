"""The real CPU stack on the embedded tiny model: DeepSpeed (gloo) trains, vLLM generates in a Ray actor.
Slow: each test starts real engines or process groups (grpo_fast.py end to end: test_training_loop.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from open_instruct.config.data import EMBEDDED_STOP_STRING

REPO = Path(__file__).resolve().parents[2]


def test_deepspeed_zero2_trains_one_step_on_cpu(model_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "tests" / "helpers" / "deepspeed_one_step.py"), "2", model_path],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["zero_stage"] == 2
    assert report["max_param_change"] > 0
    assert report["losses"][1] < report["losses"][0]


def test_vllm_async_engine_generates_inside_a_ray_actor(model_path):
    import ray
    from transformers import AutoTokenizer

    from open_instruct import cluster
    from open_instruct.generation.engine_setup import engine_settings
    from open_instruct.messages import PromptRequest, SamplingSettings
    from open_instruct.rewards import RewardSettings

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    cluster.init_ray(min_logical_cpus=2)
    try:
        [actor] = cluster.create_generation_actors(
            engine_settings(model_path=model_path, max_model_len=256, vllm_kv_cache_gib=0.25), 1, RewardSettings()
        )
        info = ray.get(actor.start.remote(), timeout=300)
        assert info.engine_id == 0 and info.target_concurrency >= 1
        requests = []
        for a, b in [(3, 4), (12, 7)]:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": f"What is {a} + {b}?"}], add_generation_prompt=True, tokenize=True
            )["input_ids"]
            requests.append(
                PromptRequest(
                    prompt_id=f"test:0:{a}+{b}",
                    prompt_token_ids=tuple(ids),
                    ground_truths=(str(a + b),),
                    verifier_names=("gsm8k",),
                    sampling=SamplingSettings(max_tokens=24, stop_strings=(EMBEDDED_STOP_STRING,)),
                    num_samples=3,
                    seed=5,
                    admitted_version=0,
                )
            )
        completions = ray.get(actor.generate.remote(requests), timeout=300)
        assert sorted((c.prompt_id, c.sample_index) for c in completions) == sorted(
            (r.prompt_id, j) for r in requests for j in range(3)
        )
        for c in completions:
            assert len(c.response_token_ids) > 0
            assert len(c.behaviour_logprobs) == len(c.response_token_ids)
            assert all(lp <= 0 for lp in c.behaviour_logprobs)
            assert c.finish_reason in ("stop", "length")
            assert c.version_spans[0].start == 0 and c.version_spans[-1].end == len(c.response_token_ids)
            assert c.reward in (0.0, 10.0) and not c.reward_errors
            assert tokenizer.decode(c.response_token_ids, skip_special_tokens=True) == c.response_text
            if c.finish_reason == "stop":
                assert c.response_text.endswith(EMBEDDED_STOP_STRING)
        ray.get(actor.shutdown.remote(), timeout=120)
    finally:
        ray.shutdown()
