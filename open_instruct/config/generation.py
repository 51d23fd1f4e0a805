"""The engines and how they sample: batch shape, sampling, the lookahead, weight syncs, engine faults, and
evaluation sampling. (How old a trained token may be is `config.staleness`.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from open_instruct.config.fields import arg


@dataclass(frozen=True)
class GenerationConfig:
    _argument_group_name = "generation (vLLM engines)"

    num_unique_prompts_rollout: int = arg(16, "Prompts per training step (groups per batch).", bounds=">= 1")
    num_samples_per_prompt_rollout: int = arg(4, "Samples per prompt (GRPO group size).")
    response_length: int = arg(256, "Maximum generated tokens per sample.", bounds="> 0")
    temperature: float = arg(1.0, "Sampling temperature, in the range vLLM accepts.", bounds="[0, 2]")
    vllm_top_p: float = arg(1.0, "Nucleus sampling p.", bounds="(0, 1]")
    stop_strings: list[str] = arg([], "Strings that end a sample (e.g. '</answer>').")
    include_stop_str_in_output: bool = arg(True, "Keep the stop string in the response (and train on it).")
    async_steps: str = arg(
        "8",
        "How many optimizer steps generation may run ahead of the learner: an integer (0 = synchronous), or "
        "'auto' to follow the measured group latency and learner step time within [1, --max_off_policy_steps].",
    )
    inflight_updates: bool = arg(
        True,
        "Sync new weights into running engines mid-generation (KV cache kept); False waits for running "
        "requests to finish before each update (the conservative baseline).",
    )
    inflight_update_kv: Literal["keep", "reprefill"] = arg(
        "keep",
        "What an in-flight update does with running samples: keep their KV cache and decode on with the new "
        "weights (keep), or abort them, keep their tokens and logprobs, and continue each after one fresh "
        "prefill of prompt + tokens under the new weights (reprefill: the approach of verl, AReaL and slime, "
        "measured side by side in the e2e benchmark).",
    )
    weight_sync_every_steps: int = arg(
        1, "Sync the learner's weights to the engines every N optimizer steps.", bounds=">= 1"
    )
    vllm_num_engines: int = arg(1, "Number of vLLM engine actors.", bounds=">= 1")
    vllm_tensor_parallel_size: int = arg(
        1, "GPUs per engine (tensor parallel, vLLM's mp workers in the actor).", bounds=">= 1"
    )
    vllm_gpu_memory_utilization: float = arg(
        0.9, "Fraction of GPU memory vLLM may use (see --single_gpu_mode).", bounds="(0, 1]"
    )
    vllm_enable_prefix_caching: bool = arg(False, "Reuse KV blocks of shared prefixes (salted per weight version).")
    vllm_enforce_eager: bool = arg(False, "Disable CUDA graphs (always eager on CPU).")
    vllm_kv_cache_gib: float = arg(1.0, "KV-cache size per engine in GiB on CPU machines.", bounds="> 0")
    max_engine_restarts: int = arg(
        3,
        "Generation engines that die (process killed, engine error) are replaced this many times in a run: "
        "their unfinished samples go back to the queue and the new engine gets the current weights. 0: a dead "
        "engine ends the run.",
        bounds=">= 0",
    )
    partial_report_tokens: int = arg(
        256,
        "Every this many new tokens a running sample's tokens and logprobs go to the driver, so that a sample "
        "whose engine dies continues on another engine from there (one re-prefill) instead of starting over; "
        "samples running when the run stops are saved whole in the resume state. 0: dead engines' samples restart.",
        bounds=">= 0",
    )
    engine_hang_timeout_s: float = arg(
        300.0,
        "An engine that neither answers nor produces a token for this long while it has samples running is "
        "taken for hung: killed and replaced like a dead one (within --max_engine_restarts). 0: never.",
        bounds=">= 0",
    )
    max_error_fraction: float = arg(
        0.5,
        "The run stops with the cause (the most common error messages and their counts) when more than this share "
        "of its latest finished training samples failed: the engine could not generate the sample (finish_reason "
        "'error'), or a verifier could not score it (it raised or timed out: reward_errors, and the reward is a "
        "stand-in 0). An aborted sample (cut while generating) and a failed tool call (part of what the model did) "
        "are not failures. The window "
        "is every sample the lookahead admits at once ((--async_steps + 1) x prompts x samples per prompt; at least "
        "64, at most the samples left to train), judged once that many finished: failures that arrive fast cannot "
        "fill it before the healthy samples admitted with them, one unlucky small step cannot end a run, and a short "
        "run is judged before it ends. Its share is logged as val/error_frac. 1: no limit (a step whose every "
        "sample failed still ends the run).",
        bounds="[0, 1]",
    )
    vllm_attention_backend: str | None = arg(None, "vLLM attention backend of the engines; None lets vLLM choose.")
    eval_pass_at_k: int = arg(
        1,
        "Samples per eval prompt; > 1 samples at the training temperature and logs unbiased eval/pass_at_{k}.",
        bounds=">= 1",
    )
    eval_top_p: float | None = arg(
        None, "Eval top_p; given, eval samples at the training temperature instead of greedily.", bounds="(0, 1]"
    )
    eval_response_length: int | None = arg(
        None, "Max new tokens of eval samples (default: --response_length).", bounds=">= 1"
    )

    @property
    def async_steps_auto(self) -> bool:
        return self.async_steps.strip().lower() == "auto"

    def problems(self) -> list[str]:
        checks = [
            (
                self.async_steps_auto or self.async_steps.strip().isdigit(),
                f"--async_steps {self.async_steps!r} must be an integer >= 0 (0 = synchronous) or 'auto'",
            ),
            (
                self.num_samples_per_prompt_rollout >= 2,
                "--num_samples_per_prompt_rollout must be >= 2: group-relative advantages need at least two samples",
            ),
            (
                self.inflight_updates or self.inflight_update_kv == "keep",
                "--inflight_update_kv reprefill says what an in-flight update does with running samples; "
                "--inflight_updates False makes every update wait for them instead: drop one of the two",
            ),
        ]
        return [message for ok, message in checks if not ok]
