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


def load_tokenizer(model_config, options=None):
    """The tokenizer with the chat template chosen by --chat_template_name installed.

    `options` (the open-instruct tokenizer flags): --tokenizer_name (an alias of --tokenizer_name_or_path),
    --trust_remote_code (the tokenizer only, as in open-instruct)."""
    from transformers import AutoTokenizer

    alias = getattr(options, "tokenizer_name", None)
    name = model_config.tokenizer_name_or_path or alias or resolve_model_path(model_config.model_name_or_path)
    revision = model_config.tokenizer_revision or model_config.model_revision
    trust = bool(getattr(options, "trust_remote_code", False))
    tokenizer = AutoTokenizer.from_pretrained(name, revision=revision, trust_remote_code=trust)
    tokenizer.chat_template = resolve_chat_template(model_config.chat_template_name, tokenizer.chat_template)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
