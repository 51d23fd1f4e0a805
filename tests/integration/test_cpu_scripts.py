"""The CPU scripts run for real: scripts/cpu_demo.sh (README command 1) trains, evaluates and writes its
outputs, and scripts/benchmark_generation.sh runs its streaming-vs-batched comparison, both cut small."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_cpu_demo_script_runs_a_short_training_run(tmp_path):
    """README command 1 with its step count cut (later flags win): set-up, training, outputs."""
    out = tmp_path / "demo"
    result = subprocess.run(
        [
            "bash",
            "scripts/cpu_demo.sh",
            "--total_episodes",
            "256",
            "--num_evals",
            "1",
            "--save_freq",
            "0",
            "--output_dir",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and "eval/verifiable_reward" in metrics[-1]
    assert len((out / "eval.jsonl").read_text().splitlines()) == 2  # --eval_on_step_0 and the final one
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"


def test_benchmark_generation_script_runs(tmp_path):
    result = subprocess.run(
        [
            "bash",
            "scripts/benchmark_generation.sh",
            "--prompts",
            "4",
            "--samples",
            "2",
            "--concurrency",
            "4",
            "--median_tokens",
            "8",
            "--max_tokens",
            "32",
            "--kv_cache_gib",
            "0.1",
            "--output",
            str(tmp_path / "g.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "streaming / batched" in result.stdout and (tmp_path / "g.json").exists()
