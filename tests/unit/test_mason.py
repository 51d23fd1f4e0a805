"""mason.py: the long-reasoning launch's command becomes a correct Beaker spec whose command survives bash.

What: the launch's `python mason.py ... -- source ... \\&\\& python open_instruct/grpo_fast.py ...` command
(tests/fixtures/seed_mason_command.txt, verbatim) is first run through a real bash with its shell variables
set, with `python` stubbed, to capture exactly the argv a user's shell hands to mason.py. mason.py then
builds the spec (--dry_run); the spec's fields are checked, and its embedded command is executed with
`bash -c` against stub setup scripts and a stub `python`, whose recorded argv must equal the original tokens
exactly. Bad inputs must fail with exit code 2 and a message naming the flag; submission goes through a
fake `beaker` CLI only when one and credentials exist.

Run: `.venv/bin/pytest tests/unit/test_mason.py` (a few seconds, CPU only, no network, no Beaker).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import fake_clis

import mason

REPO = Path(__file__).resolve().parents[2]
MASON = REPO / "mason.py"
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "seed_mason_command.txt"

SEED_VARIABLES = {
    "exp_name": "2606rl_update_fil_dapo_pol_qwen2_5_orz_only_mix_4242",
    "split_value": ("hamishivi/hamishivi_rlvr_orz_math_57k_collected_all_filtered_hamishivi_qwen2_5_openthoughts2 1.0"),
    "add_bos": "False",
    "model_name_or_path": "hamishivi/qwen2_5_openthoughts2",
    "chat_template_name": "tulu_thinker",
}
# Every option of open-instruct's mason.py at the recorded commit (e6c3044).
OPEN_INSTRUCT_OPTIONS = (
    "--cluster",
    "--hostname",
    "--max_retries",
    "--budget",
    "--gpus",
    "--shared_memory",
    "--num_nodes",
    "--image",
    "--workspace",
    "--beaker_datasets",
    "--description",
    "--task_name",
    "--priority",
    "--preemptible",
    "--pure_docker_mode",
    "--mount_docker_socket",
    "--no_hf_cache_env",
    "--no_mount_nfs",
    "--non_resumable",
    "--no_auto_dataset_cache",
    "--auto_output_dir_path",
    "--auto_checkpoint_state_dir",
    "--artifact_ttl",
    "--env",
    "--secret",
    "--no-host-networking",
    "--timeout",
)
VALID = [
    "--cluster",
    "ai2/jupiter-cirrascale-2",
    "--image",
    "me/img",
    "--workspace",
    "ai2/ws",
    "--budget",
    "ai2/b",
]

# Records each call's argv, plus the variables the stub setup scripts export, one JSON line per call.
STUB_PYTHON = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["ARGV_OUT"], "a") as f:
    env = {{k: os.environ.get(k) for k in ("FROM_RAY_SETUP", "FROM_CODE_SETUP")}}
    f.write(json.dumps({{"argv": sys.argv[1:], "env": env}}) + "\\n")
"""


