"""Errors users cause, as a new user meets them: bad flags, paths, dataset rows, model and dataset names, a
service that is not there. Each run of `grpo_fast.py` must exit non-zero with a last line that names the
culprit, print no traceback, and leave no process behind; a hub name that cannot be fetched fails within
seconds. `--verbose` brings the traceback back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CODE_ROW = {
    "messages": [{"role": "user", "content": "Write f(x) returning x + 1."}],
    "ground_truth": ["assert f(1) == 2"],
    "dataset": "code",
}
GOOD_ROW = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "ground_truth": "5", "dataset": "gsm8k"}


def write_rows(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def a_file(tmp: Path) -> Path:
    path = tmp / "not_a_folder"
    path.write_text("a file where a folder goes\n")
    return path


def rows_case(name: str, rows: list, culprit: str, *extra: str):
    def argv(tmp: Path) -> list[str]:
        return ["--dataset_mixer_list", str(write_rows(tmp / name, rows)), "1.0", *extra]

    return argv, culprit


CASES = {
    # flags
    "unknown flag": (lambda tmp: ["--no_such_flag", "1"], "--no_such_flag"),
    "bad type": (lambda tmp: ["--learning_rate", "fast"], "--learning_rate"),
    "too few episodes": (lambda tmp: ["--total_episodes", "8"], "--total_episodes 8"),
    "offload without ZeRO-3": (lambda tmp: ["--deepspeed_offload_param"], "--deepspeed_offload_param"),
    "unknown sync backend": (lambda tmp: ["--vllm_sync_backend", "mpi"], "--vllm_sync_backend mpi"),
    "sequence parallel on ZeRO-0": (lambda tmp: ["--sequence_parallel_size", "2"], "--sequence_parallel_size 2"),
    "shared device, two engines": (lambda tmp: ["--single_gpu_mode", "--vllm_num_engines", "2"], "--single_gpu_mode"),
    "output folder is a file": (lambda tmp: ["--output_dir", str(a_file(tmp))], "--output_dir"),
    "state folder is a file": (
        lambda tmp: ["--checkpoint_state_freq", "1", "--checkpoint_state_dir", str(a_file(tmp))],
        "--checkpoint_state_dir",
    ),
    "token budget under a row": (lambda tmp: ["--micro_batch_token_budget", "100"], "--micro_batch_token_budget"),
    "LoRA with whole modules": (
        lambda tmp: ["--use_peft", "--lora_modules_to_save", "lm_head"],
        "--lora_modules_to_save lm_head",
    ),
    "LoRA on a module the model lacks": (
        lambda tmp: ["--use_peft", "--lora_target_modules", "q_proj", "qkv"],
        "--lora_target_modules qkv",
    ),
    "unknown attention backend": (lambda tmp: ["--vllm_attention_backend", "NOPE"], "--vllm_attention_backend NOPE"),
    # open-instruct's default tokenizer function keeps the tokenizer's template for an unknown name; v2_1 refuses
    "unknown chat template": (
        lambda tmp: ["--chat_template_name", "nosuch", "--get_tokenizer_fn", "get_tokenizer_tulu_v2_1"],
        "--chat_template_name 'nosuch'",
    ),
    "universal without ZeRO": (
        lambda tmp: ["--deepspeed_checkpoint_load_universal"],
        "--deepspeed_checkpoint_load_universal",
    ),
    # paths
    "missing model path": (lambda tmp: ["--model_name_or_path", "/nonexistent/model"], "/nonexistent/model"),
    "folder that is not a model": (lambda tmp: ["--model_name_or_path", str(tmp)], "no config.json"),
    "missing tokenizer path": (lambda tmp: ["--tokenizer_name_or_path", "/nonexistent/tok"], "/nonexistent/tok"),
    "missing dataset file": (
        lambda tmp: ["--dataset_mixer_list", "/nonexistent/rows.jsonl", "1.0"],
        "/nonexistent/rows.jsonl",
    ),
    "missing resume state": (lambda tmp: ["--resume_from_checkpoint", "/nonexistent/state"], "/nonexistent/state"),
    "unsupported dataset file": (
        lambda tmp: ["--dataset_mixer_list", str(write_rows(tmp / "rows.txt", [GOOD_ROW])), "1.0"],
        "rows.txt",
    ),
    # rows
    "malformed JSON line": rows_case("broken.jsonl", [GOOD_ROW, "{not json"], "broken.jsonl"),
    "row without messages": rows_case("nomsg.jsonl", [{"ground_truth": "5", "dataset": "gsm8k"}], "messages"),
    "unknown verifier": rows_case("verifier.jsonl", [{**GOOD_ROW, "dataset": "nosuch_verifier"}], "nosuch_verifier"),
    "every prompt too long": rows_case(
        "long.jsonl", [GOOD_ROW] * 4, "max_prompt_token_length", "--max_prompt_token_length", "4"
    ),
    "empty dataset file": rows_case("empty.jsonl", [], "empty.jsonl"),
    "row without ground truth": rows_case(
        "nogt.jsonl", [{k: v for k, v in GOOD_ROW.items() if k != "ground_truth"}], "ground_truth"
    ),
    # names
    "hub model that cannot be fetched": (
        lambda tmp: ["--model_name_or_path", "nosuch-org/nosuch-model"],
        "nosuch-org/nosuch-model",
    ),
    "hub dataset that cannot be fetched": (
        lambda tmp: ["--dataset_mixer_list", "nosuch-org/nosuch-data", "1.0"],
        "nosuch-org/nosuch-data",
    ),
    # services
    "code service not running": rows_case(
        "code.jsonl",
        [CODE_ROW] * 200,
        "--code_api_url http://127.0.0.1:9",
        "--code_api_url",
        "http://127.0.0.1:9/test_program",
    ),
}


def processes_with(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if marker.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def run(argv: list[str], tmp: Path, *extra: str) -> tuple[subprocess.CompletedProcess, float, str]:
    marker = f"OI_BAD_INPUT_{uuid.uuid4().hex}"
    env = {**os.environ, marker: "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline"}
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "open_instruct" / "grpo_fast.py"),
            "--output_dir",
            str(tmp / "out"),
            "--total_episodes",
            "64",
            *argv,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
        check=False,
    )
    return done, time.monotonic() - started, marker


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_users_error_is_one_line_naming_the_culprit(case, tmp_path):
    make_argv, culprit = CASES[case]
    done, seconds, marker = run(make_argv(tmp_path), tmp_path)
    output = done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0, output[-2000:]
    assert "Traceback" not in output, output[-3000:]
    assert lines and culprit in lines[-1], lines[-3:]
    assert seconds < 60, seconds  # a hub name without network fails in seconds, not after a minute of retries
    deadline = time.monotonic() + 30  # a child may still be exiting when the parent has: wait for it, then judge
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_with(marker), "processes left behind"


def test_verbose_shows_the_traceback_of_a_users_error(tmp_path):
    done, _, _ = run(["--model_name_or_path", "/nonexistent/model", "--verbose"], tmp_path)
    assert done.returncode == 2 and "Traceback" in done.stderr
    assert (
        done.stderr.strip().splitlines()[-1]
        == "grpo_fast.py: --model_name_or_path /nonexistent/model: no such file or directory"
    )


def test_the_sweep_covers_at_least_25_cases():
    assert len(CASES) >= 25
