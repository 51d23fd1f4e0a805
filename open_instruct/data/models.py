"""Model and tokenizer loading: hub name, local path, or the embedded default (built on demand).

One loading path for all three, so the embedded default exercises exactly the code a hub
model goes through.
"""

from __future__ import annotations

import logging
from pathlib import Path

from open_instruct.data import hub
from open_instruct.data.chat_templates import CHAT_TEMPLATE_NAMES, resolve_chat_template
from open_instruct.data.embedded_default import EMBEDDED_MODEL_NAME, ensure_embedded_model
from open_instruct.errors import UserError


class ModelNotFound(UserError):
    """A model or tokenizer name that is neither a usable local path nor reachable on the Hugging Face Hub."""


def resolve_model_path(model_name_or_path: str | None) -> str:
    """A path or hub name that `from_pretrained` and vLLM accept."""
    if model_name_or_path in (None, EMBEDDED_MODEL_NAME):
        return str(ensure_embedded_model())
    return model_name_or_path


def check_model_source(name: str, flag: str, revision: str | None = None, needs_config: bool = True) -> None:
    """Fail in seconds, in one line, when `name` cannot load: a missing local path, a folder that is not a
    model, a hub name that is neither cached nor reachable (transformers would retry for most of a minute
    and print pages of traceback). One metadata request with a timeout, no retries."""
    if name in (None, EMBEDDED_MODEL_NAME):
        return
    path = Path(name).expanduser()
    if name.startswith(("/", "./", "../", "~")) or path.exists():
        if not path.exists():
            raise ModelNotFound(f"{flag} {name}: no such file or directory")
        if needs_config and not (path / "config.json").is_file():
            raise ModelNotFound(f"{flag} {name}: not a model folder (it has no config.json)")
        return
    from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.constants import HF_HUB_CACHE

    if isinstance(try_to_load_from_cache(name, "config.json", revision=revision), str):
        return
    not_cached = f"not in the local Hugging Face cache ({HF_HUB_CACHE})"
    if hub.offline():
        raise ModelNotFound(
            f"{flag} {name}: {not_cached} and HF_HUB_OFFLINE is set: download it first or pass a local path"
        )
    try:
        get_hf_file_metadata(hf_hub_url(name, "config.json", revision=revision), timeout=hub.HUB_TIMEOUT_S)
    except Exception as error:
        remedy = f"it is {not_cached}: connect to the network, or pass a local path"
        raise ModelNotFound(hub.failure_line(error, f"{flag} {name}", remedy, revision)) from None


def check_model_sources(model_config) -> None:
    """The model and the tokenizer (see `load_tokenizer` for where its name comes from)."""
    check_model_source(model_config.model_name_or_path, "--model_name_or_path", model_config.model_revision)
    for flag, name in (
        ("--tokenizer_name_or_path", model_config.tokenizer_name_or_path),
        ("--tokenizer_name", model_config.tokenizer_name),
    ):
        if name:
            revision = model_config.tokenizer_revision or model_config.model_revision
            check_model_source(name, flag, revision, needs_config=False)
            break


# open-instruct's --get_tokenizer_fn choices. All load the same way; they differ in the pad token.
TOKENIZER_FNS = (
    "get_tokenizer_simple_v1",  # as loaded
    "get_tokenizer_tulu_v1",  # adds <pad> when there is no pad token
    "get_tokenizer_tulu_v2_1",  # adds <pad> when there is none or it equals EOS
    "get_tokenizer_tulu_v2_2",  # the same (open-instruct's v2_2 adds OLMo-only asserts)
)


# The distribution each flash kernel comes in, as transformers checks it (FA2 and FA4 share the `flash_attn`
# module, so the module alone cannot tell them apart; FA3 is `flash_attn_interface` from flash-attn-3).
FLASH_ATTENTION_PACKAGES = {"flash_2": "flash-attn", "flash_3": "flash-attn-3", "flash_4": "flash-attn-4"}


def model_option_problems(model_config) -> list[str]:
    """--get_tokenizer_fn names one of ours, and a flash --attn_implementation has its package installed."""
    from importlib import metadata

    problems = []
    if model_config.get_tokenizer_fn not in TOKENIZER_FNS:
        problems.append(f"--get_tokenizer_fn {model_config.get_tokenizer_fn} is not one of {', '.join(TOKENIZER_FNS)}")
    attention = model_config.attn_implementation or "torch"
    if attention in FLASH_ATTENTION_PACKAGES:
        try:
            metadata.distribution(FLASH_ATTENTION_PACKAGES[attention])
        except metadata.PackageNotFoundError:
            problems.append(
                f"--attn_implementation {attention} needs the {FLASH_ATTENTION_PACKAGES[attention]} package "
                "(a GPU install); use torch (SDPA)"
            )
    return problems


def load_tokenizer(model_config):
    """The tokenizer with the chat template chosen by --chat_template_name installed.

    open-instruct's tokenizer flags: --tokenizer_name (an alias of --tokenizer_name_or_path), --trust_remote_code
    (the tokenizer only, as in open-instruct), --use_fast / --use_slow_tokenizer and --get_tokenizer_fn (its
    pad-token rule)."""
    from transformers import AutoTokenizer

    alias = model_config.tokenizer_name
    name = model_config.tokenizer_name_or_path or alias or resolve_model_path(model_config.model_name_or_path)
    revision = model_config.tokenizer_revision or model_config.model_revision
    use_fast = model_config.use_fast and not model_config.use_slow_tokenizer
    tokenizer = AutoTokenizer.from_pretrained(
        name, revision=revision, trust_remote_code=model_config.trust_remote_code, use_fast=use_fast
    )
    fn = model_config.get_tokenizer_fn
    name = model_config.chat_template_name
    own = tokenizer.chat_template
    tokenizer.chat_template = resolve_chat_template(name, own, fallback_to_tokenizer=fn == TOKENIZER_FNS[-1])
    if name is not None and name not in CHAT_TEMPLATE_NAMES:
        logging.getLogger(__name__).warning(
            "--chat_template_name %s is not a template name: the tokenizer's own template is used, as open-instruct's "
            "%s does (check the spelling; --preflight shows the rendered prompt)",
            name,
            fn,
        )
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
