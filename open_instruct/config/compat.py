"""open-instruct's flags that do nothing here, so that its launch scripts parse unchanged. The runtime never reads
this group; the entry point reports on it.

Each flag is one of three kinds, said first in its help (`fields.rendered_help`):

* `[Beaker only ...]`: Ai2 infrastructure (Beaker eval jobs, GCS, the Hub, Slack); accepted, no effect;
* `[no effect, as in open-instruct's grpo_fast: <reason>]`: OLMo-core-only knobs and the ones grpo_fast itself
  ignores; accepted, and a value other than the default is named in a warning at start-up;
* `[not supported yet: <reason>]`: a feature not built yet. The default parses (scripts pass `--push_to_hub
  false` all the time); any other value stops the run before anything starts, instead of being ignored.

Flags without a kind are open-instruct internals (`--world_size`), informational (`--num_nodes`) or its queue
dashboard's. The companions of a refused flag (`--bnb_4bit_quant_type` with `--load_in_4bit`) have no effect.
A flag leaves this group for the group of its concern when its feature lands.

A script relies on every flag it leaves out, so every default equals open-instruct's, except the few in
`DEFAULTS_UNLIKE_OPEN_INSTRUCT` (tests/unit/test_defaults.py holds the rest to the recorded values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from open_instruct.config.fields import BEAKER_ONLY, NO_EFFECT, PENDING, arg, moved_flags, refused_flags, shown

# Flag -> why its default differs from open-instruct's grpo_fast; the configuration page prints each reason.
DEFAULTS_UNLIKE_OPEN_INSTRUCT = {
    "model_name_or_path": "open-instruct requires it. Unset here, the run trains the embedded tiny model, which "
    "the package builds locally (data/embedded_default.py), so that a bare command runs without the network, as "
    "the demo, CI and the tests do.",
    "dataset_mixer_list": "open-instruct's default mix is a Hub dataset, which needs the network. Unset here, the run "
    "trains on the embedded arithmetic dataset (embedded/arith), generated locally like the embedded model.",
    "gather_whole_model": "open-instruct gathers the whole ZeRO-3 model on every rank at each weight sync, which "
    "needs a whole model of free memory per GPU on top of the partitions (about 60 GiB at 32B, 130 GiB at 70B in "
    "bf16: more than a GPU has). Here a sync gathers one parameter at a time unless --gather_whole_model asks "
    "for the faster whole gather.",
    "push_to_hub": "Nothing is uploaded unless asked. Uploading is not built here (it needs the Hub's network and "
    "write access), so with open-instruct's default every script that leaves the flag out would be refused; most "
    "of its launch scripts pass --push_to_hub false.",
}

# Quantization flags are no-ops in open-instruct's grpo_fast; training a full-precision model when a user
# asked for a quantized one would be a silent surprise, so they are refused instead.
NOT_IN_GRPO_FAST = "{} is not wired into open-instruct's grpo_fast either (its flags are ignored there)"
# Their companions do nothing without them, here as there: accepted, and a value other than the default is warned about.
QUANTIZATION_COMPANION = "{} of --load_in_4bit, which is refused (grpo_fast does not read it either)"


def pending(default: Any, reason: str, help: str = "", **kwargs) -> Any:
    """A flag whose feature is not built yet: its default parses, any other value is refused with `reason`."""
    return arg(default, help, kind=PENDING, reason=reason, **kwargs)


def no_effect(default: Any, reason: str, **kwargs) -> Any:
    """A flag open-instruct's grpo_fast accepts and ignores (OLMo-core-only knobs): the same here, said aloud."""
    return arg(default, "", kind=NO_EFFECT, reason=reason, **kwargs)


