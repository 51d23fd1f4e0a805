"""The policy and its tokenizer: where they come from, how they load, their dtype and attention."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from open_instruct.config.derived import AUTO_DTYPE, DTYPES
from open_instruct.config.fields import arg


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

    def problems(self) -> list[str]:
        checks = [
            (
                self.dtype in (None, AUTO_DTYPE, *DTYPES),
                f"--dtype {self.dtype} must be one of {', '.join(DTYPES)} (or {AUTO_DTYPE})",
            ),
            (self.model_dtype in DTYPES, f"--model_dtype {self.model_dtype} must be one of {', '.join(DTYPES)}"),
        ]
        return [message for ok, message in checks if not ok]
