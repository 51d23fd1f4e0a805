"""Model and tokenizer loading: hub name, local path, or the embedded default (built on demand).

One loading path for all three, so the embedded default exercises exactly the code a hub
model goes through.
"""

from __future__ import annotations

from open_instruct.chat_templates import resolve_chat_template
from open_instruct.embedded_default import EMBEDDED_MODEL_NAME, ensure_embedded_model


def resolve_model_path(model_name_or_path: str | None) -> str:
    """A path or hub name that `from_pretrained` and vLLM accept."""
    if model_name_or_path in (None, EMBEDDED_MODEL_NAME):
        return str(ensure_embedded_model())
    return model_name_or_path


# open-instruct's --get_tokenizer_fn choices. All load the same way; they differ in the pad token.
TOKENIZER_FNS = (
    "get_tokenizer_simple_v1",  # as loaded
    "get_tokenizer_tulu_v1",  # adds <pad> when there is no pad token
    "get_tokenizer_tulu_v2_1",  # adds <pad> when there is none or it equals EOS
    "get_tokenizer_tulu_v2_2",  # the same (open-instruct's v2_2 adds OLMo-only asserts)
)


def load_tokenizer(model_config, options=None):
    """The tokenizer with the chat template chosen by --chat_template_name installed.

    `options` (the open-instruct tokenizer flags): --tokenizer_name (an alias of --tokenizer_name_or_path),
    --trust_remote_code (the tokenizer only, as in open-instruct), --use_fast / --use_slow_tokenizer and
    --get_tokenizer_fn (its pad-token rule)."""
    from transformers import AutoTokenizer

    alias = getattr(options, "tokenizer_name", None)
    name = model_config.tokenizer_name_or_path or alias or resolve_model_path(model_config.model_name_or_path)
    revision = model_config.tokenizer_revision or model_config.model_revision
    trust = bool(getattr(options, "trust_remote_code", False))
    use_fast = getattr(options, "use_fast", True) and not getattr(options, "use_slow_tokenizer", False)
    tokenizer = AutoTokenizer.from_pretrained(name, revision=revision, trust_remote_code=trust, use_fast=use_fast)
    tokenizer.chat_template = resolve_chat_template(model_config.chat_template_name, tokenizer.chat_template)
    fn = getattr(options, "get_tokenizer_fn", "get_tokenizer_tulu_v2_2")
    pad_is_eos = tokenizer.pad_token_id is not None and tokenizer.pad_token_id == tokenizer.eos_token_id
    if fn != "get_tokenizer_simple_v1" and (tokenizer.pad_token_id is None or (pad_is_eos and fn != TOKENIZER_FNS[1])):
        tokenizer.add_special_tokens({"pad_token": "<pad>"})
    if tokenizer.pad_token_id is None:  # simple_v1 without a pad token: packs still need a filler id
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def packing_pad_id(tokenizer, model_path: str) -> int:
    """The id that fills packed rows: the pad token, unless it was added past the model's embeddings (a
    `<pad>` from --get_tokenizer_fn); then EOS. Filler positions are masked, so any in-vocabulary id works."""
    from transformers import AutoConfig

    vocab_size = getattr(AutoConfig.from_pretrained(model_path), "vocab_size", None)
    if vocab_size is not None and tokenizer.pad_token_id >= vocab_size:
        return tokenizer.eos_token_id
    return tokenizer.pad_token_id
