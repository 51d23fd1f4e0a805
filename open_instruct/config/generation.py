"""The engines and how they sample: batch shape, sampling, the lookahead and staleness bound, weight pushes,
engine faults, and evaluation sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from open_instruct.config.fields import arg

# The staleness bound of `--async_steps auto` when --max_off_policy_steps is not given: open-instruct's
# default lookahead, so `auto` never runs further ahead than an unchanged open-instruct script would.
DEFAULT_AUTO_BOUND = 8


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
    max_off_policy_steps: str | None = arg(
        None,
        "Staleness bound: a group whose oldest token is more than K learner versions behind at training time "
        "gets --off_policy_action. Default: --async_steps (open-instruct's bound); 8 with --async_steps auto. "
        "'auto': K tunes itself within [--off_policy_window_min, --off_policy_window_max], widening while the "
        "learner waits for batches and narrowing when the off-policy health limits are crossed "
        "(--off_policy_min_ess_frac, --off_policy_max_truncated_frac).",
    )
    off_policy_window_min: int = arg(
        1, "With --max_off_policy_steps auto: the smallest K (where it starts).", bounds=">= 1"
    )
    off_policy_window_max: int = arg(
        DEFAULT_AUTO_BOUND, "With --max_off_policy_steps auto: the largest K (capacities are sized for it)."
    )
    off_policy_min_ess_frac: float = arg(
        0.9,
        "With --max_off_policy_steps auto: the narrowest effective sample size of a step's importance weights "
        "pi_old/mu, as a fraction of its tokens (offpolicy/ess_frac), before K narrows; 0: no limit.",
        bounds="[0, 1)",
    )
    off_policy_max_truncated_frac: float = arg(
        0.02,
        "With --max_off_policy_steps auto: the largest share of a step's tokens whose importance weight hits the "
        "cap (offpolicy/truncated_frac, --truncated_importance_sampling_ratio_cap) before K narrows; 1: no limit.",
        bounds="(0, 1]",
    )
    off_policy_action: Literal["mask", "requeue", "drop", "downweight"] = arg(
        "mask",
        "For groups over --max_off_policy_steps: train the group whole at full weight on its tokens at most K "
        "versions old, the older ones kept as context outside the loss, and requeue it only when no token is "
        "that young (mask: a long answer is not lost for its age); admit the prompt again, fresh (requeue); "
        "drop it and admit another (drop); or train it at weight 0.5^(lag - K) (downweight). Requeue and drop "
        "also abort running samples that can no longer finish within the bound.",
    )
    inflight_updates: bool = arg(
        True,
        "Push new weights into running engines mid-generation (KV cache kept); False waits for running "
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
        1, "Push the learner's weights to the engines every N optimizer steps.", bounds=">= 1"
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

    @property
    def off_policy_window_auto(self) -> bool:
        return str(self.max_off_policy_steps).strip().lower() == "auto"

    @property
    def staleness_bound(self) -> int:
        """K: the largest version lag a trained group may have (see --off_policy_action); with a self-tuning
        window its largest value."""
        if self.off_policy_window_auto:
            return self.off_policy_window_max
        if self.max_off_policy_steps is not None:
            return int(self.max_off_policy_steps)
        return DEFAULT_AUTO_BOUND if self.async_steps_auto else int(self.async_steps)

    @property
    def staleness_bound_min(self) -> int:
        """The smallest K the run may use: the fixed bound, or the window's minimum."""
        return self.off_policy_window_min if self.off_policy_window_auto else self.staleness_bound

    def problems(self) -> list[str]:
        checks = [
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
        return [message for ok, message in checks if not ok] + self.window_problems()

    def window_problems(self) -> list[str]:
        """The lookahead and the staleness window: each valid, and together able to train something."""
        checks = [
            (
                self.async_steps_auto or self.async_steps.strip().isdigit(),
                f"--async_steps {self.async_steps!r} must be an integer >= 0 (0 = synchronous) or 'auto'",
            ),
            (
                self.max_off_policy_steps is None
                or self.off_policy_window_auto
                or str(self.max_off_policy_steps).strip().isdigit(),
                f"--max_off_policy_steps {self.max_off_policy_steps!r} must be an integer >= 0 or 'auto'",
            ),
            (
                str(self.max_off_policy_steps).strip() != "0" or not self.async_steps_auto,
                "--async_steps auto adapts the lookahead within [1, --max_off_policy_steps]; give a bound >= 1",
            ),
            (
                self.off_policy_window_min <= self.off_policy_window_max,
                f"--off_policy_window_min {self.off_policy_window_min} must be <= --off_policy_window_max "
                f"{self.off_policy_window_max}",
            ),
        ]
        problems = [message for ok, message in checks if not ok]
        if not problems:  # the bound is defined only once --async_steps and --max_off_policy_steps are valid
            problems += sync_interval_problems(
                self.staleness_bound_min, self.weight_sync_every_steps, self.off_policy_action
            )
        return problems


def sync_interval_problems(bound: int, sync_every: int, off_policy_action: str) -> list[str]:
    """Between weight syncs the engines fall up to `sync_every - 1` versions behind the learner. A tighter
    staleness bound dooms every sample before the next sync, which then never comes (the learner waits
    forever), unless late groups are down-weighted instead of dropped."""
    lag = sync_every - 1
    if off_policy_action == "downweight" or bound >= lag:
        return []
    return [
        f"--weight_sync_every_steps {sync_every} leaves the engines up to {lag} versions behind the learner, "
        f"more than the staleness bound {bound} allows: nothing would be trainable before the next sync; give "
        f"--max_off_policy_steps >= {lag} (or --off_policy_action downweight)"
    ]
