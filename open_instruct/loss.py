"""The GRPO learner objective: clipped policy loss, KL penalty, off-policy correction, masking.

Pure tensor functions over `[B, T]` rows (B rows, T token positions; one row is one sample or
one packed row of several samples) so the learner's train step stays a thin loop and every
formula is unit-tested by hand. Nothing here knows about Ray, vLLM or DeepSpeed.

Three policies meet in one step:

* **behaviour** (mu): the engine's policy that sampled each token; with in-flight weight
  updates one sample may span several weight versions, and vLLM's numerics differ from the
  learner's. Its logprobs come with the Completion.
* **old** (pi_old): the learner's weights at the start of the optimizer step, evaluated on the
  same tokens without grad. PPO's trust region is measured against it.
* **new** (pi_theta): the weights being trained (with grad).

Per token, the loss is (DAPO's token-level clipped objective, Dr. GRPO's aggregation):

    ratio = exp(new - old)
    pg    = max(-A * ratio, -A * clamp(ratio, 1 - clip_lower, 1 + clip_higher)) * w
    loss  = sum_valid(pg + beta * kl) / denominator

where `w` is the truncated importance weight pi_old / mu (`importance_weights`), which corrects
for the samples having been drawn by mu rather than pi_old, and `kl` is a per-token estimate of
KL(pi_theta || pi_ref) (`kl_per_token`).

Aggregation across micro-batches, accumulation steps and ranks
---------------------------------------------------------------
`policy_loss` returns `sum_valid(...) / denominator` of *its* micro-batch:

* `loss_denominator=None`: the micro-batch's own valid-token count (token mean). With several
  micro-batches per optimizer step this is a mean of means: tokens of short micro-batches weigh
  more than tokens of long ones.
* a constant: the Dr. GRPO denominator; the sum over micro-batches of `sum_i / c` is exactly
  `sum_all / c`.

DeepSpeed then averages gradients over the W data-parallel ranks and (when it runs gradient
accumulation itself) scales each micro-batch loss by 1/GAS. To get an exact objective over the
whole optimizer step (`sum over every valid token of every rank and micro-batch / D`), pass
`step_denominator(D, world_size=W, accumulation_steps=GAS)` as `loss_denominator`, where D is the
global valid-token count of the step (exact token mean, counted with the *final* masks, after
truncation and importance masking) or the Dr. GRPO constant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = [
    "ImportanceResult",
    "LossOutput",
    "importance_weights",
    "kl_per_token",
    "mask_truncated",
    "masked_mean",
    "masked_sum",
    "policy_loss",
    "step_denominator",
]

KLEstimator = Literal["kl1", "kl2", "kl3", "kl4"]
ImportanceMode = Literal["truncate", "mask_token", "mask_sequence"]

# Same numbering as config.algorithm.AlgorithmConfig.kl_estimator_name and open-instruct: estimator index i is kl{i+1}.
_KL_NAMES = {alias: f"kl{i + 1}" for i in range(4) for alias in (f"kl{i + 1}", str(i))}
# Log-ratios are clamped before exp: exp(40) ~ 2e17 is finite in float32 (overflow is at ~88),
# and a |log ratio| of 40 already means the token is garbage; beyond it the gradient is zero.
LOG_RATIO_CLAMP = 40.0


def _work_dtype(t: torch.Tensor) -> torch.dtype:
    # Compute in at least float32 (bf16 exp/sums lose the small differences PPO lives on),
    # but keep float64 when given it.
    return torch.promote_types(t.dtype, torch.float32)


def _bool_mask(mask_BT: torch.Tensor) -> torch.Tensor:
    return mask_BT if mask_BT.dtype == torch.bool else mask_BT != 0


# ----------------------------------------------------------------------------- reductions


def masked_sum(values_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Sum of `values` where `mask` is set. Masked positions contribute exactly 0, even if NaN/inf."""
    return torch.where(_bool_mask(mask_BT), values_BT, torch.zeros_like(values_BT)).sum()


