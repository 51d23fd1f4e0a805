"""open-instruct's own mason.py launch lines run here as written: every recorded line dry-runs, its spec
carries the line's values, and the command each replica would run hands grpo_fast.py the script's
arguments plus mason's additions.

The lines are data (tests/data/open_instruct_mason_launches.json, recorded by
scripts/record_mason_launches.py with bash expanding each script's variables). Expected values are read
from each line by a small parser of its own here, not by mason.py's, and the container command is run by
a real bash against stub setup scripts and a stub `python`/`uv` that record their argv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import fake_clis

REPO = Path(__file__).resolve().parents[2]
DATA = json.loads((REPO / "tests" / "data" / "open_instruct_mason_launches.json").read_text())
LAUNCHES = {launch["script"]: launch for launch in DATA["launches"]}
USER = DATA["beaker_user"]
WEKA = ("ai2/jupiter", "ai2/saturn", "ai2/titan", "ai2/neptune", "ai2/ceres", "ai2/triton", "ai2/rhea")
WEKA += ("ai2/prometheus", "ai2/holmes")
CODE_API_URL = "http://code-api.test:1234"
# A comment inside its continued mason.py line ends the command there, before `--`: open-instruct's own
# mason.py fails on it too (its first extra argument must be `--`).
BROKEN_IN_OPEN_INSTRUCT = {"scripts/train/debug/full_integration_test.sh"}
# mason.py option -> how many values it takes: 0, 1, or "+" (one or more, until the next option).
ARITY = {
    "--cluster": "+",
    "--hostname": "+",
    "--beaker_datasets": "+",
    "--env": 1,
    "--secret": 1,
    "--image": 1,
    "--workspace": 1,
    "--budget": 1,
    "--priority": 1,
    "--num_nodes": 1,
    "--max_retries": 1,
    "--gpus": 1,
    "--shared_memory": 1,
    "--timeout": 1,
    "--description": 1,
    "--task_name": 1,
    "--auto_output_dir_path": 1,
    "--auto_checkpoint_state_dir": 1,
    "--artifact_ttl": 1,
    "--gs_model_name": 1,
}
AUTO_OUTPUT = "/weka/oe-adapt-default/allennlp/deletable_checkpoint"
AUTO_STATE = "/weka/oe-adapt-default/allennlp/deletable_checkpoint_states"
# Stands in for python, python3 and uv in the container: records the argv of the program it would run.
STUB = f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
if os.path.basename(sys.argv[0]) == "uv":
    args = [a for a in args[1:] if not a.startswith("--no-sync")]
with open(os.environ["ARGV_OUT"], "a") as f:
    f.write(json.dumps(args) + "\\n")
"""


def options_of(argv: list[str]) -> dict[str, list[str]]:
    """mason.py option -> every value given to it, in order (flags without values map to [])."""
    found: dict[str, list[str]] = {}
    own = argv[: argv.index("--")]
    i = 0
    while i < len(own):
        option = own[i]
        arity = ARITY.get(option, 0)
        found.setdefault(option, [])
        if arity == "+":
            j = i + 1
            while j < len(own) and not own[j].startswith("--"):
                j += 1
            found[option] += own[i + 1 : j]
            i = j
        else:
            found[option] += own[i + 1 : i + 1 + arity]
            i += 1 + arity
    return found


