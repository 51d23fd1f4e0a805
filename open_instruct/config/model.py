"""The policy and its tokenizer: where they come from, how they load, their dtype and attention, and whether it
trains as a LoRA adapter on a frozen base (`--use_peft`, open-instruct's flags and defaults)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from open_instruct.config.derived import AUTO_DTYPE, DTYPES
from open_instruct.config.fields import PENDING, arg, refused_flags

# vLLM's LoRA buffers come in these ranks (vllm/config/lora.py MaxLoRARanks); an adapter is served in the
# smallest that is not below its rank.
SERVED_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
MODULES_TO_SAVE_REFUSED = (
    "vLLM serves whole modules next to an adapter only for a classification head (vllm/lora/model_manager.py "
    "_validate_modules_to_save), so the engines could not generate with what the learner trains; adapt them with "
    "--lora_target_modules instead"
)


@dataclass(frozen=True)
class ModelConfig:
    _argument_group_name = "model and tokenizer"

    model_name_or_path: str | None = arg(None, "HF hub name or local path; unset: the embedded tiny model.")
    model_revision: str | None = arg(None, "Hub revision of the model.")
    tokenizer_name_or_path: str | None = arg(None, "Tokenizer; defaults to the model's.")
    tokenizer_revision: str | None = arg(None, "Hub revision of the tokenizer.")
    chat_template_name: str | None = arg(
        None, "Any open-instruct chat template name, or 'tokenizer'; unset: the tokenizer's own (as open-instruct)."
    )
    add_bos: bool = arg(False, "Prepend the tokenizer's BOS token to every prompt (OLMo-style models).")
    model_dtype: str = arg("bfloat16", "Dtype of the policy, reference and engines on GPU (see --dtype).")
    tokenizer_name: str | None = arg(None, "Alias of --tokenizer_name_or_path (which wins when both are given).")
    trust_remote_code: bool = arg(False, "Let the tokenizer run its repository's code (tokenizer only, as there).")
    use_fast: bool = arg(True, "Load the fast (Rust) tokenizer; False asks for the Python one where it exists.")
    use_slow_tokenizer: bool = arg(False, "The same as --use_fast False (open-instruct ignores it).")
    get_tokenizer_fn: str = arg(
        "get_tokenizer_tulu_v2_2",
        "Pad-token rule: simple_v1 keeps the tokenizer as loaded; tulu_v1 adds <pad> when there is none; "
        "tulu_v2_1 and tulu_v2_2 also when the pad token is EOS.",
    )
    dtype: str | None = arg(
        None,
        "Dtype of the policy, reference and engines (float32, bfloat16, float16); default (or auto): "
        "--model_dtype on GPU, float32 on CPU.",
    )
    attn_implementation: Literal["torch", "flash_2", "flash_3", "flash_4", "te"] | None = arg(
        None, "Learner attention: torch/te = SDPA, flash_N = FlashAttention N (needs flash-attn, -3, -4); None: SDPA."
    )

    use_peft: bool = arg(
        False,
        "Train a LoRA adapter (peft) on the frozen base model: engines serve base + adapter, a weight sync moves only "
        "the adapter, and the --beta reference is the base (the adapter switched off).",
    )
    lora_r: int | None = arg(16, "LoRA rank (with --use_peft; at most 512, vLLM's largest).", bounds=">= 1")
    lora_alpha: int | None = arg(32, "LoRA alpha: the update is scaled by alpha / r (with --use_peft).", bounds="> 0")
    lora_dropout: float | None = arg(
        0.05, "Dropout on the adapter's input while training (with --use_peft).", bounds="[0, 1)"
    )
    lora_target_modules: list[str] | None = arg(
        None,
        "Modules that get an adapter, by name (q_proj v_proj ...; with --use_peft). Unset: every linear layer but the "
        "output head (peft's all-linear; open-instruct's finetune and DPO adapt all seven projections).",
    )
    lora_modules_to_save: list[str] | None = arg(
        None,
        "Modules trained whole next to the adapter (with --use_peft).",
        kind=PENDING,
        reason=MODULES_TO_SAVE_REFUSED,
    )
    lora_task_type: str = arg("CAUSAL_LM", "peft's task type (with --use_peft): CAUSAL_LM, the policy's.")
    lora_adapter_dir: str | None = arg(
        None,
        "Where each engine keeps the adapter it serves (with --use_peft; a folder per engine, removed when it stops, "
        "and folders left by killed runs are removed when an engine starts). Default: the system's temp folder.",
    )
    save_merged_lora_model: bool = arg(
        False,
        "With --use_peft, each saved model (--save_freq, the final one) is also written merged (base + adapter) as "
        "a plain HF model under <step dir>/merged, which any HF or vLLM loader reads without peft.",
    )

    def problems(self) -> list[str]:
        return self._dtype_problems() + (self._lora_problems() if self.use_peft else [])

    def _lora_problems(self) -> list[str]:
        largest = SERVED_LORA_RANKS[-1]
        checks = [
            (self.lora_r is not None, "--use_peft needs --lora_r"),
            (self.lora_alpha is not None, "--use_peft needs --lora_alpha"),
            (
                self.lora_r is None or self.lora_r <= largest,
                f"--lora_r {self.lora_r} is above {largest}, the largest rank vLLM serves",
            ),
            (
                self.lora_task_type == "CAUSAL_LM",
                f"--lora_task_type {self.lora_task_type}: the policy is a causal LM (CAUSAL_LM); other task types "
                "(SEQ_CLS for reward models) do not generate",
            ),
        ]
        # --lora_modules_to_save by its mark: refused here at parse time with --use_peft, by
        # `core.unsupported_features` without it.
        return [message for ok, message in checks if not ok] + refused_flags(self)

    def _dtype_problems(self) -> list[str]:
        checks = [
            (
                self.dtype in (None, AUTO_DTYPE, *DTYPES),
                f"--dtype {self.dtype} must be one of {', '.join(DTYPES)} (or {AUTO_DTYPE})",
            ),
            (self.model_dtype in DTYPES, f"--model_dtype {self.model_dtype} must be one of {', '.join(DTYPES)}"),
        ]
        return [message for ok, message in checks if not ok]