def masked_mean(
    values_BT: torch.Tensor, mask_BT: torch.Tensor, denominator: float | torch.Tensor | None = None
) -> torch.Tensor:
    """`masked_sum / denominator`; `denominator=None` uses the valid-token count.

    An empty mask gives 0 (not 0/0 = NaN), and a zero gradient.
    """
    total = masked_sum(values_BT, mask_BT)
    if denominator is None:
        denominator = _bool_mask(mask_BT).sum().clamp(min=1)
    return total / denominator


def step_denominator(denominator: float, *, world_size: int = 1, accumulation_steps: int = 1) -> float:
    """Per-micro-batch `loss_denominator` that makes the whole optimizer step compute `sum_all / denominator`.

    `denominator` is either the global number of valid tokens of the step (all ranks, all
    micro-batches: exact token mean) or the Dr. GRPO constant. The engine averages gradients
    over `world_size` ranks and scales each micro-batch by `1 / accumulation_steps`; dividing
    the denominator by both cancels that. Pass `accumulation_steps=1` when the learner calls
    backward per micro-batch without the engine's own loss scaling.
    """
    if world_size < 1 or accumulation_steps < 1:
        raise ValueError("world_size and accumulation_steps must be >= 1")
    # A step with no valid token anywhere gives a zero loss; max(.,1) keeps it 0 / x, not 0 / 0.
    return max(float(denominator), 1.0) / (world_size * accumulation_steps)


# ----------------------------------------------------------------------------- KL


