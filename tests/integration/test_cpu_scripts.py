"""The CPU demo runs for real: scripts/cpu_demo.sh (README command 1) trains, evaluates and writes its outputs,
cut small. The benchmark scripts' runs are the nightly tier's (tests/nightly/test_benchmark_scripts.py)."""

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