def make_stub_bin(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    stub = directory / "python"
    stub.write_text(STUB_PYTHON)
    stub.chmod(0o755)
    return directory


def recorded_calls(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def local_shell_argv(tmp_path: Path) -> list[str]:
    """The argv the user's own shell passes to mason.py for the seed command (bash does the expanding)."""
    stub_bin = make_stub_bin(tmp_path / "local_bin")
    out = tmp_path / "local_argv.jsonl"
    env = {**os.environ, **SEED_VARIABLES, "PATH": f"{stub_bin}:{os.environ['PATH']}", "ARGV_OUT": str(out)}
    subprocess.run(["bash", str(FIXTURE)], env=env, check=True, timeout=30)
    (call,) = recorded_calls(out)
    return call["argv"]


def run_mason(args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k != "BEAKER_TOKEN"}
    return subprocess.run(
        [sys.executable, str(MASON), *args],
        env={**base, "HOME": str(home), **(env or {})},  # HOME without ~/.beaker: no credentials
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture()
def seed(tmp_path):
    argv = local_shell_argv(tmp_path)
    assert argv[0] == "mason.py"
    args = argv[1:]
    result = run_mason(["--dry_run", *args], tmp_path)
    assert result.returncode == 0, result.stderr
    return {
        "args": args,
        "command": args[args.index("--") + 1 :],
        "spec": yaml.safe_load(result.stdout),
        "run": result,
    }


def test_seed_command_gives_the_requested_multi_node_spec(seed):
    spec = seed["spec"]
    assert spec["version"] == "v2"
    assert spec["budget"] == "ai2/oe-adapt"
    assert spec["description"] == "Beaker-Mason job."  # open-instruct's default: the seed gives none
    assert spec["retry"] == {"allowedTaskRetries": 0}
    (task,) = spec["tasks"]
    assert task["name"] == "beaker_mason__0"
    assert task["replicas"] == 6
    assert task["leaderSelection"] is True
    assert task["hostNetworking"] is True
    assert task["propagateFailure"] is True and task["propagatePreemption"] is True
    assert task["image"] == {"beaker": "hamishivi/open_instruct_hamish_update_2606"}
    assert task["resources"] == {"gpuCount": 8, "sharedMemory": "10.24gb"}
    assert task["datasets"] == []  # ai2/jupiter-cirrascale-2 is not on open-instruct's list of Weka clusters
    assert task["context"] == {"priority": "high", "preemptible": True}
    assert task["constraints"] == {"cluster": ["ai2/jupiter-cirrascale-2"]}
    assert task["result"] == {"path": "/output"}
    env = {item["name"]: item for item in task["envVars"]}
    assert env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == {"name": "VLLM_ALLOW_LONG_MAX_MODEL_LEN", "value": "1"}
    assert env["PYTHONUNBUFFERED"]["value"] == "1"
    assert {name: env[name]["value"] for name in mason.DEFAULT_ENV} == mason.DEFAULT_ENV
    assert env["WANDB_RESUME"]["value"] == "allow" and len(env["WANDB_RUN_ID"]["value"]) == 8  # resumable
    assert task["command"] == ["/bin/bash", "-c"]
    (command,) = task["arguments"]
    # --pure_docker_mode: runs from the image's working directory, no `cd` into a local checkout.
    assert command.startswith(
        "source configs/beaker_configs/ray_node_setup.sh && source configs/beaker_configs/code_api_setup.sh"
        " && python open_instruct/grpo_fast.py --hf_entity allenai --wandb_entity ai2-llm --exp_name "
        + SEED_VARIABLES["exp_name"]
    )
    # A dry run caches nothing: it says what it would run.
    assert "would cache the datasets first:" in seed["run"].stderr
    assert (
        "open_instruct/grpo_fast.py --exp_name" in seed["run"].stderr and "--cache_dataset_only" in seed["run"].stderr
    )
    # The seed uses --with_tracking but passes no W&B secret: mason says so, and still prints the spec.
    assert "WANDB_API_KEY" in seed["run"].stderr
    assert "not submitting (--dry_run)" in seed["run"].stderr
    # The workspace goes to the beaker command line only: the dry run shows that command beside the spec.
    workspace = seed["args"][seed["args"].index("--workspace") + 1]
    submit = f"beaker experiment create experiment.yaml --workspace {workspace}"
    assert seed["run"].stdout.startswith(f"# {submit}\n")
    assert f"would run: {submit}" in seed["run"].stderr


def test_embedded_command_runs_unchanged_through_bash(seed, tmp_path):
    (command,) = seed["spec"]["tasks"][0]["arguments"]
    workdir = tmp_path / "container_workdir"  # stands in for the image's working directory
    setup_dir = workdir / "configs" / "beaker_configs"
    setup_dir.mkdir(parents=True)
    trace = tmp_path / "trace.txt"
    (setup_dir / "ray_node_setup.sh").write_text(f"echo ray_node_setup >> {trace}\nexport FROM_RAY_SETUP=1\n")
    (setup_dir / "code_api_setup.sh").write_text(f"echo code_api_setup >> {trace}\nexport FROM_CODE_SETUP=1\n")
    stub_bin = make_stub_bin(tmp_path / "container_bin")
    out = tmp_path / "container_argv.jsonl"

    subprocess.run(
        ["/bin/bash", "-c", command],  # exactly the spec's command + arguments
        cwd=workdir,
        env={**os.environ, "PATH": f"{stub_bin}:{os.environ['PATH']}", "ARGV_OUT": str(out)},
        check=True,
        timeout=30,
    )

    tokens = seed["command"]
    last_and = len(tokens) - 1 - tokens[::-1].index("&&")
    trainer = tokens[last_and + 1 :]
    assert trainer[:2] == ["python", "open_instruct/grpo_fast.py"]
    (call,) = recorded_calls(out)
    # What open-instruct's mason adds when a command names neither entity, then every token, byte for byte.
    assert call["argv"] == [trainer[1], "--hf_entity", "allenai", "--wandb_entity", "ai2-llm", *trainer[2:]]
    # Both setup scripts were sourced, in order, into the shell that then ran the trainer.
    assert trace.read_text().split() == ["ray_node_setup", "code_api_setup"]
    assert call["env"] == {"FROM_RAY_SETUP": "1", "FROM_CODE_SETUP": "1"}
    argv = call["argv"]
    assert argv[argv.index("--stop_strings") + 1] == "</answer>"
    tasks = argv[argv.index("--oe_eval_tasks") + 1]
    assert tasks.startswith("minerva_math::hamish_zs_reasoning,gsm8k::zs_cot_latex,") and tasks.count(",") == 14
    assert argv[argv.index("--dataset_mixer_list") + 1 : argv.index("--dataset_mixer_list_splits")] == (
        SEED_VARIABLES["split_value"].split()
    )


def test_build_command_keeps_awkward_tokens_and_only_bare_operators(tmp_path):
    tricky = [
        "a b",
        "it's",
        '"quoted"',
        "$",
        "a$1",
        "`id`",
        "x;y",
        "a&&b",
        "",
        "*",
        "line1\nline2",
        "ünï",
        "--k=v w",
    ]
    tokens = ["python", *tricky, "&&", "python", "second", "||", "python", "never", ";", "python", "third"]
    command = mason.build_command(tokens)
    stub_bin = make_stub_bin(tmp_path / "bin")
    out = tmp_path / "argv.jsonl"
    subprocess.run(
        ["/bin/bash", "-c", command],
        env={**os.environ, "PATH": f"{stub_bin}:{os.environ['PATH']}", "ARGV_OUT": str(out)},
        cwd=tmp_path,
        check=True,
        timeout=30,
    )
    # `&&` ran the second command, `||` skipped the third, `;` ran the last one regardless.
    assert [call["argv"] for call in recorded_calls(out)] == [tricky, ["second"], ["third"]]
    assert not list(tmp_path.glob("*id*"))  # nothing was expanded or executed from inside a token


def test_variables_expand_in_the_container_and_nothing_else_does(tmp_path):
    """open-instruct's scripts pass `$CODE_API_URL/test_program`, set in the container by code_api_setup.sh."""
    tokens = ["python", "$CODE_API_URL/test_program", "${CODE_API_URL}x", 'say "$CODE_API_URL" `id` $(id) \\ $1 $']
    stub_bin = make_stub_bin(tmp_path / "bin")
    out = tmp_path / "argv.jsonl"
    subprocess.run(
        ["/bin/bash", "-c", mason.build_command(tokens)],
        env={
            **os.environ,
            "PATH": f"{stub_bin}:{os.environ['PATH']}",
            "ARGV_OUT": str(out),
            "CODE_API_URL": "http://h:1",
        },
        cwd=tmp_path,
        check=True,
        timeout=30,
    )
    (call,) = recorded_calls(out)
    assert call["argv"] == ["http://h:1/test_program", "http://h:1x", 'say "http://h:1" `id` $(id) \\ $1 $']


@pytest.mark.parametrize(
    "tokens, message",
    [
        (["&&", "python", "x"], "no command before"),
        (["python", "x", "&&"], "no command after"),
        (["a", "&&", "||", "b"], "no command before"),
        ([";", "a"], "no command before"),
    ],
)
def test_build_command_rejects_dangling_operators(tokens, message):
    with pytest.raises(ValueError, match=message):
        mason.build_command(tokens)


@pytest.mark.parametrize(
    "args, flag, detail",
    [
        (["--cluster", "jupiter"], "--cluster", "org/name"),
        (["--gpus", "9"], "--gpus", "in [0, 8]"),
        (["--env", "NOEQUALS"], "--env", "NOEQUALS"),
        (["--num_nodes", "0"], "--num_nodes", ">= 1"),
        (["--max_retries", "-1"], "--max_retries", ">= 0"),
        (["--priority", "asap"], "--priority", "invalid choice"),
        (["--workspace", "tulu-thinker"], "--workspace", "org/name"),
        (["--secret", "WANDB_API_KEY"], "--secret", "ENV_VAR=SECRET_NAME"),
        (["--env", "A=1", "--env", "A=2"], "--env", "more than once"),
        (["--beaker_datasets", "01HQXGAY"], "--beaker_datasets", "MOUNT_PATH:DATASET_ID"),
        (["--timeout", "soon"], "--timeout", "15m, 2h or 2h30m"),
        (["--shared_memory", "lots"], "--shared_memory", "10.24gb"),
        (["--hostname"], "--hostname", "expected at least one argument"),
        (["--no_such_option"], "unrecognized arguments", "--no_such_option"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(args, flag, detail, tmp_path):
    result = run_mason([*VALID, *args, "--", "python", "train.py"], tmp_path)
    assert result.returncode == 2
    assert flag in result.stderr and detail in result.stderr, result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("tail, detail", [(["--"], "empty command after `--`"), ([], "missing `-- COMMAND`")])
def test_missing_or_empty_command_exits_2(tail, detail, tmp_path):
    result = run_mason([*VALID, *tail], tmp_path)
    assert result.returncode == 2
    assert detail in result.stderr
    assert result.stdout == ""


def test_without_beaker_cli_prints_yaml_and_exits_0(tmp_path):
    empty_bin = tmp_path / "empty_bin"
    empty_bin.mkdir()
    result = run_mason([*VALID, "--", "python", "train.py"], tmp_path, {"PATH": str(empty_bin), "BEAKER_TOKEN": "t"})
    assert result.returncode == 0
    assert "no `beaker` CLI on PATH" in result.stderr
    spec = yaml.safe_load(result.stdout)
    assert spec["tasks"][0]["arguments"] == [f"cd {shlex.quote(str(tmp_path))} && python train.py"]


def without_ids(spec: dict) -> dict:
    """The spec less what differs between two launches (the W&B run id)."""
    for task in spec["tasks"]:
        task["envVars"] = [e for e in task["envVars"] if e["name"] not in ("WANDB_RUN_ID", "CHECKPOINT_OUTPUT_DIR")]
    return spec


def test_submits_with_the_beaker_cli_when_it_and_credentials_exist(tmp_path):
    bin_dir, record = fake_clis.install(tmp_path / "beaker_bin"), tmp_path / "beaker_call.json"
    args = [
        *VALID,
        "--num_nodes",
        "2",
        "--secret",
        "WANDB_API_KEY=me_WANDB_API_KEY",
        "--",
        "python",
        "train.py",
    ]
    path = f"{bin_dir}:{os.environ['PATH']}"
    beaker = {"FAKE_BEAKER_USER": "me", "FAKE_BEAKER_SECRETS": "me_HF_TOKEN HF_TOKEN OPENAI_API_KEY"}
    beaker.update(FAKE_BEAKER_EXPERIMENT=str(record), FAKE_BEAKER_EXIT="3")
    result = run_mason(args, tmp_path, {"PATH": path, "BEAKER_TOKEN": "token", **beaker})
    assert result.returncode == 3  # the CLI's own status
    call = json.loads(record.read_text())
    assert call["argv"][:2] == ["experiment", "create"]
    assert call["argv"][3:] == ["--workspace", "ai2/ws"]
    spec = yaml.safe_load(call["spec"])
    dry = run_mason(["--dry_run", *args], tmp_path, {"PATH": path, "BEAKER_TOKEN": "token", **beaker})
    assert without_ids(spec) == without_ids(yaml.safe_load(dry.stdout))
    env = spec["tasks"][0]["envVars"]
    assert {"name": "WANDB_API_KEY", "secret": "me_WANDB_API_KEY"} in env
    # The workspace's useful secrets: the user's own copy first, then the shared one.
    assert {"name": "HF_TOKEN", "secret": "me_HF_TOKEN"} in env
    assert {"name": "OPENAI_API_KEY", "secret": "OPENAI_API_KEY"} in env
    assert [e["name"] for e in env].count("HF_TOKEN") == 1
    assert result.stdout == ""

    # Same CLI but no credentials: print, don't call it.
    record.unlink()
    result = run_mason(args, tmp_path, {"PATH": path, **beaker})
    assert result.returncode == 0 and "no Beaker credentials" in result.stderr
    assert yaml.safe_load(result.stdout)["tasks"][0]["replicas"] == 2
    assert not record.exists()


def test_parse_and_build_spec_in_process():
    args = mason.parse_args(
        [
            "--cluster",
            "ai2/a",
            "ai2/b",
            "--cluster",
            "ai2/c",
            "--image",
            "ghcr.io/org/img:1",
            "--workspace",
            "ai2/ws",
            "--budget",
            "ai2/b",
            "--env",
            "PYTHONUNBUFFERED=0",
            "--env",
            "X=a=b",
            "--pure_docker_mode",
            "--description",
            "my run",
            "--task_name",
            "t1",
            "--gpus",
            "1",
            "--",
            "python",
            "train.py",
            "--",
            "python",
            "eval.py",
        ],
        environ={"WANDB_PROJECT": "p", "UNRELATED": "u"},
    )
    assert args.clusters == ("ai2/a", "ai2/b", "ai2/c")
    assert args.commands == (("python", "train.py"), ("python", "eval.py"))
    commands = [mason.Prepared(tokens) for tokens in args.commands]
    ids = mason.LaunchIds("runid123", "1_2")
    spec = mason.build_spec(args, commands, mason.Account(), ids)
    first, second = spec["tasks"]  # one task per command
    assert (first["name"], second["name"]) == ("t1__0", "t1__1")
    assert first["constraints"]["cluster"] == ["ai2/a", "ai2/b", "ai2/c"]
    assert first["image"] == {"docker": "ghcr.io/org/img:1"}
    assert first["replicas"] == 1 and "leaderSelection" not in first  # single node: no replica group
    values = [(e["name"], e.get("value")) for e in first["envVars"]]
    assert ("PYTHONUNBUFFERED", "0") in values and ("PYTHONUNBUFFERED", "1") not in values  # user wins
    assert ("X", "a=b") in values and ("WANDB_PROJECT", "p") in values
    assert "UNRELATED" not in [name for name, _ in values] and "WANDB_RUN_ID" not in [n for n, _ in values]
    assert spec["description"] == "my run" and spec["budget"] == "ai2/b"
    assert (first["arguments"], second["arguments"]) == (["python train.py"], ["python eval.py"])
    assert mason.build_spec(args, commands, mason.Account(), ids) == spec  # pure
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.gpus = 2  # type: ignore[misc]


def test_help_documents_every_option_of_open_instructs_mason(tmp_path):
    result = run_mason(["--help"], tmp_path)
    assert result.returncode == 0
    for option in OPEN_INSTRUCT_OPTIONS + ("--dry_run",):
        assert option in result.stdout, option
    assert "ray_node_setup.sh" in result.stdout and "NCCL_CUMEM_ENABLE" in result.stdout


# open-instruct's mason.py at the recorded commit, in lines: the launcher it replaces.
OPEN_INSTRUCT_MASON_LINES = 754


def test_the_launcher_is_no_larger_than_the_one_it_replaces():
    """Each option is declared once (a `MasonArgs` field); a launcher grown past open-instruct's is a sign that
    something is declared twice again."""
    files = [MASON, *(REPO / "open_instruct" / "launch").glob("*.py")]
    assert sum(len(path.read_text().splitlines()) for path in files) <= OPEN_INSTRUCT_MASON_LINES


TRAINER = ("python", "open_instruct/grpo_fast.py", "--output_dir", "/output", "--checkpoint_state_dir", "/tmp/s")


def prepared_spec(options: list[str], account, command=TRAINER, environ=None) -> dict:
    args = mason.parse_args([*options, "--", *command], environ=environ or {"PATH": "/local/bin"})
    ids = mason.LaunchIds("runid123", "17_42")
    prepared = [mason.rewrite_training(args, tokens, account, ids) for tokens in args.commands]
    return mason.build_spec(args, prepared, account, ids)


def trainer_words(spec: dict, task: int = 0) -> list[str]:
    return shlex.split(spec["tasks"][task]["arguments"][0])


def test_open_instructs_placement_and_mount_options_reach_the_spec():
    spec = prepared_spec(
        [
            "--cluster",
            "ai2/jupiter",
            "ai2/saturn",
            "--hostname",
            "h1",
            "h2",
            "--shared_memory",
            "64GiB",
            "--timeout",
            "2h30m",
            "--no-host-networking",
            "--mount_docker_socket",
            "--beaker_datasets",
            "/models:01ABC",
            "/data:01DEF",
            "--pure_docker_mode",
            "--task_name",
            "job",
        ],
        mason.Account("me", frozenset()),
    )
    (task,) = spec["tasks"]
    assert task["constraints"] == {"hostname": ["h1", "h2"]}  # hosts replace the clusters
    assert task["resources"]["sharedMemory"] == "64GiB" and task["timeout"] == "2h30m"
    assert task["hostNetworking"] is False
    assert task["datasets"] == [
        {"mountPath": "/weka/oe-adapt-default", "source": {"weka": "oe-adapt-default"}},
        {"mountPath": "/weka/oe-training-default", "source": {"weka": "oe-training-default"}},
        {"mountPath": "/var/run/docker.sock", "source": {"hostPath": "/var/run/docker.sock"}},
        {"mountPath": "/models", "source": {"beaker": "01ABC"}},
        {"mountPath": "/data", "source": {"beaker": "01DEF"}},
    ]
    env = {e["name"]: e["value"] for e in task["envVars"] if "value" in e}
    assert env["HF_HOME"].startswith("/weka/") and env["CHECKPOINT_OUTPUT_DIR"].endswith("/runid123")
    assert "NCCL_SOCKET_IFNAME" not in env and "PATH" not in env  # one node; the image's own PATH


def test_resumable_mode_and_weka_outputs_for_a_beaker_user():
    options = ["--cluster", "ai2/jupiter", "--num_nodes", "2", "--artifact_ttl", "1d"]
    spec = prepared_spec(options, mason.Account("me", frozenset()), environ={"PATH": "/p", "WANDB_TAGS": "a b"})
    words = trainer_words(spec)
    state = "/weka/oe-adapt-default/allennlp/deletable_checkpoint_states/me/17_42/tmp-1d"
    assert words[words.index("--checkpoint_state_dir") + 1] == state and words.count("--checkpoint_state_dir") == 1
    output = "/weka/oe-adapt-default/allennlp/deletable_checkpoint/me/tmp-1d/"
    assert words[words.index("--output_dir") + 1] == output and words.count("--output_dir") == 1
    env = {e["name"]: e["value"] for e in spec["tasks"][0]["envVars"] if "value" in e}
    assert env["WANDB_RUN_ID"] == "runid123" and env["WANDB_RESUME"] == "allow"
    assert env["NCCL_SOCKET_IFNAME"] == "ib" and env["PATH"] == "/p" and env["WANDB_TAGS"] == "a b"
    assert words[:3] == ["cd", mason.parse_args(["--cluster", "a/b", "--", "x"]).local_workdir, "&&"]

    # --non_resumable keeps the state directory and does not resume W&B; the outputs still go to Weka.
    spec = prepared_spec([*options, "--non_resumable"], mason.Account("me", frozenset()))
    words = trainer_words(spec)
    assert words[words.index("--checkpoint_state_dir") + 1] == "/tmp/s"
    assert words[words.index("--output_dir") + 1] == output
    assert "WANDB_RUN_ID" not in {e["name"] for e in spec["tasks"][0]["envVars"]}
    # A state directory already on Weka is the user's (continuing a run); '' turns the output prefix off.
    command = (*TRAINER, "--checkpoint_state_dir", "/weka/x/mine")
    spec = prepared_spec([*options, "--auto_output_dir_path", ""], mason.Account("me", frozenset()), command)
    words = trainer_words(spec)
    assert words[words.index("--checkpoint_state_dir", words.index("/tmp/s")) + 1] == "/weka/x/mine"
    assert words.count("--output_dir") == 1 and words[words.index("--output_dir") + 1] == "/output"


def test_an_external_users_command_keeps_its_directories():
    spec = prepared_spec(["--cluster", "ai2/jupiter"], mason.Account())
    words = trainer_words(spec)
    assert words[words.index("--output_dir") + 1] == "/output"
    assert words[words.index("--checkpoint_state_dir") + 1] == "/tmp/s"
    assert words[words.index("--hf_entity") + 1] == "allenai"  # open-instruct adds the entities for everyone


def test_several_commands_become_several_tasks_and_deprecated_options_only_warn(tmp_path):
    result = run_mason(
        [
            *VALID,
            "--dry_run",
            "--no_hf_cache_env",
            "--no_mount_nfs",
            "--gs_model_name",
            "m",
            "--task_name",
            "two",
            "--",
            "python",
            "prepare.py",
            "--",
            "python",
            "open_instruct/grpo_fast.py",
            "--seed",
            "3",
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    spec = yaml.safe_load(result.stdout)
    first, second = spec["tasks"]
    assert (first["name"], second["name"]) == ("two__0", "two__1")
    assert first["arguments"][0].endswith("&& python prepare.py")
    assert second["arguments"][0].endswith("--seed 3")
    for option in ("--no_hf_cache_env", "--no_mount_nfs", "--gs_model_name"):
        assert f"mason.py: warning: {option} is ignored" in result.stderr
