"""open-instruct's own launch commands, made to run on a CPU by an explicit substitution table.

tests/data/open_instruct_launch_commands.json records the grpo_fast.py command line of every launch
script in open-instruct (flags and values as bash would pass them). Only what a CPU machine without a
network must change is changed here, by the tables below: the model (the embedded tiny one), the datasets
(local rows of the same kind: math, instruction following, code, environment games), the sizes (a batch
of 4 prompts x 2 samples, short answers, one engine, two steps), the paths (into a temporary directory)
and the endpoints (local stand-ins). Every other flag and value stays as the script wrote it.

The datasets become local files (which have no splits), or with `hub_cache`, stay the hub names the script
wrote, cached there as `datasets` caches a download (tests/helpers/hub_datasets.py) with only the splits the
script asks for: the hub code path, splits included.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers.hub_datasets import cache_hub_dataset, read_rows

REPO = Path(__file__).resolve().parents[2]
DATA = json.loads((REPO / "tests" / "data" / "open_instruct_launch_commands.json").read_text())
COMMANDS: dict[str, list[str]] = {c["script"]: c["argv"] for c in DATA["commands"]}
SAMPLES = REPO / "tests" / "fixtures" / "rlvr_samples"
# Scripts refused at parse time, and the words of the reason: DR Tulu's parser hands whole turns to the
# dr_agent package's own tool classes, behind its MCP backend (dr_agent_mcp).
REFUSED = {"scripts/train/debug/tools/dr_tulu_parser_debug.sh": "--tool_parser_type dr_tulu is not supported yet"}
SYSTEM_PROMPT = REPO / "tests" / "fixtures" / "launch_system_prompt.txt"

# Every dataset the recorded commands name -> the kind of local rows that stands in for it.
DATASET_KINDS = {
    "ai2-adapt-dev/rlvr_gsm8k_zs": "math",
    "ai2-adapt-dev/tulu_3_long_finetune_qwen_7b_reg": "general",
    "allenai/Dolci-RLZero-Math-7B": "math",
    "allenai/IF_multi_constraints_upto5": "ifeval",
    "allenai/IF_multi_constraints_upto5_filtered_dpo_0625_filter-keyword-filtered-topic-char-topic-filtered": "ifeval",
    "allenai/rlvr_general_mix-keyword-filtered": "general",
    "allenai/rlvr_general_mix-keyword-filtered-topic-chars-char-filt-topic-filtered": "general",
    "hamishivi/DAPO-Math-17k-Processed_filtered": "math",
    "hamishivi/IF_multi_constraints_upto5_filtered_dpo_0625_filter": "ifeval",
    "hamishivi/MathSub-30K_filtered": "math",
    "hamishivi/code_rlvr_mixture_dpo": "code",
    "hamishivi/math_rlvr_mixture_dpo": "math",
    "hamishivi/omega-combined": "math",
    "hamishivi/omega-combined-no-boxed_filtered": "math",
    "hamishivi/polaris_53k": "math",
    "hamishivi/rlenv-counter-nothink": "counter",
    "hamishivi/rlenv-guess-number": "guess_number",
    "hamishivi/rlenv-guess-number-nothink": "guess_number",
    "hamishivi/rlenv-wordle-nothink": "wordle",
    "hamishivi/rlvr_acecoder_filtered_filtered": "code",
    "hamishivi/rlvr_general_mix": "general",
    "hamishivi/rlvr_orz_math_57k_collected_filtered": "math",
    "hamishivi/tulu_3_rewritten_100k": "general",
    "hamishivi/tulu_3_rewritten_400k_string_f1_only_v2_nocode_all_filtered_qwen2_5_openthoughts2": "general",
    "hamishivi/tulu_3_rewritten_tools_test": "general",
    "hamishivi/virtuoussy_multi_subject_rlvr": "general",
    "hamishivi/wots_the_weather": "general",
    "rl-research/dr-tulu-rl-data": "general",
    "saurabh5/open-code-reasoning-rlvr-stdio": "code",
    "saurabh5/rlvr_acecoder_filtered": "code",
}
SAMPLE_FILES = {
    "math": "orz_math.jsonl",
    "ifeval": "if_multi_upto5.jsonl",
    "code": "acecoder.jsonl",
    "general": "tulu3_rewritten_100k.jsonl",
}

# Sizes of a two-step CPU run. The learners stay on one node; `learners` of `substitute` picks how many.
STEPS = 2
PROMPTS, SAMPLES_PER_PROMPT = 4, 2
SIZES = {  # set whether the script gives them or not
    "num_unique_prompts_rollout": [str(PROMPTS)],
    "num_samples_per_prompt_rollout": [str(SAMPLES_PER_PROMPT)],
    "total_episodes": [str(STEPS * PROMPTS * SAMPLES_PER_PROMPT)],
    "response_length": ["256"],  # room for a forced tool call (byte-level tokens) and its observation
    "max_prompt_token_length": ["1600"],
    "pack_length": ["1856"],
}
SIZES_IF_GIVEN = {
    "per_turn_max_tokens": ["96"],
    "vllm_num_engines": ["1"],
    "vllm_tensor_parallel_size": ["1"],
    "sequence_parallel_size": ["1"],
    "local_eval_every": [str(STEPS)],
    "save_freq": [str(STEPS)],
    "checkpoint_state_freq": ["1"],
    "max_steps": ["2"],
    "deepspeed_zpg": ["1"],
}
# Open-instruct's evaluation jobs and trackers run elsewhere; their flags stay, inert as they are here.
PATH_FLAGS = ("output_dir", "checkpoint_state_dir", "rollouts_save_path")


def flag_values(argv: list[str]) -> dict[str, list[str]]:
    """flag -> the words after it (in order); `--flag=value` counts as `--flag value`."""
    found: dict[str, list[str]] = {}
    current = None
    for token in argv:
        if token.startswith("--"):
            name, _, value = token[2:].partition("=")
            current = name
            found[current] = [value] if value else []
        elif current is not None:
            found[current].append(token)
    return found


def write_rows(kind: str, path: Path) -> Path:
    """Local rows of one kind: the shipped samples, or a few rows of an environment game."""
    if kind in SAMPLE_FILES:
        path.write_text((SAMPLES / SAMPLE_FILES[kind]).read_text())
        return path
    games = {
        "counter": lambda i: {"env_name": "counter", "target": str(2 + i % 3)},
        "guess_number": lambda i: {"env_name": "guess_number", "number": str(3 + 7 * i)},
        "wordle": lambda i: {"env_name": "wordle", "word": ("crane", "slate", "pious", "rover")[i % 4]},
    }
    with path.open("w") as f:
        for i in range(4):
            row = {
                "messages": [{"role": "user", "content": f"Play the {kind} game, round {i}."}],
                "ground_truth": "",
                "dataset": "passthrough",
                "env_config": games[kind](i),
            }
            f.write(json.dumps(row) + "\n")
    return path


def _datasets(values: list[str], tmp: Path) -> list[str]:
    """One local file per kind of row the mix names (a mix of three math sets becomes one math file)."""
    kinds = dict.fromkeys(DATASET_KINDS[name] for name in values[::2])
    return [word for kind in kinds for word in (str(write_rows(kind, tmp / f"{kind}.jsonl")), "1.0")]


# The config key through which each kind of tool is pointed at a service, and the stand-in it gets.
ENDPOINT_KEYS = {
    "python": ("api_endpoint", lambda e: e["code"] + "/execute"),
    "serper_search": ("base_url", lambda e: e["http"]),
    "s2_search": ("base_url", lambda e: e["http"]),
    "jina_browse": ("base_url", lambda e: e["http"]),
    "crawl4ai_browse": ("api_url", lambda e: e["http"]),
    "generic_mcp": ("server_url", lambda e: e["mcp"] + "/mcp"),
}


def _tool_configs(tools: list[str], configs: list[str], endpoints: dict[str, str]) -> list[str]:
    """Each tool's config with its service URL pointing at the local stand-in (configs the script left
    out are `{}`, as open-instruct reads them); dr_agent_mcp's host and port likewise."""
    out = []
    for kind, raw in zip(tools, configs or ["{}"] * len(tools)):
        config = json.loads(raw)
        if kind in ENDPOINT_KEYS:
            key, url = ENDPOINT_KEYS[kind]
            config[key] = url(endpoints)
        if kind == "dr_agent_mcp":
            host, port = endpoints["mcp"].removeprefix("http://").rsplit(":", 1)
            config.update(host=host, port=int(port))
        out.append(json.dumps(config))
    return out


