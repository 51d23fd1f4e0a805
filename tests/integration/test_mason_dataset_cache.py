"""mason.py's automatic dataset caching, for real: before submitting a grpo_fast.py command it runs the
command's own tokenization here (`grpo_fast.py --cache_dataset_only`, the repository's .venv), and the job
gets the cache key when it can read the cache; a dataset that cannot be reached stops the launch with one
line and submits nothing.

A fake `beaker` CLI (a Beaker user with credentials) records the experiment it is asked to create. The
training data is the embedded default, so nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from helpers import fake_clis

from open_instruct.data.cache import load_mix

REPO = Path(__file__).resolve().parents[2]


def launch(tmp: Path, *options: str, trainer: tuple[str, ...] = (), env: dict[str, str] | None = None):
    bin_dir, record = fake_clis.install(tmp / "bin"), tmp / "created.json"
    command = ["python", "open_instruct/grpo_fast.py", "--output_dir", "/output", *trainer]
    run = subprocess.run(
        [sys.executable, str(REPO / "mason.py"), "--cluster", "ai2/jupiter", *options, "--", *command],
        cwd=tmp,  # no open_instruct/ here: mason runs the repository's grpo_fast.py
        env={
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "BEAKER_TOKEN": "t",
            "FAKE_BEAKER_USER": "me",
            "FAKE_BEAKER_EXPERIMENT": str(record),
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    spec = yaml.safe_load(json.loads(record.read_text())["spec"]) if record.exists() else None
    return run, spec


def test_the_job_gets_the_key_of_the_cache_tokenized_before_submission(tmp_path):
    cache = tmp_path / "shared_cache"  # without --pure_docker_mode the job runs from this directory
    run, spec = launch(tmp_path, trainer=("--dataset_local_cache_dir", str(cache)))
    assert run.returncode == 0, run.stderr
    assert "caching the datasets first" in run.stderr and "--cache_dataset_only" in run.stderr
    (command,) = spec["tasks"][0]["arguments"]
    words = command.split()
    train_key = words[words.index("--dataset_config_hash") + 1]
    eval_key = words[words.index("--dataset_config_eval_hash") + 1]
    assert load_mix(cache, train_key) and load_mix(cache, eval_key)  # the entries the job will reuse
    assert "--cache_dataset_only" not in words
    # The job's resumable state has its own directory under the automatic prefix, and W&B resumes.
    state = words[words.index("--checkpoint_state_dir") + 1]
    assert state.startswith("/weka/oe-adapt-default/allennlp/deletable_checkpoint_states/me/")
    assert {"name": "WANDB_RESUME", "value": "allow"} in spec["tasks"][0]["envVars"]


def test_a_cache_the_job_cannot_see_is_not_handed_to_it(tmp_path):
    run, spec = launch(tmp_path, "--pure_docker_mode", trainer=("--dataset_local_cache_dir", str(tmp_path / "c")))
    assert run.returncode == 0, run.stderr
    assert "the job tokenizes its datasets itself" in run.stderr
    assert "--dataset_config_hash" not in spec["tasks"][0]["arguments"][0]


def test_a_dataset_that_cannot_be_reached_stops_the_launch_in_one_line(tmp_path):
    run, spec = launch(
        tmp_path,
        trainer=("--dataset_mixer_list", "nobody/no-such-dataset", "1.0"),
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert run.returncode == 1 and spec is None  # nothing submitted
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("mason.py: caching the datasets failed (exit 2): grpo_fast.py: nobody/no-such-dataset")
    assert last.endswith("nothing was submitted (--no_auto_dataset_cache skips this step)")
    assert "Traceback" not in run.stderr


def test_no_auto_dataset_cache_submits_without_running_anything_here(tmp_path):
    run, spec = launch(
        tmp_path, "--no_auto_dataset_cache", trainer=("--dataset_mixer_list", "nobody/no-such-dataset", "1.0")
    )
    assert run.returncode == 0, run.stderr
    assert "caching" not in run.stderr and spec is not None
