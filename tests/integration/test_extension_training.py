"""A user's own verifier, tool and environment (tests/extension_example, outside the package) train end to
end on the real stack with `--extension_modules`: the driver checks their names before anything starts, the
engine loads the module before it scores and runs rollouts, and the rows, the tool and the environment are
the user's. The run is its own process, so the registrations never reach other tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "tests" / "extension_example"
STEPS = 2

RUN = """
import sys
from helpers.forced_turns import ForcedTurnsActor
from open_instruct.config.core import parse_config
from open_instruct.grpo_fast import run

cfg = parse_config(sys.argv[1:])
# The tiny model never calls a tool by itself: turn 1 calls the user's tool, turn 2 the user's environment.
summary = run(cfg, engine_class=ForcedTurnsActor, engine_args=(("<reverse_text>ab</reverse_text>", "<tick></tick>"),))
print("STATUS", summary["status"])
"""


def write_rows(path: Path, count: int) -> None:
    with open(path, "w") as f:
        for i in range(count):
            a, b = i % 7, (3 * i) % 5
            row = {
                "messages": [{"role": "user", "content": f"What is {a} + {b}? End with the number."}],
                "ground_truth": str(a + b),
                "dataset": "last_digit",  # the user's verifier
                "env_config": {"env_name": "countdown", "start": 2},  # the user's environment, its reset kwargs
            }
            f.write(json.dumps(row) + "\n")


def test_a_users_verifier_tool_and_environment_train_without_editing_the_package(tmp_path):
    rows, out = tmp_path / "rows.jsonl", tmp_path / "out"
    write_rows(rows, 16)
    flags = [
        "--extension_modules",
        "oi_example_extension",
        "--tools",
        "reverse_text",
        "countdown",
        "--tool_configs",
        '{"prefix": "reversed: "}',
        "{}",
        "--tool_parser_type",
        "legacy",
        "--max_steps",
        "3",
        "--dataset_mixer_list",
        str(rows),
        "1.0",
        "--dataset_mixer_eval_list",
        str(rows),
        "4",
        "--dataset_mixer_eval_list_splits",
        "train",
        "--dataset_local_cache_dir",
        "",
        "--output_dir",
        str(out),
        "--num_unique_prompts_rollout",
        "4",
        "--num_samples_per_prompt_rollout",
        "4",
        "--total_episodes",
        str(STEPS * 16),
        "--response_length",
        "96",
        "--max_prompt_token_length",
        "128",
        "--pack_length",
        "256",
        "--async_steps",
        "1",
        "--learning_rate",
        "1e-5",
        "--beta",
        "0",
        "--vllm_kv_cache_gib",
        "0.25",
        "--num_evals",
        "0",
        "--save_traces",
        "--rollouts_save_path",
        str(tmp_path / "traces"),
        "--run_name",
        "ext",
        "--no_filter_zero_std_samples",
    ]
    # tests/ for the forced-turns engine (helpers.forced_turns), as pytest has it on its path.
    paths = [str(EXAMPLE), str(REPO / "tests"), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    env["TOKENIZERS_PARALLELISM"] = "false"
    result = subprocess.run(
        [sys.executable, "-c", RUN, *flags], capture_output=True, text=True, timeout=900, env=env, check=False
    )
    assert result.returncode == 0 and "STATUS completed" in result.stdout, (result.stdout + result.stderr)[-4000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["training_step"] for m in steps] == list(range(STEPS))
    for m in steps:
        assert m["tools/reverse_text/calls_per_sample"] >= 1.0  # the user's tool answered every sample's turn 1
        assert m["env/countdown/ticks"] >= 1.0  # the user's environment stepped in turn 2
    from open_instruct.traces import read_traces

    traces = list(read_traces(str(tmp_path / "traces"), "ext"))
    assert len(traces) == STEPS * 16
    assert all(set(t["verifier_scores"]) == {"last_digit"} and not t["reward_errors"] for t in traces)
    assert any("reversed: ba" in json.dumps(t) for t in traces)  # the tool's --tool_configs reached it


def test_an_extension_module_that_does_not_import_is_one_line_before_anything_starts(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "open_instruct" / "grpo_fast.py"),
            "--extension_modules",
            "no_such_extension",
            "--output_dir",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "grpo_fast.py: extension module 'no_such_extension' (from --extension_modules) failed to import: "
        "ModuleNotFoundError: No module named 'no_such_extension'"
    )