def trainer_of(command: list[str]) -> list[str]:
    """The arguments of grpo_fast.py in a command: after the script, to the end of the command."""
    start = next(i for i, token in enumerate(command) if token.endswith("open_instruct/grpo_fast.py"))
    return command[start + 1 :]


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict[str, dict]:
    """Every recorded line dry-run once, as a Beaker user whose workspace holds HF_TOKEN."""
    tmp = write_setup_scripts(tmp_path_factory.mktemp("mason_launches"))
    bin_dir = fake_clis.install(tmp / "bin")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "BEAKER_")) and k != "RUN_NAME"}
    env = {**base, "PATH": f"{bin_dir}:{os.environ['PATH']}", "BEAKER_TOKEN": "token", "HOME": str(tmp)}
    env.update(FAKE_BEAKER_USER=USER, FAKE_BEAKER_SECRETS="HF_TOKEN")
    results = {}
    for script, launch in LAUNCHES.items():
        run = subprocess.run(
            [sys.executable, str(REPO / "mason.py"), "--dry_run", *launch["argv"]],
            env=env,
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        results[script] = {"run": run, "spec": yaml.safe_load(run.stdout) if run.returncode == 0 else None}
    return results


def test_the_record_holds_every_mason_launch_of_grpo_fast():
    assert len(LAUNCHES) == len(DATA["launches"]) == 43  # no script twice
    for launch in DATA["launches"]:
        command = launch["argv"][launch["argv"].index("--") :] if "--" in launch["argv"] else []
        assert launch["script"] in BROKEN_IN_OPEN_INSTRUCT or any("grpo_fast.py" in t for t in command)
    assert sum(launch["via_launcher"] for launch in DATA["launches"]) == 6


@pytest.mark.parametrize("script", sorted(BROKEN_IN_OPEN_INSTRUCT))
def test_a_line_without_its_command_is_refused_in_one_line(script, launched):
    run = launched[script]["run"]
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines()[-1].endswith("missing `-- COMMAND`: put the command to run after `--`")


RUNNABLE = sorted(set(LAUNCHES) - BROKEN_IN_OPEN_INSTRUCT)


@pytest.mark.parametrize("script", RUNNABLE)
def test_every_recorded_line_dry_runs_and_its_spec_carries_its_values(script, launched):
    run, spec = launched[script]["run"], launched[script]["spec"]
    assert run.returncode == 0, run.stderr
    options = options_of(LAUNCHES[script]["argv"])

    def one(option: str, default=None):
        return options[option][-1] if options.get(option) else default

    clusters = list(dict.fromkeys(options["--cluster"]))
    nodes = int(one("--num_nodes", 1))
    assert spec["description"] == one("--description", "Beaker-Mason job.")
    assert spec.get("budget") == one("--budget")
    assert spec["retry"] == {"allowedTaskRetries": int(one("--max_retries", 0))}
    (task,) = spec["tasks"]
    assert task["name"] == f"{one('--task_name', 'beaker_mason')}__0"
    assert task["image"] == {"beaker": one("--image", "ai2/cuda11.8-cudnn8-dev-ubuntu20.04")}
    hosts = options.get("--hostname")
    assert task["constraints"] == ({"hostname": hosts} if hosts else {"cluster": clusters})
    assert task["replicas"] == nodes and task.get("leaderSelection", False) == (nodes > 1)
    assert task["hostNetworking"] == ("--no-host-networking" not in options)
    assert task["resources"] == {"gpuCount": int(one("--gpus", 0)), "sharedMemory": one("--shared_memory", "10.24gb")}
    assert task["context"] == {"priority": one("--priority", "normal"), "preemptible": "--preemptible" in options}
    assert task.get("timeout") == one("--timeout")

    on_weka = all(cluster in WEKA for cluster in clusters)
    mounts = {m["mountPath"]: m["source"] for m in task["datasets"]}
    assert ("/weka/oe-adapt-default" in mounts) == on_weka
    assert ("/var/run/docker.sock" in mounts) == ("--mount_docker_socket" in options)

    env = {e["name"]: e for e in task["envVars"]}
    assert len(env) == len(task["envVars"])  # each name once
    for pair in options.get("--env", []):
        name, value = pair.split("=", 1)
        assert env[name] == {"name": name, "value": value}
    for pair in options.get("--secret", []):
        name, secret = pair.split("=", 1)
        assert env[name] == {"name": name, "secret": secret}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "secret": "HF_TOKEN"}  # the workspace's secret
    resumable = "--non_resumable" not in options
    assert ("WANDB_RUN_ID" in env) == resumable and ("HF_HOME" in env) == on_weka
    caching = "would cache the datasets first" in run.stderr
    assert caching == ("--no_auto_dataset_cache" not in options)


