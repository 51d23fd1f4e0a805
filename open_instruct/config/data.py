"""The prompts: which datasets are mixed, how rows are read, templated, filtered and cached."""

from __future__ import annotations

import os
from dataclasses import dataclass

from open_instruct.config.fields import arg, mixer_problems

# What an unset --dataset_mixer_list trains on (built by data.embedded_default), and where its answers end.
EMBEDDED_DATASET_NAME = "embedded/arith"
EMBEDDED_STOP_STRING = "</answer>"
# open-instruct's registry names of what our loader does (they run its rlvr_tokenize_v3 and
# rlvr_max_length_filter_v2); its SFT and preference transforms do not make RL prompts.
RLVR_TRANSFORMS = ("rlvr_tokenize_v1", "rlvr_max_length_filter_v1")
# Filters open-instruct's grpo_fast also runs in the second place: preference_filter_v1 given only the prompt
# limit drops the same prompts as rlvr_max_length_filter_v1 (its other limit is never passed there).
RLVR_FILTERS = ("rlvr_max_length_filter_v1", "preference_filter_v1")


@dataclass(frozen=True)
class DataConfig:
    _argument_group_name = "data"

    system_prompt_override: str | None = arg(None, "Replace (or add) the system message of every prompt.")
    dataset_mixer_list: list[str] = arg(
        [],
        "Training mix as NAME WEIGHT pairs; NAME is a hub dataset, a JSON/JSONL/parquet file or a "
        "directory; WEIGHT <= 1 is a fraction of the dataset, > 1 an absolute row count.",
    )
    dataset_mixer_list_splits: list[str] = arg(["train"], "Split per training dataset (one value = all).")
    dataset_mixer_eval_list: list[str] = arg(
        [],
        "Evaluation mix, same NAME WEIGHT format. Not given: nothing is evaluated and no eval split is read (with "
        "no dataset flag at all, the embedded dataset's own eval split is).",
    )
    dataset_mixer_eval_list_splits: list[str] = arg(["test"], "Split per eval dataset (one value = all).")
    sft_messages_key: str = arg("messages", "Column holding the chat messages of the prompt.")
    ground_truths_key: str = arg("ground_truth", "Column holding the label handed to the verifier.")
    max_prompt_token_length: int = arg(
        256, "Prompts longer than this are filtered (counted and reported).", bounds="> 0"
    )
    dataset_skip_bad_rows: bool = arg(False, "Skip malformed rows (counted and reported) instead of failing.")
    dataset_local_cache_dir: str = arg("local_dataset_cache", "Where tokenized datasets are cached.")
    data_loader_seed: int | None = arg(None, "Seed of the prompt order (shuffling per epoch); default: --seed.")
    system_prompt_override_file: str | None = arg(
        None, "A text file (stripped) whose text replaces or adds the system message of every prompt."
    )
    dataset_skip_cache: bool = arg(False, "Always re-tokenize and never write the dataset cache.")
    dataset_transform_fn: list[str] = arg(
        list(RLVR_TRANSFORMS),
        "Row transforms, in order: chat template + tokenize (with --system_prompt_override and tool schemas), "
        "then drop prompts over --max_prompt_token_length. grpo_fast accepts exactly this pair (or "
        "preference_filter_v1 second, which drops the same prompts there).",
    )
    dataset_config_hash: str | None = arg(
        None, "Reuse the training cache entries stored under this key (printed in the data report) as they are."
    )
    dataset_config_eval_hash: str | None = arg(None, "The same for the eval mix.")
    cache_dataset_only: bool = arg(
        False, "Build (and cache) the tokenized datasets, report them, and exit without training."
    )

    def problems(self) -> list[str]:
        problems = mixer_problems("--dataset_mixer_list", self.dataset_mixer_list)
        problems += mixer_problems("--dataset_mixer_eval_list", self.dataset_mixer_eval_list)
        transforms = tuple(self.dataset_transform_fn)
        forced = [flag for flag in ("dataset_config_hash", "dataset_config_eval_hash") if getattr(self, flag)]
        checks = [
            (
                len(transforms) == 2 and transforms[0] == RLVR_TRANSFORMS[0] and transforms[1] in RLVR_FILTERS,
                f"--dataset_transform_fn {' '.join(transforms)}: grpo_fast runs exactly {' '.join(RLVR_TRANSFORMS)} "
                "(tokenize, then the prompt-length filter); SFT and preference transforms do not make RL prompts",
            ),
            (
                not (forced and (self.dataset_skip_cache or not self.dataset_local_cache_dir)),
                f"--{forced[0] if forced else ''} reuses a cache entry, but the cache is off (--dataset_skip_cache "
                "or an empty --dataset_local_cache_dir)",
            ),
        ]
        path = self.system_prompt_override_file
        if path is not None:
            checks += [
                (os.path.isfile(path), f"--system_prompt_override_file {path}: no such file"),
                (
                    self.system_prompt_override is None,
                    "--system_prompt_override and --system_prompt_override_file both set the system prompt; give one",
                ),
            ]
        return problems + [message for ok, message in checks if not ok]
