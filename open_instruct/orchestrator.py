"""The driver: data -> engines -> rewards -> (learners) -> metrics. The only caller of `ray.get`.

Current stage: the training loop (replay buffer, learner steps, in-flight weight sync) is
not wired in yet, so `run` does the generation half for real: it starts the vLLM engine
actors, streams every sample of the evaluation prompts through them, scores each with its
verifier, and reports reward and throughput. It says so in its log.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from open_instruct.config import Config
from open_instruct.embedded_default import EMBEDDED_DATASET_NAME, EMBEDDED_MODEL_NAME, STOP_STRING

logger = logging.getLogger(__name__)


def describe_sources(cfg: Config) -> str:
    if cfg.uses_embedded_default:
        return (
            f"using the embedded default: model {EMBEDDED_MODEL_NAME} and dataset {EMBEDDED_DATASET_NAME} "
            "(no --model_name_or_path / --dataset_mixer_list given; built on first use)"
        )
    model = cfg.model.model_name_or_path or EMBEDDED_MODEL_NAME
    data = " ".join(cfg.data.dataset_mixer_list) or EMBEDDED_DATASET_NAME
    return f"model {model}; training mix {data}"


def _eval_sources(cfg: Config) -> list[tuple[str, str, float]]:
    mix = cfg.data.dataset_mixer_eval_list or cfg.data.dataset_mixer_list or [EMBEDDED_DATASET_NAME, "1.0"]
    splits = cfg.data.dataset_mixer_eval_list_splits if cfg.data.dataset_mixer_eval_list else ["test"]
    names, weights = mix[::2], [float(w) for w in mix[1::2]]
    return [(n, splits[i] if len(splits) > 1 else splits[0], w) for i, (n, w) in enumerate(zip(names, weights))]


def run(cfg: Config) -> dict:
    import ray
    from tqdm import tqdm

    from open_instruct import cluster, data
    from open_instruct.generation import EngineSettings
    from open_instruct.messages import PromptRequest, SamplingSettings
    from open_instruct.models import load_tokenizer, resolve_model_path
    from open_instruct.rewards import VerifierSettings
    from open_instruct.rewards.scoring import RewardSettings

    logger.warning(
        "the training loop is not wired in yet: this run generates and scores the evaluation prompts "
        "with the real engines (no learner steps)"
    )
    model_path = resolve_model_path(cfg.model.model_name_or_path)
    tokenizer = load_tokenizer(cfg.model)
    prompts = []
    for name, split, weight in _eval_sources(cfg):
        rows = data.load_rows(name, split)
        count = int(weight) if weight > 1 else int(round(weight * len(rows)))
        prompts += data.rows_to_prompts(
            rows[:count], tokenizer, f"{name}:{split}",
            messages_key=cfg.data.sft_messages_key,
            ground_truths_key=cfg.data.ground_truths_key,
            add_bos=cfg.model.add_bos,
        )
    stop_strings = tuple(cfg.generation.stop_strings) or ((STOP_STRING,) if cfg.uses_embedded_default else ())
    sampling = SamplingSettings(
        max_tokens=cfg.generation.response_length,
        temperature=cfg.generation.temperature,
        top_p=cfg.generation.vllm_top_p,
        stop_strings=stop_strings,
        include_stop_str_in_output=cfg.generation.include_stop_str_in_output,
    )
    requests = [
        PromptRequest(
            prompt_id=f"{p.source}:0:{p.index}",
            prompt_token_ids=p.prompt_token_ids,
            ground_truths=p.ground_truths,
            verifier_names=p.verifier_names,
            sampling=sampling,
            num_samples=cfg.generation.num_samples_per_prompt_rollout,
            seed=cfg.experiment.seed * 1_000_003 + i * 1009,
            admitted_version=0,
            is_eval=True,
        )
        for i, p in enumerate(prompts)
    ]
    reward_settings = RewardSettings(
        apply_verifiable_reward=cfg.reward.apply_verifiable_reward,
        verification_reward=cfg.reward.verification_reward,
        non_stop_penalty=cfg.reward.non_stop_penalty,
        non_stop_penalty_value=cfg.reward.non_stop_penalty_value,
        remap_verifier=cfg.remap_verifier,
        verifier=VerifierSettings(
            code_api_url=cfg.reward.code_api_url,
            code_max_execution_time=cfg.reward.code_max_execution_time,
            code_pass_rate_reward_threshold=cfg.reward.code_pass_rate_reward_threshold,
        ),
    )
    settings = EngineSettings(
        model_path=model_path,
        max_model_len=cfg.data.max_prompt_token_length + cfg.generation.response_length,
        seed=cfg.experiment.seed,
        tensor_parallel_size=cfg.generation.vllm_tensor_parallel_size,
        gpu_memory_utilization=cfg.generation.vllm_gpu_memory_utilization,
        enable_prefix_caching=cfg.generation.vllm_enable_prefix_caching,
        enforce_eager=cfg.generation.vllm_enforce_eager,
        kv_cache_gib=cfg.generation.vllm_kv_cache_gib,
    )
    cluster.init_ray(min_logical_cpus=cfg.generation.vllm_num_engines + 1)
    engines = cluster.create_generation_actors(settings, cfg.generation.vllm_num_engines, reward_settings)
    try:
        ray.get([engine.start.remote() for engine in engines])
        started = time.monotonic()
        shards = [requests[i :: len(engines)] for i in range(len(engines))]
        pending = {engine.generate.remote(shard): len(shard) for engine, shard in zip(engines, shards) if shard}
        completions = []
        with tqdm(total=len(requests), desc="generating (prompts)", unit="prompt") as bar:
            while pending:
                [done], _ = ray.wait(list(pending), num_returns=1)
                bar.update(pending.pop(done))
                completions += ray.get(done)
        elapsed = time.monotonic() - started
    finally:
        for engine in engines:
            try:
                ray.get(engine.shutdown.remote(), timeout=60)
            finally:
                ray.kill(engine)
    summary = _summarize(completions, elapsed)
    _write_metrics(cfg, summary)
    logger.info(
        "generation-only run: %d samples from %d prompts in %.1fs; eval reward %.3f, correct %.1f%%, "
        "%.0f tokens/s",
        summary["samples"], len(requests), elapsed, summary["eval/verifiable_reward"],
        100 * summary["eval/correct_rate"], summary["perf/generated_tokens_per_s"],
    )
    return summary


def _summarize(completions, elapsed: float) -> dict:
    tokens = sum(len(c.response_token_ids) for c in completions)
    count = max(1, len(completions))
    return {
        "training_step": 0,
        "samples": len(completions),
        "eval/verifiable_reward": sum(c.reward for c in completions) / count,
        "eval/correct_rate": sum(1 for c in completions if c.reward > 0) / count,
        "eval/stop_rate": sum(1 for c in completions if c.finish_reason == "stop") / count,
        "eval/sequence_lengths": tokens / count,
        "eval/reward_errors": sum(len(c.reward_errors) for c in completions),
        "perf/generated_tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
        "time/generation_s": elapsed,
    }


def _write_metrics(cfg: Config, summary: dict) -> None:
    out = Path(cfg.experiment.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps(summary) + "\n")
