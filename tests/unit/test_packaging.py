"""What an installed package needs ships inside it: the DeepSpeed ZeRO settings are package data, found
through importlib.resources (not a path next to the source tree), and a missing file is an error."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from open_instruct.learner.deepspeed_setup import zero_settings

REPO = Path(__file__).resolve().parents[2]


def test_zero_settings_come_from_the_package_files():
    assert zero_settings(0) == {"stage": 0}  # plain data parallelism: nothing to tune, no file
    assert zero_settings(1)["stage"] == 1
    for stage in (2, 3):
        settings = zero_settings(stage)
        assert settings["stage"] == stage and settings["contiguous_gradients"] is True
    assert zero_settings(3)["stage3_gather_16bit_weights_on_model_save"] is True


def test_a_missing_settings_file_is_an_error_not_a_bare_stage():
    with pytest.raises(FileNotFoundError, match=r"ZeRO-4 settings missing: .*zero4\.json"):
        zero_settings(4)


def test_the_wheel_carries_the_settings_and_the_code_server_and_no_benchmark_or_test(tmp_path):
    """What ships is what a run needs: the benchmarks run from a checkout (or the image, which is one), and the
    tests' doubles stay with the tests."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [wheel] = tmp_path.glob("open_instruct-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"open_instruct/ds_configs/zero{stage}.json" for stage in (1, 2, 3)} <= names
    assert {"open_instruct/agents/wordle_words.txt", "open_instruct/agents/rollout.py"} <= names
    assert {"code_server/server.py", "code_server/sandbox.py"} <= names
    tops = {name.split("/")[0] for name in names if not name.startswith("open_instruct-")}  # but the metadata
    assert tops == {"open_instruct", "code_server"}