def write_setup_scripts(workdir: Path) -> Path:
    """Setup scripts that export what the real ones export (the non-pure-docker line runs from mason's
    own working directory, so it gets them too)."""
    setup = workdir / "configs" / "beaker_configs"
    setup.mkdir(parents=True)
    (setup / "ray_node_setup.sh").write_text("export RAY_ADDRESS=auto\n")
    (setup / "code_api_setup.sh").write_text(f"export CODE_API_URL={CODE_API_URL}\n")
    return workdir


def run_in_container(command: str, tmp: Path) -> list[list[str]]:
    """Run a task's `bash -c` command in a stand-in image whose programs record their argv."""
    workdir = write_setup_scripts(tmp / "image_workdir")
    bin_dir = tmp / "image_bin"
    bin_dir.mkdir()
    for name in ("python", "python3", "uv"):
        (bin_dir / name).write_text(STUB)
        (bin_dir / name).chmod(0o755)
    out = tmp / "argv.jsonl"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "ARGV_OUT": str(out), "HOME": str(tmp)}
    subprocess.run(["/bin/bash", "-c", command], cwd=workdir, env=env, check=True, timeout=60)
    return [json.loads(line) for line in out.read_text().splitlines()]


def expected_trainer(script: str) -> list[str]:
    """The script's grpo_fast.py arguments with the container's $CODE_API_URL, before mason's additions."""
    argv = LAUNCHES[script]["argv"]
    command = [token for token in argv[argv.index("--") + 1 :] if token not in ("&&", "&&python")]
    return [token.replace("$CODE_API_URL", CODE_API_URL) for token in trainer_of(command)]


def drop(argv: list[str], *flags: str) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        if argv[i] in flags:
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


@pytest.mark.parametrize("script", RUNNABLE)
def test_each_replica_runs_the_scripts_trainer_arguments_and_masons_additions(script, launched, tmp_path):
    (task,) = launched[script]["spec"]["tasks"]
    options = options_of(LAUNCHES[script]["argv"])
    calls = run_in_container(task["arguments"][0], tmp_path)
    (trainer,) = [call for call in calls if any(token.endswith("grpo_fast.py") for token in call)]
    received = trainer_of(trainer)
    given = expected_trainer(script)
    replaced = ("--checkpoint_state_dir", "--output_dir", "--hf_entity", "--wandb_entity")
    assert drop(received, *replaced) == drop(given, *replaced)  # every other token, byte for byte

    def last(argv: list[str], flag: str) -> str | None:
        return argv[len(argv) - 1 - argv[::-1].index(flag) + 1] if flag in argv else None

    ttl = options.get("--artifact_ttl", [None])[-1]
    suffix = f"/tmp-{ttl}" if ttl else ""
    state = last(received, "--checkpoint_state_dir")
    if "--non_resumable" in options or "/weka/" in (last(given, "--checkpoint_state_dir") or ""):
        assert state == last(given, "--checkpoint_state_dir")
    else:
        assert state.startswith(f"{AUTO_STATE}/{USER}/") and state.endswith(suffix), state
    clusters = options["--cluster"]
    if any(cluster in WEKA for cluster in clusters) and "/weka/" not in (last(given, "--output_dir") or ""):
        assert last(received, "--output_dir") == f"{AUTO_OUTPUT}/{USER}{suffix}/"
    else:
        assert last(received, "--output_dir") == last(given, "--output_dir")
    for flag, value in (("--hf_entity", "allenai"), ("--wandb_entity", "ai2-llm")):
        assert last(received, flag) == (last(given, flag) or value)
