"""The driver: data -> engines -> rewards -> (learners) -> metrics. The only caller of `ray.get`.

Current stage: the training loop (replay buffer, learner steps, in-flight weight sync) is
not wired in yet, so `run` does the generation half for real: it starts the vLLM engine
actors, streams every sample of the evaluation prompts through them, scores each with its
verifier, and reports reward and throughput. It says so in its log.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

from open_instruct.config import Config
from open_instruct.embedded_default import EMBEDDED_DATASET_NAME, EMBEDDED_MODEL_NAME, STOP_STRING
from open_instruct.generation import EngineSettings
from open_instruct.messages import SamplingSettings
from open_instruct.rewards import VerifierSettings
from open_instruct.rewards.scoring import RewardSettings

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


def _eval_data_config(cfg: Config):
    """The eval mix, falling back to the training mix (or the embedded eval split)."""
    d = cfg.data
    if d.dataset_mixer_eval_list:
        return d
    return dataclasses.replace(
        d,
        dataset_mixer_eval_list=d.dataset_mixer_list or [EMBEDDED_DATASET_NAME, "1.0"],
        dataset_mixer_eval_list_splits=["test"],
    )


def sampling_settings(cfg: Config) -> SamplingSettings:
    stop_strings = tuple(cfg.generation.stop_strings) or ((STOP_STRING,) if cfg.uses_embedded_default else ())
    return SamplingSettings(
        max_tokens=cfg.generation.response_length,
        temperature=cfg.generation.temperature,
        top_p=cfg.generation.vllm_top_p,
        stop_strings=stop_strings,
        include_stop_str_in_output=cfg.generation.include_stop_str_in_output,
    )


def reward_settings(cfg: Config) -> RewardSettings:
    return RewardSettings(
        apply_verifiable_reward=cfg.reward.apply_verifiable_reward,
        verification_reward=cfg.reward.verification_reward,
        non_stop_penalty=cfg.reward.non_stop_penalty,
        non_stop_penalty_value=cfg.reward.non_stop_penalty_value,
        format_reward=cfg.reward.format_reward,
        remap_verifier=cfg.remap_verifier,
        # A code verifier call may legitimately take its HTTP client's full timeout.
        verifier_timeout_s=max(30.0, min(300.0, 10 * cfg.reward.code_max_execution_time)) + 10,
        verifier=VerifierSettings(
            code_api_url=cfg.reward.code_api_url,
            code_max_execution_time=cfg.reward.code_max_execution_time,
            code_pass_rate_reward_threshold=cfg.reward.code_pass_rate_reward_threshold,
            ifeval_require_all=cfg.reward.ifeval_reward_mode == "all",
        ),
    )


def engine_settings(cfg: Config, model_path: str) -> EngineSettings:
    return EngineSettings(
        model_path=model_path,
        max_model_len=cfg.data.max_prompt_token_length + cfg.generation.response_length,
        seed=cfg.experiment.seed,
        tensor_parallel_size=cfg.generation.vllm_tensor_parallel_size,
        gpu_memory_utilization=cfg.generation.vllm_gpu_memory_utilization,
        enable_prefix_caching=cfg.generation.vllm_enable_prefix_caching,
        enforce_eager=cfg.generation.vllm_enforce_eager,
        kv_cache_gib=cfg.generation.vllm_kv_cache_gib,
    )


def run(cfg: Config) -> dict:
    from tqdm import tqdm

    from open_instruct import cluster, data
    from open_instruct.engine_pool import EnginePool
    from open_instruct.models import load_tokenizer, resolve_model_path
    from open_instruct.prompt_feeder import make_request

    logger.warning(
        "the training loop is not wired in yet: this run streams the evaluation prompts through the "
        "real engines and scores every sample (no learner steps)"
    )
    model_path = resolve_model_path(cfg.model.model_name_or_path)
    tokenizer = load_tokenizer(cfg.model)
    dataset = data.load_prompt_dataset(
        _eval_data_config(cfg), cfg.model, tokenizer, "eval", cfg.remap_verifier, seed=cfg.experiment.seed
    )
    logger.info("evaluation data:\n%s", dataset.report.summary())
    sampling = sampling_settings(cfg)
    n = cfg.generation.num_samples_per_prompt_rollout
    requests = [
        make_request(row, f"eval:{row.prompt_id}", sampling, n, cfg.experiment.seed, 0, is_eval=True)
        for row in dataset.prompts
    ]
    cluster.init_ray(min_logical_cpus=cfg.generation.vllm_num_engines + 1)
    actors = cluster.create_generation_actors(
        engine_settings(cfg, model_path), cfg.generation.vllm_num_engines, reward_settings(cfg)
    )
    pool = EnginePool(actors, prompt_capacity=len(requests) + 1)
    try:
        pool.start()
        started = time.monotonic()
        pool.submit(requests)
        completions = []
        with tqdm(total=len(requests) * n, desc="generating", unit="sample") as bar:
            while pool.ledger.in_flight():
                batch = pool.poll(timeout_s=1.0)
                completions += batch
                bar.update(len(batch))
                if completions:
                    bar.set_postfix(reward=f"{sum(c.reward for c in completions) / len(completions):.2f}")
        elapsed = time.monotonic() - started
        engine_stats = pool.stats()
        pool.stop("finish")
        pool.ledger.check_complete()
    finally:
        pool.shutdown()
    summary = _summarize(completions, elapsed)
    summary["time/generation_idle_frac"] = sum(s.idle_s for s in engine_stats) / max(
        1e-9, sum(s.uptime_s for s in engine_stats)
    )
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