def kl_per_token(
    logprobs_BT: torch.Tensor,
    ref_logprobs_BT: torch.Tensor,
    estimator: str,
    old_logprobs_BT: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from the sampled tokens' logprobs, `[B, T]`.

    With d = logprobs - ref_logprobs (clamped to +-40):

    * kl1: d                                  (Schulman's k1; unbiased, high variance, can be < 0)
    * kl2: d^2 / 2                            (k2; low variance, biased)
    * kl3: expm1(-d) + d = (r - 1) - log r, r = ref/new   (k3; unbiased, >= 0; the default)
    * kl4: exp(logprobs - old_logprobs) * d   (k1 importance-weighted by the PPO ratio, since the
      tokens were sampled from pi_old, not pi_theta; needs `old_logprobs_BT`; grad flows through
      the ratio too, which makes its gradient the score-function gradient of the KL)

    `estimator` is "kl1".."kl4" or open-instruct's index "0".."3" (same mapping as
    `AlgorithmConfig.kl_estimator_name`: "0" -> kl1, "2" -> kl3). Every estimator is 0 where d = 0.
    Masked positions are not special-cased here: reduce with `masked_sum`/`masked_mean`.
    """
    name = _KL_NAMES.get(str(estimator).lower())
    if name is None:
        raise ValueError(f"unknown KL estimator {estimator!r}; use kl1, kl2, kl3, kl4 (or 0-3)")
    d_BT = (logprobs_BT - ref_logprobs_BT).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if name == "kl1":
        return d_BT
    if name == "kl2":
        return d_BT.square() / 2
    if name == "kl3":
        return torch.expm1(-d_BT) + d_BT
    if old_logprobs_BT is None:
        raise ValueError("kl4 weights k1 by the PPO ratio exp(new - old): pass old_logprobs_BT")
    log_ratio_BT = (logprobs_BT - old_logprobs_BT).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(log_ratio_BT) * d_BT


# ----------------------------------------------------------------------------- masks


def _token_sample_ids(mask_BT: torch.Tensor, sample_ids_BT: torch.Tensor | None) -> torch.Tensor:
    """Sample index of every position: the row index for unpacked rows, else `sample_ids_BT`."""
    if sample_ids_BT is None:
        rows_B1 = torch.arange(mask_BT.shape[0], device=mask_BT.device)[:, None]
        return rows_B1.expand(mask_BT.shape)
    if sample_ids_BT.shape != mask_BT.shape:
        shapes = f"{tuple(sample_ids_BT.shape)} != mask shape {tuple(mask_BT.shape)}"
        raise ValueError(f"sample_ids shape {shapes}")
    return sample_ids_BT.long()


def mask_truncated(
    mask_BT: torch.Tensor, finish_reasons_B: Sequence[str], sample_ids_BT: torch.Tensor | None = None
) -> torch.Tensor:
    """`--mask_truncated_completions`: drop from the loss every sample whose finish reason isn't "stop".

    "stop" is vLLM's reason for EOS or a stop string; "length" (cut at --response_length) and
    "abort" samples keep their place in the batch and in their group's advantages but train on
    no token. Unpacked rows: row b is sample b and `finish_reasons_B[b]` its reason. Packed rows:
    pass `sample_ids_BT` (the sample index of each position, indexing `finish_reasons_B`;
    negative where no sample, and those positions are left as they are). Returns a bool mask.
    """
    mask_BT = _bool_mask(mask_BT)
    stopped = [reason == "stop" for reason in finish_reasons_B]
    stopped_S = torch.tensor(stopped, dtype=torch.bool, device=mask_BT.device)
    if sample_ids_BT is None and stopped_S.shape[0] != mask_BT.shape[0]:
        raise ValueError(f"{len(finish_reasons_B)} finish reasons for {mask_BT.shape[0]} rows")
    ids_BT = _token_sample_ids(mask_BT, sample_ids_BT)
    has_sample_BT = ids_BT >= 0
    stopped_BT = stopped_S[ids_BT.clamp(min=0)] if stopped_S.numel() else torch.ones_like(mask_BT)
    return mask_BT & (stopped_BT | ~has_sample_BT)


# ----------------------------------------------------------------------------- importance weights


@dataclass(frozen=True)
class ImportanceResult:
    """Truncated importance weights pi_old / mu and the mask that survives them.

    weights_BT: detached; 0 wherever `mask_BT` is False, so it can multiply the per-token loss.
    mask_BT: the input mask minus the tokens/sequences the mode dropped (bool). Use it as the
        loss mask (and to count tokens for the denominator).
    stats: detached 0-dim tensors (no host sync), same keys in every mode, all over the *input*
        mask's valid tokens: rho_mean, rho_min, rho_max, rho_sq_mean (1.0 when there is none), truncated_frac
        (kept tokens whose weight was capped at `cap`), masked_frac (tokens removed),
        num_tokens. Average over micro-batches weighted by num_tokens.
    """

    weights_BT: torch.Tensor
    mask_BT: torch.Tensor
    stats: dict[str, torch.Tensor]


@dataclass(frozen=True)
class RhoBounds:
    """open-instruct's --rho_* bounds, on top of `importance_weights`' mode; 0 disables each.

    clamp_lower: weights are at least this (a lower clamp next to the cap's upper one).
    mask_lower / mask_upper: tokens whose rho is below / above are dropped (IcePop-style).
    sequence_level: rho is replaced, for masking and clamping, by its sample's geometric mean
        exp(mean log rho), over each *sample* (open-instruct averages over a packed row, which
        mixes the samples packed together).
    tv_divergence: VACO-style: instead of masking tokens by their rho, compare each sample's mean
        |rho - 1| with the mask bounds, and in a sample outside them drop only the tokens that would
        push it further (sign(log rho) * advantage > 0). Needs the advantages.
    """

    clamp_lower: float = 0.0
    mask_lower: float = 0.0
    mask_upper: float = 0.0
    sequence_level: bool = False
    tv_divergence: bool = False


@torch.no_grad()
def importance_weights(
    old_logprobs_BT: torch.Tensor,
    behaviour_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    cap: float,
    mode: ImportanceMode = "truncate",
    sample_ids_BT: torch.Tensor | None = None,
    bounds: RhoBounds | None = None,
    advantages_BT: torch.Tensor | None = None,
) -> ImportanceResult:
    """Off-policy correction between the learner's step-start policy and the engines' behaviour policy.

    rho = exp(old - behaviour) per token. Kept tokens are always weighted by min(rho, cap)
    (truncated importance sampling, TIS: bounded variance, slight bias). `mode` chooses what is
    dropped on top:

    * "truncate": nothing; the mask is unchanged.
    * "mask_token": tokens with rho outside [1/cap, cap] (IcePop-style: a token the two policies
      disagree on that much is noise, not signal).
    * "mask_sequence": whole samples whose sequence ratio is outside [1/cap, cap]. The sequence
      ratio is exp(mean over the sample's valid tokens of log rho), the per-token geometric mean:
      the exp of the *sum* would grow with length and drop nearly every long sample for a
      per-token drift that TIS handles fine. Samples are rows, or `sample_ids_BT` (>= 0 on
      valid tokens) for packed rows.

    `bounds` adds open-instruct's explicit bounds (`RhoBounds`). `cap == 0` disables the correction:
    weights are 1 on valid tokens and the mask is unchanged (stats are still computed, to watch the
    drift), bounds included. Masking modes need cap >= 1.
    """
    if cap < 0:
        raise ValueError(f"importance ratio cap must be >= 0 (0 disables), got {cap}")
    if mode not in ("truncate", "mask_token", "mask_sequence"):
        raise ValueError(f"mode must be truncate, mask_token or mask_sequence, got {mode!r}")
    if mode != "truncate" and 0 < cap < 1:
        raise ValueError(f"mode {mode!r} keeps rho in [1/cap, cap], which is empty for cap {cap} < 1")
    mask_BT = _bool_mask(mask_BT)
    dtype = _work_dtype(old_logprobs_BT)
    # NaN behaviour logprob: a token the engine did not sample (tool or environment output trained with
    # --mask_tool_use False). There is no behaviour policy to correct for, so its ratio is 1.
    behaviour_logprobs_BT = torch.where(torch.isnan(behaviour_logprobs_BT), old_logprobs_BT, behaviour_logprobs_BT)
    # where() before exp: padding may hold -inf/garbage logprobs.
    log_rho_BT = torch.where(mask_BT, (old_logprobs_BT - behaviour_logprobs_BT).to(dtype), 0.0)
    rho_BT = torch.exp(log_rho_BT.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    num_valid = mask_BT.sum()

    if cap == 0:
        keep_BT = mask_BT
        weights_BT = mask_BT.to(dtype)
    else:
        keep_BT = _kept_tokens(rho_BT, log_rho_BT, mask_BT, cap, mode, sample_ids_BT)
        weights_BT = torch.where(keep_BT, rho_BT.clamp(max=cap), 0.0)
        if bounds is not None:
            keep_BT = _bounds_mask(bounds, rho_BT, log_rho_BT, keep_BT, mask_BT, sample_ids_BT, advantages_BT)
            weights_BT = _bounds_weights(bounds, rho_BT, log_rho_BT, keep_BT, mask_BT, cap, sample_ids_BT)
    stats = _importance_stats(rho_BT, mask_BT, keep_BT, cap, num_valid)
    return ImportanceResult(weights_BT=weights_BT, mask_BT=keep_BT, stats=stats)


def _bounds_mask(b: RhoBounds, rho_BT, log_rho_BT, keep_BT, mask_BT, sample_ids_BT, advantages_BT):
    """The tokens `RhoBounds` keeps (see there)."""
    if b.tv_divergence:
        if advantages_BT is None:
            raise ValueError("tv_divergence masking needs the advantages")
        divergence_BT = _sample_mean((rho_BT - 1).abs(), mask_BT, sample_ids_BT)
        outside_BT = torch.zeros_like(keep_BT)
        if b.mask_upper > 0:
            outside_BT = outside_BT | (divergence_BT > b.mask_upper)
        if b.mask_lower > 0:
            outside_BT = outside_BT | (divergence_BT < b.mask_lower)
        advantages_BT = advantages_BT if advantages_BT.dim() == 2 else advantages_BT[:, None]
        pushes_further_BT = torch.sign(log_rho_BT) * advantages_BT > 0
        return keep_BT & ~(outside_BT & pushes_further_BT)
    if b.sequence_level:
        rho_BT = torch.exp(_sample_mean(log_rho_BT, mask_BT, sample_ids_BT).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    if b.mask_lower > 0:
        keep_BT = keep_BT & (rho_BT >= b.mask_lower)
    if b.mask_upper > 0:
        keep_BT = keep_BT & (rho_BT <= b.mask_upper)
    return keep_BT


def _bounds_weights(b: RhoBounds, rho_BT, log_rho_BT, keep_BT, mask_BT, cap: float, sample_ids_BT):
    """Weights under `RhoBounds`: clamped to [clamp_lower, cap], per sample when sequence-level."""
    if b.sequence_level:
        rho_BT = torch.exp(_sample_mean(log_rho_BT, mask_BT, sample_ids_BT).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return torch.where(keep_BT, rho_BT.clamp(min=b.clamp_lower or None, max=cap), 0.0)


def _kept_tokens(
    rho_BT: torch.Tensor,
    log_rho_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    cap: float,
    mode: ImportanceMode,
    sample_ids_BT: torch.Tensor | None,
) -> torch.Tensor:
    """The valid tokens `mode` keeps (see `importance_weights`); cap > 0."""
    if mode == "truncate":
        return mask_BT
    if mode == "mask_token":
        return mask_BT & (rho_BT >= 1.0 / cap) & (rho_BT <= cap)
    seq_rho_BT = torch.exp(_sample_mean(log_rho_BT, mask_BT, sample_ids_BT))
    return mask_BT & (seq_rho_BT >= 1.0 / cap) & (seq_rho_BT <= cap)


def _importance_stats(
    rho_BT: torch.Tensor, mask_BT: torch.Tensor, keep_BT: torch.Tensor, cap: float, num_valid: torch.Tensor
) -> dict[str, torch.Tensor]:
    count = num_valid.clamp(min=1)
    truncated = keep_BT & (rho_BT > cap) if cap > 0 else torch.zeros_like(mask_BT)
    has_tokens = num_valid > 0
    return {
        "rho_mean": torch.where(has_tokens, masked_sum(rho_BT, mask_BT) / count, 1.0),
        "rho_min": torch.where(has_tokens, torch.where(mask_BT, rho_BT, float("inf")).min(), 1.0),
        "rho_max": torch.where(has_tokens, torch.where(mask_BT, rho_BT, float("-inf")).max(), 1.0),
        "rho_sq_mean": torch.where(has_tokens, masked_sum(rho_BT.square(), mask_BT) / count, 1.0),
        "truncated_frac": truncated.sum() / count,
        "masked_frac": (mask_BT & ~keep_BT).sum() / count,
        "num_tokens": num_valid,
    }


def effective_sample_fraction(rho_mean: float, rho_sq_mean: float) -> float:
    """Kish's effective sample size of the importance weights, as a fraction of the tokens: E[rho]^2 / E[rho^2].
    1 when the engines sampled from the learner's policy; it falls as they drift apart (stale weights), and
    it is exact for a whole step when both means are token means over the step."""
    if rho_sq_mean <= 0:
        return 1.0
    # <= 1 by Jensen's inequality; float32 means of weights that are all ~1 can round a hair above it.
    return min(1.0, rho_mean * rho_mean / rho_sq_mean)


def _sample_mean(values_BT: torch.Tensor, mask_BT: torch.Tensor, sample_ids_BT: torch.Tensor | None) -> torch.Tensor:
    """Mean of `values` over the valid tokens of each position's sample, spread back to `[B, T]`."""
    ids_BT = _token_sample_ids(mask_BT, sample_ids_BT)
    if bool((ids_BT[mask_BT] < 0).any()):
        raise ValueError("sample_ids must be >= 0 on every valid token")
    ids_BT = torch.where(mask_BT, ids_BT, 0)
    num_samples = int(ids_BT.max()) + 1 if ids_BT.numel() else 1
    sums_S = torch.zeros(num_samples, dtype=values_BT.dtype, device=values_BT.device)
    sums_S.index_add_(0, ids_BT[mask_BT], values_BT[mask_BT])
    counts_S = torch.zeros(num_samples, dtype=values_BT.dtype, device=values_BT.device)
    counts_S.index_add_(0, ids_BT[mask_BT], torch.ones_like(values_BT[mask_BT]))
    return (sums_S / counts_S.clamp(min=1))[ids_BT]


# ----------------------------------------------------------------------------- policy loss


@dataclass(frozen=True)
class LossOutput:
    """The micro-batch loss (with grad) and detached 0-dim statistics (no host sync).

    Every statistic is a mean over the micro-batch's valid tokens (0 when it has none),
    independent of `loss_denominator`; combine micro-batches weighted by `num_tokens`.

    policy_loss_avg: the (importance-weighted) clipped policy term -> `loss/policy_avg`.
    kl_avg: the KL estimate (0 without `kl_BT`) -> `objective/kl_avg`.
    clipfrac: fraction of tokens where the clipped branch was active -> `policy/clipfrac_avg`.
    ratio_avg: mean of exp(new - old).
    approx_kl: mean of (new - old)^2 / 2, how far this step has moved from pi_old.
    num_tokens: valid tokens in the micro-batch.
    """

    loss: torch.Tensor
    policy_loss_avg: torch.Tensor
    kl_avg: torch.Tensor
    clipfrac: torch.Tensor
    ratio_avg: torch.Tensor
    approx_kl: torch.Tensor
    num_tokens: torch.Tensor


def _check_loss_settings(clip_lower: float, clip_higher: float, loss_denominator) -> None:
    if clip_lower < 0 or clip_higher < 0:
        raise ValueError("clip_lower and clip_higher must be >= 0")
    # (A tensor denominator is not checked: float() on it would sync the device every micro-batch.)
    if isinstance(loss_denominator, (int, float)) and loss_denominator <= 0:
        raise ValueError(f"loss_denominator must be None (token mean) or > 0, got {loss_denominator}")


def policy_loss(
    new_logprobs_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    advantages: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_lower: float,
    clip_higher: float,
    loss_denominator: float | torch.Tensor | None = None,
    importance_weights_BT: torch.Tensor | None = None,
    kl_BT: torch.Tensor | None = None,
    beta: float = 0.0,
    loss_fn: str = "dapo",
) -> LossOutput:
    """Token-level policy loss (DAPO clipped surrogate, or CISPO) plus beta * KL, summed over valid tokens /
    denominator.

    loss_fn "dapo": max(-A r, -A clip(r, 1 - clip_lower, 1 + clip_higher)) with r = pi_theta / pi_old.
    loss_fn "cispo": -A min(sg(r), 1 + clip_higher) log pi_theta, i.e. REINFORCE with a clipped,
        stop-gradient importance weight: clipped tokens still get a gradient, only a smaller one
        (clip_lower is unused).

    advantages: `[B, T]` per token (packed rows) or `[B]` per row (broadcast over T).
    mask_BT: response tokens that train (bool or 0/1): after `mask_truncated` and the
        `ImportanceResult.mask_BT`, if used.
    loss_denominator: None = this micro-batch's valid-token count; a number = that constant
        (Dr. GRPO, or `step_denominator(...)` for an exact mean over the whole step; see the
        module docstring).
    importance_weights_BT: pi_old / mu weights (treated as constants) multiplying the policy
        term only; the KL term estimates KL(pi_theta || pi_ref) and is not reweighted.
    kl_BT: from `kl_per_token` (with grad); added as beta * kl when beta > 0.

    Where the clipped branch is active (A > 0 and ratio > 1 + clip_higher, or A < 0 and
    ratio < 1 - clip_lower) the policy term's gradient is zero. A fully masked micro-batch gives
    loss 0 with zero, finite gradients.
    """
    _check_loss_settings(clip_lower, clip_higher, loss_denominator)
    mask_BT = _bool_mask(mask_BT)
    dtype = _work_dtype(new_logprobs_BT)
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    advantages_BT = advantages.to(dtype).detach()

    # Padding may hold anything (-inf, garbage): zero the log-ratio there *before* exp, or
    # where()'s zero gradient times exp's inf would still be NaN.
    log_ratio_BT = torch.where(mask_BT, new_logprobs_BT.to(dtype) - old_logprobs_BT.to(dtype).detach(), 0.0)
    ratio_BT = torch.exp(log_ratio_BT)
    logprobs_BT = torch.where(mask_BT, new_logprobs_BT.to(dtype), 0.0)
    pg_BT, clipped_BT = _surrogate(loss_fn, ratio_BT, logprobs_BT, advantages_BT, clip_lower, clip_higher)
    if importance_weights_BT is not None:
        pg_BT = pg_BT * importance_weights_BT.to(dtype).detach()
        clipped_BT = clipped_BT & (importance_weights_BT != 0)  # a token the correction dropped is not "clipped"
    per_token_BT = pg_BT
    if kl_BT is not None and beta > 0:
        per_token_BT = per_token_BT + beta * kl_BT.to(dtype)

    loss = masked_mean(per_token_BT, mask_BT, loss_denominator)
    return _with_diagnostics(loss, mask_BT, pg_BT, kl_BT, clipped_BT, ratio_BT, log_ratio_BT)


def _surrogate(loss_fn: str, ratio_BT, logprobs_BT, advantages_BT, clip_lower: float, clip_higher: float):
    """(per-token policy term, clipped tokens) of `loss_fn` (see `policy_loss`)."""
    if loss_fn == "cispo":
        weight_BT = ratio_BT.detach().clamp(max=1.0 + clip_higher)
        return -advantages_BT * weight_BT * logprobs_BT, ratio_BT.detach() > 1.0 + clip_higher
    if loss_fn == "dapo":
        pg_unclipped_BT = -advantages_BT * ratio_BT
        pg_clipped_BT = -advantages_BT * ratio_BT.clamp(1.0 - clip_lower, 1.0 + clip_higher)
        return torch.maximum(pg_unclipped_BT, pg_clipped_BT), pg_clipped_BT > pg_unclipped_BT
    raise ValueError(f"loss_fn must be dapo or cispo, got {loss_fn!r}")


@torch.no_grad()
def _with_diagnostics(loss, mask_BT, pg_BT, kl_BT, clipped_BT, ratio_BT, log_ratio_BT) -> LossOutput:
    """The loss plus its token means over `mask_BT` (what the learner logs)."""
    dtype = pg_BT.dtype
    count = mask_BT.sum().clamp(min=1)

    def mean(values_BT: torch.Tensor) -> torch.Tensor:
        return masked_sum(values_BT.detach().to(dtype), mask_BT) / count

    return LossOutput(
        loss=loss,
        policy_loss_avg=mean(pg_BT),
        kl_avg=mean(kl_BT) if kl_BT is not None else torch.zeros((), dtype=dtype, device=pg_BT.device),
        clipfrac=mean(clipped_BT.to(dtype)),
        ratio_avg=mean(ratio_BT),
        approx_kl=mean(log_ratio_BT.square() / 2),
        num_tokens=mask_BT.sum(),
    )