@dataclass(frozen=True)
class CompatConfig:
    _argument_group_name = "open-instruct compatibility (accepted; each flag says what it does here)"

    try_launch_beaker_eval_jobs_on_weka: bool = arg(False, "Launch oe-eval jobs per save.", kind=BEAKER_ONLY)
    oe_eval_tasks: str | None = arg(None, "Comma-separated oe-eval tasks for those jobs.", kind=BEAKER_ONLY)
    oe_eval_max_length: int = arg(4096, "Max length for the oe-eval jobs.", kind=BEAKER_ONLY)
    hf_metadata_dataset: str | None = arg(None, "HF dataset recording run metadata.", kind=BEAKER_ONLY)
    push_to_hub: bool = pending(
        False,
        "uploading needs the Hub's network and write access; --save_freq checkpoints stay in --output_dir",
        "Push checkpoints to the HF hub. Off by default here (open-instruct's default is on, so its scripts pass "
        "--push_to_hub false, which works).",
    )
    world_size: int | None = arg(None, "[internal in open-instruct: derived from --num_learners_per_node; ignored]")
    num_training_steps: int | None = arg(None, "[internal in open-instruct: derived from --total_episodes; ignored]")
    num_nodes: int = arg(1, "Informational (open-instruct prints it); nodes come from --num_learners_per_node.")
    gradient_accumulation_steps: int = no_effect(1, "gradients accumulate over every micro-batch of a mini-batch")
    max_seq_length: int = no_effect(4096, "lengths come from --max_prompt_token_length and --response_length")
    max_token_length: int = no_effect(
        512, "its RL prompt filter reads --max_prompt_token_length only; responses are cut at --response_length"
    )
    fsdp_shard_degree: int | None = no_effect(None, "OLMo-core FSDP; still must divide the learner count")
    fsdp_num_replicas: int | None = no_effect(None, "OLMo-core FSDP; still must divide the learner count")
    compile_model: bool = no_effect(True, "OLMo-core only")
    activation_memory_budget: float = no_effect(1.0, "OLMo-core only")
    activation_checkpointing_mode: Literal["budget", "selected_modules"] = no_effect("budget", "OLMo-core only")
    activation_checkpointing_modules: list[str] = no_effect(
        [
            "blocks.*.attention_norm",
            "blocks.*.attention",
            "blocks.*.attention_residual_stream",
            "blocks.*.feed_forward_norm",
            "blocks.*.feed_forward",
            "blocks.*.feed_forward_residual_stream",
        ],
        "OLMo-core only",
    )
    cp_degree: int | None = no_effect(None, "OLMo-core context parallelism; see --sequence_parallel_size")
    cp_strategy: Literal["llama3", "zig_zag", "ulysses"] = no_effect("llama3", "OLMo-core only")
    enable_queue_dashboard: bool = arg(True, "open-instruct's FastAPI queue dashboard; here metrics.jsonl and W&B.")
    queue_dashboard_port: int | None = arg(None, "Port of that dashboard (unused here).")
    hf_entity: str | None = arg(None, "Hub user/org for --push_to_hub.", kind=BEAKER_ONLY)
    hf_repo_id: str | None = arg(None, "Hub repo for --push_to_hub.", kind=BEAKER_ONLY)
    hf_repo_revision: str | None = arg(None, "Hub branch for --push_to_hub.", kind=BEAKER_ONLY)
    hf_repo_url: str | None = arg(None, "[internal] Set when pushing.", kind=BEAKER_ONLY)
    gs_bucket_path: str | None = arg(None, "GCS bucket for state checkpoints.", kind=BEAKER_ONLY)
    gs_checkpoint_state_dir: str | None = arg(None, "GCS copy of --checkpoint_state_dir.", kind=BEAKER_ONLY)
    try_auto_save_to_beaker: bool = arg(True, "Copy --output_dir into Beaker's result dataset.", kind=BEAKER_ONLY)
    oe_eval_beaker_image: str | None = arg(None, "Image of the oe-eval jobs.", kind=BEAKER_ONLY)
    oe_eval_gpu_multiplier: int | None = arg(None, "GPU multiplier of the oe-eval jobs.", kind=BEAKER_ONLY)
    eval_priority: Literal["low", "normal", "high", "urgent"] = arg("normal", "oe-eval job priority.", kind=BEAKER_ONLY)
    eval_workspace: str = arg("ai2/tulu-3-results", "Beaker workspace of the oe-eval jobs.", kind=BEAKER_ONLY)
    send_slack_alerts: bool = arg(False, "Slack messages on crashes (needs SLACK_WEBHOOK_URL).", kind=BEAKER_ONLY)
    tokenizer_files_hash: list[str] | None = arg(None, "[internal in open-instruct; ignored]")
    use_cache: bool | None = arg(None, "The KV cache is always off in training (accepted for compatibility).")
    load_in_8bit: bool = pending(False, NOT_IN_GRPO_FAST.format("quantized training"))
    load_in_4bit: bool = pending(False, NOT_IN_GRPO_FAST.format("quantized training"))
    bnb_4bit_quant_type: str | None = no_effect("nf4", QUANTIZATION_COMPANION.format("bitsandbytes 4-bit type"))
    use_bnb_nested_quant: bool = no_effect(False, QUANTIZATION_COMPANION.format("bitsandbytes nested quantization"))
    dataset_cache_mode: Literal["hf", "local"] = pending(
        "local", "the Hub dataset cache needs Hub write access (Ai2 infrastructure); the local cache works"
    )
    max_possible_score: float = arg(1.0, "[internal in open-instruct: recomputed; ignored]")

    def problems(self) -> list[str]:
        """None at parse time: the entry point refuses (`refused`) and warns (`ignored`) before anything starts."""
        return []

    def refused(self) -> list[str]:
        """A flag of a feature not built yet, given a value other than its default: one line each."""
        return refused_flags(self)

    def ignored(self) -> list[str]:
        """Warnings for no-effect flags given a value other than their default: one line each."""
        moved = moved_flags(self, NO_EFFECT)
        return [f"--{name} {shown(value)} has no effect: {reason}" for name, value, reason in moved]
