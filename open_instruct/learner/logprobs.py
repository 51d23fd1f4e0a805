"""Token log-probabilities and entropies of packed rows under the policy: the learner's numeric kernel.

Target-aligned like every per-token tensor of a packed row (`packing`): out[:, t] is the log-probability
of `input_ids[t]` predicted from the logits at t-1, 0 at each document's first position. Computed in
chunks with a hand-written backward (`TokenLogprobs`), so no [B, T, V] fp32 copy of the logits is ever
made. Pure torch, tested on CPU (`tests/unit/test_logprobs.py`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Flattened (batch * time) positions per chunk in `logprobs_from_logits`; bounds the fp32 temporaries
# to chunk * vocab floats (2048 * 152k * 4 B = 1.2 GB for Qwen-sized vocabularies).
DEFAULT_LOGPROB_CHUNK_TOKENS = 2048


def to_prediction_positions(target_aligned_BT: torch.Tensor, fill_value: float = 0) -> torch.Tensor:
    """Move target-aligned values onto the logit positions that predict them.

    out[:, t] = x[:, t + 1]: the logits at t predict token t + 1. The last column has no target
    in the row and gets `fill_value`. Needed only by code working on logits directly (e.g. an
    entropy or cross-entropy over `logits[:, t]`); everything else here is target-aligned.
    """
    # torch.cat rather than F.pad: pad does not accept bool tensors (masks).
    fill_B1 = target_aligned_BT.new_full((target_aligned_BT.shape[0], 1), fill_value)
    return torch.cat([target_aligned_BT[:, 1:], fill_B1], dim=1)


class TokenLogprobs(torch.autograd.Function):
    """log softmax(logits / T)[target] per row of a [N, V] matrix, in chunks, with a chunked backward.

    Autograd of the plain expression saves one fp32 copy of the logits per chunk for backward,
    i.e. a full fp32 copy of the batch's logits whenever they are bf16. This saves only the
    logits tensor (kept alive by the model's graph anyway) and one logsumexp per token, and
    recomputes the softmax chunk by chunk in backward: d lp / d z = (onehot - softmax) / T.
    """

    @staticmethod
    def forward(ctx, logits_NV, targets_N, temperature, chunk_tokens):  # type: ignore[override]
        logprobs_N = torch.empty(logits_NV.shape[0], dtype=torch.float32, device=logits_NV.device)
        logsumexp_N = torch.empty_like(logprobs_N)
        for start in range(0, logits_NV.shape[0], chunk_tokens):
            chunk = slice(start, start + chunk_tokens)
            scaled_CV = scaled_fp32(logits_NV[chunk], temperature)
            logsumexp_N[chunk] = torch.logsumexp(scaled_CV, dim=-1)
            picked_C = scaled_CV.gather(-1, targets_N[chunk, None]).squeeze(-1)
            logprobs_N[chunk] = picked_C - logsumexp_N[chunk]
        ctx.save_for_backward(logits_NV, targets_N, logsumexp_N)
        ctx.temperature = temperature
        ctx.chunk_tokens = chunk_tokens
        return logprobs_N

    @staticmethod
    def backward(ctx, grad_N):  # type: ignore[override]
        logits_NV, targets_N, logsumexp_N = ctx.saved_tensors
        grad_logits_NV = torch.empty_like(logits_NV)
        for start in range(0, logits_NV.shape[0], ctx.chunk_tokens):
            chunk = slice(start, start + ctx.chunk_tokens)
            scaled_CV = scaled_fp32(logits_NV[chunk], ctx.temperature)
            grad_C1 = grad_N[chunk, None].float()
            # softmax * (-grad), then + grad at the target: (onehot - softmax) * grad, over T below.
            grad_CV = (scaled_CV - logsumexp_N[chunk, None]).exp_().mul_(-grad_C1)
            grad_CV.scatter_add_(-1, targets_N[chunk, None], grad_C1)
            grad_logits_NV[chunk] = grad_CV.div_(ctx.temperature)
        return grad_logits_NV, None, None, None


def scaled_fp32(logits_CV: torch.Tensor, temperature: float) -> torch.Tensor:
    # Fresh fp32 copy of one chunk (in-place scaling never touches the caller's logits).
    scaled_CV = logits_CV.to(torch.float32, copy=True)
    return scaled_CV.div_(temperature) if temperature != 1.0 else scaled_CV


def logprobs_from_logits(
    logits_BTV: torch.Tensor,
    input_ids_BT: torch.Tensor,
    temperature: float = 1.0,
    position_ids_BT: torch.Tensor | None = None,
    chunk_tokens: int = DEFAULT_LOGPROB_CHUNK_TOKENS,
) -> torch.Tensor:
    """Target-aligned log-probabilities: out[:, t] = log softmax(logits[:, t-1] / T)[input_ids[:, t]].

    Returns fp32 [B, T]; out[:, 0] = 0. With `position_ids_BT`, every document start
    (position 0) is also set to 0: its "prediction" would come from the previous document.
    `temperature` must match the sampler's, since the engine's logprobs are of the tempered
    distribution.

    Memory: computed as logit[target] - logsumexp over flattened chunks of `chunk_tokens`
    positions, so no [B, T, V] fp32 log_softmax (nor fp32 copy of bf16 logits) is ever
    materialised, in forward or backward (`TokenLogprobs`); peak extra memory is one
    [chunk_tokens, V] fp32 block. Differentiable w.r.t. the logits.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    batch, time, vocab = logits_BTV.shape
    # Predict with every position (the last one's target is a dummy 0, dropped below) rather than
    # slicing logits[:, :-1], whose reshape would copy the whole logits tensor.
    next_ids_BT = F.pad(input_ids_BT[:, 1:], (0, 1), value=0)
    predicted_N = TokenLogprobs.apply(
        logits_BTV.reshape(batch * time, vocab), next_ids_BT.reshape(-1), float(temperature), chunk_tokens
    )
    logprobs_BT = F.pad(predicted_N.view(batch, time)[:, :-1], (1, 0), value=0.0)
    if position_ids_BT is not None:
        logprobs_BT = logprobs_BT.masked_fill(position_ids_BT == 0, 0.0)
    return logprobs_BT


@torch.no_grad()
def token_entropy_from_logits(
    logits_BTV: torch.Tensor, temperature: float = 1.0, chunk_tokens: int = DEFAULT_LOGPROB_CHUNK_TOKENS
) -> torch.Tensor:
    """Target-aligned entropy [B, T] of softmax(logits / T): out[:, t] is the entropy of the distribution
    that sampled token t (out[:, 0] = 0). Chunked like the logprobs, no grad (a diagnostic)."""
    batch, time, vocab = logits_BTV.shape
    flat_NV = logits_BTV.reshape(batch * time, vocab)
    entropy_N = torch.empty(batch * time, dtype=torch.float32, device=logits_BTV.device)
    for start in range(0, flat_NV.shape[0], chunk_tokens):
        scaled_CV = scaled_fp32(flat_NV[start : start + chunk_tokens], float(temperature))
        logp_CV = torch.log_softmax(scaled_CV, dim=-1)
        entropy_N[start : start + chunk_tokens] = -(logp_CV.exp() * logp_CV).sum(-1)
    return F.pad(entropy_N.view(batch, time)[:, :-1], (1, 0), value=0.0)


def packed_token_logprobs(
    model: torch.nn.Module, row_batch: dict[str, torch.Tensor], temperature: float = 1.0, with_entropy: bool = False
):
    """Target-aligned log-probabilities [B, T] of a collated batch of packed rows under an HF causal LM.

    Calls `model(input_ids, position_ids, attention_mask=None, use_cache=False)`; tensors must
    already be on the model's device.

    Verified against transformers 5.19 (`masking_utils.py`, Qwen2 with sdpa and eager;
    `tests/unit/test_logprobs.py` checks it numerically): `create_causal_mask` ->
    `_preprocess_mask_arguments` calls `find_packed_sequence_indices(position_ids)` (a new
    document wherever position_ids[t] - position_ids[t-1] != 1) and AND-s that
    `packed_sequence_mask` into the causal mask, giving a per-document block-diagonal mask.
    It does so ONLY if `attention_mask is None and past_key_values is None`, and Qwen2Model
    creates a DynamicCache whenever `use_cache` is true, which is the config default (also in
    train mode, unless gradient checkpointing is on). With the default, the packed detection is
    silently skipped and attention crosses documents (max logit error ~1 on the tiny model),
    hence the explicit `use_cache=False`. Flash-attention paths derive varlen boundaries from
    the same position restarts. No 4D mask is built here: a 4D mask would be returned as-is
    and must match each backend's format (bool for sdpa, additive float for eager), and flash
    attention accepts none.
    """
    output = model(
        input_ids=row_batch["input_ids"],
        position_ids=row_batch["position_ids"],
        attention_mask=None,
        use_cache=False,
    )
    logprobs_BT = logprobs_from_logits(
        output.logits, row_batch["input_ids"], temperature, position_ids_BT=row_batch["position_ids"]
    )
    if not with_entropy:
        return logprobs_BT
    return logprobs_BT, token_entropy_from_logits(output.logits.detach(), temperature)
