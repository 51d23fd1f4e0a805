"""Running grpo_fast.py as a user does (a subprocess) and reading what it wrote: shared by the end-to-end tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STEPS = 8
# High temperature makes the tiny model ramble to the length limit: generation is then slower than a
# learner step, so engines are busy when each sync lands and samples span two weight versions.
COMMON = [
    "--num_unique_prompts_rollout",
    "8",
    "--num_samples_per_prompt_rollout",
    "4",
    "--total_episodes",
    str(STEPS * 32),
    "--response_length",
    "64",
    "--temperature",
    "1.6",
    "--max_prompt_token_length",
    "64",
    "--pack_length",
    "256",
    "--stop_strings",
    "</answer>",
    "--learning_rate",
    "1e-4",
    "--lr_scheduler_type",
    "constant",
    "--beta",
    "0",
    "--async_steps",
    "1",
    # No staleness bound here: which groups a bound would requeue depends on timing, and these tests
    # compare admissions across runs (the bound's own runs are in test_staleness_bound.py).
    "--max_off_policy_steps",
    "100",
    "--vllm_kv_cache_gib",
    "0.25",
    # No evaluation rounds unless a test asks (later flags win): the default round after the last step, of
    # 64 eval prompts, would add samples these runs do not need.
    "--num_evals",
    "0",
    "--seed",
    "5",
]


def run_grpo(
    args: list[str],
    out: Path,
    stop_when: Callable[[], bool] | None = None,
    timeout_s: float = 900,
    cwd=REPO,
    script: Path | None = None,
    env: dict[str, str] | None = None,
):
    """Run grpo_fast.py (or `script`, a wrapper of it; `env` on top of ours); SIGTERM it once `stop_when()`."""
    log_path = out.parent / f"{out.name}.log"
    environment = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline", **(env or {})}
    script = script or REPO / "open_instruct" / "grpo_fast.py"
    with open(log_path, "a") as log:
        proc = subprocess.Popen(
            [sys.executable, str(script), "--output_dir", str(out), *args],
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
        )
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            if stop_when is not None and stop_when():
                proc.send_signal(signal.SIGTERM)
                stop_when = None
            time.sleep(0.2)
        if proc.poll() is None:
            proc.kill()
            raise AssertionError(f"{script.name} did not finish in {timeout_s}s; see {log_path}")
    return proc.returncode, log_path.read_text()


def steps_logged(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["training_step"] for line in path.read_text().splitlines() if line.strip()]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
