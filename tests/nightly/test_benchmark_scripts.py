"""The benchmark wrapper scripts run for real, cut small: scripts/benchmark_generation.sh runs its
streaming-vs-batched comparison (about 90 s on the 2-core CPU machine: the nightly tier's, as every benchmark's
smoke run is)."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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
