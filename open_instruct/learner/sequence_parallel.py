"""--sequence_parallel_size: DeepSpeed's Ulysses sequence parallelism for the learner's rows.

The `size` consecutive ranks of one sequence-parallel group train the same rows; each runs the model on
its contiguous slice of every row, and attention all-to-alls heads for sequence so that every rank attends
over the whole row (`UlyssesSPAttentionHF`, which replaces the attention function in transformers).

Each rank scores a window of targets: the tokens its logits predict. Rank r's slice of inputs is
[lo, hi) and its logits predict the tokens at [lo + 1, hi + 1), so every target-aligned field (masks,
advantages, behaviour logprobs) is cut to that window and the windows of a group cover the row once. The
policy loss is a sum over tokens divided by the step's global token count, so the ranks' partial losses
add up to the unsharded one (DeepSpeed averages gradients over the sequence-data-parallel group).

Ulysses drops attention masks: attention is causal over the whole row. Rows therefore carry one document
each (`batching` packs them so under --sequence_parallel_size > 1), padded at the end, where causality
keeps the padding out of every real token's attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from open_instruct.packing import ROW_TENSOR_FIELDS

# Forward inputs of a shard; the target-aligned fields keep their ROW_TENSOR_FIELDS names.
FORWARD_INPUT_IDS = "forward_input_ids"
FORWARD_POSITION_IDS = "forward_position_ids"


def register(model, attn_implementation: str, size: int):
    """Route `attn_implementation` through Ulysses for every model in this process; returns DeepSpeed's mpu
    (its sequence-parallel groups: ranks [k * size, (k + 1) * size)) for `deepspeed.initialize`."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    return UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model,
        core_attn_implementation=attn_implementation,
        sequence_parallel_size=size,
        micro_batch_size=1,
        seq_length_is_variable=True,
    )


def shard(row_batch: dict[str, torch.Tensor], rank: int, size: int) -> dict[str, torch.Tensor]:
    """This rank's share of a collated micro-batch: its slice of the inputs and its window of targets.

    Rows are padded at the end to a multiple of `size` (Ulysses needs equal slices). A window's last
    column past the row end has no target: input 0, position 0 and every mask off.
    """
    length = row_batch["input_ids"].shape[1]
    local = -(-length // size)
    padded = {name: F.pad(tensor, (0, local * size + 1 - length)) for name, tensor in row_batch.items()}
    lo, hi = rank * local, (rank + 1) * local
    out = {name: padded[name][:, lo + 1 : hi + 1] for name in ROW_TENSOR_FIELDS if name in padded}
    out |= {name: value for name, value in row_batch.items() if name not in ROW_TENSOR_FIELDS}  # none per token
    out[FORWARD_INPUT_IDS] = padded["input_ids"][:, lo:hi]
    # Positions keep counting through the padding: Ulysses gathers them and needs them monotonic.
    positions = padded["position_ids"].clone()
    positions[:, length:] = torch.arange(length, local * size + 1, device=positions.device)
    out[FORWARD_POSITION_IDS] = positions[:, lo:hi]
    return out


def is_shard(row_batch: dict[str, torch.Tensor]) -> bool:
    return FORWARD_INPUT_IDS in row_batch


def window_logprobs(model, shard_batch: dict[str, torch.Tensor], temperature: float, with_entropy: bool = False):
    """Log-probabilities (and entropies) of a shard's target window: the logits at local position i
    predict `shard_batch["input_ids"][:, i]`; targets that start a document (position 0) or lie past the
    row are 0, as in `logprobs.logprobs_from_logits`."""
    from open_instruct.learner.logprobs import DEFAULT_LOGPROB_CHUNK_TOKENS, TokenLogprobs, scaled_fp32

    output = model(
        input_ids=shard_batch[FORWARD_INPUT_IDS],
        position_ids=shard_batch[FORWARD_POSITION_IDS],
        attention_mask=None,
        use_cache=False,
    )
    logits_BTV = output.logits
    batch, time, vocab = logits_BTV.shape
    targets_BT = shard_batch["input_ids"]
    logprobs_N = TokenLogprobs.apply(
        logits_BTV.reshape(batch * time, vocab),
        targets_BT.reshape(-1),
        float(temperature),
        DEFAULT_LOGPROB_CHUNK_TOKENS,
    )
    no_target_BT = shard_batch["position_ids"] == 0
    logprobs_BT = logprobs_N.view(batch, time).masked_fill(no_target_BT, 0.0)
    if not with_entropy:
        return logprobs_BT
    with torch.no_grad():
        logp_NV = torch.log_softmax(scaled_fp32(logits_BTV.detach().reshape(batch * time, vocab), temperature), -1)
        entropy_BT = -(logp_NV.exp() * logp_NV).sum(-1).view(batch, time)
    return logprobs_BT, entropy_BT.masked_fill(no_target_BT, 0.0)