def _hub_datasets(values: dict[str, list[str]], tmp: Path, cache: Path) -> None:
    """Cache every dataset the mixes name under its own name, with local rows of its kind in exactly the splits
    the script asks of it (training: --dataset_mixer_list_splits, default train; eval: its own flag, default
    test)."""
    wanted: dict[str, set[str]] = {}
    for flag, default in (("dataset_mixer_list", "train"), ("dataset_mixer_eval_list", "test")):
        names = values.get(flag, [])[::2]
        splits = values.get(f"{flag}_splits") or [default]
        for name, split in zip(names, splits * len(names) if len(splits) == 1 else splits):
            wanted.setdefault(name, set()).add(split)
    for name, splits in wanted.items():
        rows = read_rows(write_rows(DATASET_KINDS[name], tmp / f"{DATASET_KINDS[name]}.jsonl"))
        cache_hub_dataset(cache, name, dict.fromkeys(sorted(splits), rows))


def substitute(
    script: str, tmp: Path, endpoints: dict[str, str], learners: int = 1, hub_cache: Path | None = None
) -> list[str]:
    """The recorded command of `script` with the model, data, sizes, paths and endpoints swapped for local ones.

    `endpoints`: "http" (the hosted tools' stand-in), "code" (the code service's base URL), "mcp" (an MCP
    server's base URL, for the MCP scripts). `hub_cache`: keep the hub names, cached there (read it with
    hub_datasets.offline_hub or hub_env)."""
    values = flag_values(COMMANDS[script])
    # The embedded tiny model (its byte-level tokenizer has no BOS, which --add_bos asks of OLMo's)
    for flag in ("model_name_or_path", "tokenizer_name_or_path", "tokenizer_name", "add_bos"):
        values.pop(flag, None)
    if hub_cache is not None:
        _hub_datasets(values, tmp, hub_cache)
    else:  # local files have no splits beyond "train"
        values.pop("dataset_mixer_list_splits", None)
        for flag in ("dataset_mixer_list", "dataset_mixer_eval_list"):
            if flag in values:
                values[flag] = _datasets(values[flag], tmp)
        if "dataset_mixer_eval_list" in values:
            values["dataset_mixer_eval_list_splits"] = ["train"]
    values.update(SIZES)
    parallel = values.get("sequence_parallel_size", ["1"])
    values.update({flag: sizes for flag, sizes in SIZES_IF_GIVEN.items() if flag in values})
    if learners > 1 and learners % int(parallel[0]) == 0:  # a multi-learner run keeps the script's Ulysses degree
        values["sequence_parallel_size"] = parallel
    values["num_learners_per_node"] = [str(learners)]
    for flag in PATH_FLAGS:
        values[flag] = [str(tmp / flag)]
    values["dataset_local_cache_dir"] = [str(tmp / "cache")]
    if "system_prompt_override_file" in values:
        values["system_prompt_override_file"] = [str(SYSTEM_PROMPT)]
    values["code_api_url"] = [endpoints["code"] + "/test_program"]
    if values.get("tools"):
        values["tool_configs"] = _tool_configs(values["tools"], values.get("tool_configs", []), endpoints)
    values["vllm_kv_cache_gib"] = ["0.25"]
    return as_argv(values)


def original(script: str) -> list[str]:
    """The recorded command as written, with only the files it reads swapped for ours (they are checked
    when the flags are parsed)."""
    values = flag_values(COMMANDS[script])
    if "system_prompt_override_file" in values:
        values["system_prompt_override_file"] = [str(SYSTEM_PROMPT)]
    return as_argv(values)


def as_argv(values: dict[str, list[str]]) -> list[str]:
    """The inverse of `flag_values`."""
    return [word for flag, words in values.items() for word in (f"--{flag}", *words)]
