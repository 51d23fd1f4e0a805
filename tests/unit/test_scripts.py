"""The launch scripts in scripts/ and configs/beaker_configs/: syntax, headers, dry runs and flags.

What: every shell script parses (`bash -n`); every scripts/*.sh is executable and says in its header what
it runs and on what hardware; the Beaker launchers (long_generations_experiment.sh, multi_node.sh) run with
DRY_RUN=1 and print one mason.py spec per run whose command calls grpo_fast.py with the right model; the
single-GPU launcher is run against a stub interpreter that records its argv; every grpo_fast flag written in
a script is an option of our parser, and the argv each launcher produces parses and validates.

Nothing here starts vLLM, Ray, DeepSpeed or a trainer, submits to Beaker or touches the network (the CPU
scripts run for real in tests/integration/test_cpu_scripts.py).
Run: `.venv/bin/pytest tests/unit/test_scripts.py` (a few seconds, CPU-light).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from open_instruct.config.core import build_parser, parse_config

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((REPO / "scripts").glob("*.sh"))
BEAKER_CONFIGS = sorted((REPO / "configs" / "beaker_configs").glob("*.sh"))
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# Scripts that launch grpo_fast.py (directly or through mason.py).
LAUNCHERS = ("long_generations_experiment.sh", "multi_node.sh", "single_gpu.sh", "single_node.sh", "slurm.sh")
SEED_MODELS = {
    "qwen2_5": ("hamishivi/qwen2_5_openthoughts2", "False"),
    "qwen3": ("hamishivi/qwen3_openthoughts2", "False"),
    "olmo2_lc": ("hamishivi/olmo2_lc_ot2", "True"),
}
SEED_MIXES = {
    "orz_only_mix": (
        "hamishivi/hamishivi_rlvr_orz_math_57k_collected_all_filtered_hamishivi_qwen2_5_openthoughts2 1.0"
    ),
    "integration_mix": (
        "hamishivi/saurabh5_rlvr_acecoder_all_filtered_qwen2_5_openthoughts2 10000 "
        "hamishivi/hamishivi_rlvr_orz_math_57k_collected_all_filtered_hamishivi_qwen2_5_openthoughts2 8500 "
        "hamishivi/tulu_3_rewritten_400k_string_f1_only_v2_all_filtered_qwen2_5_openthoughts2 10000 "
        "hamishivi/allenai_IF_multi_constraints_upto5_all_filtered_qwen2_5_openthoughts2 10000"
    ),
}

# Records its argv as one JSON line per call: stands in for `python` so nothing real starts.
STUB_PYTHON = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["ARGV_OUT"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
"""


# Variables the scripts read: a caller's own values must not leak into the runs checked here.
SCRIPT_ENV = (
    "BEAKER_TOKEN",
    "DRY_RUN",
    "MODELS",
    "MIXES",
    "MODEL",
    "CHAT_TEMPLATE",
    "ADD_BOS",
    "TRAIN_MIX",
    "EXP_NAME",
    "IMAGE",
    "CLUSTER",
    "WORKSPACE",
    "BUDGET",
    "PRIORITY",
    "WANDB_SECRET",
    "DATASET",
    "OUTPUT_DIR",
    "PYTHON",
    "OPEN_INSTRUCT_DIR",
    "SLURM_NNODES",
    "SLURM_SUBMIT_DIR",
    "VIRTUAL_ENV",
)


def run_script(name: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in SCRIPT_ENV}
    return subprocess.run(
        ["bash", f"scripts/{name}", *args],
        cwd=REPO,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


TEST_IMAGE = "me/open-instruct-integration-test-main-cuda13"


def dry_run_specs(name: str, env: dict[str, str], *args: str) -> list[dict]:
    result = run_script(name, {"DRY_RUN": "1", "PYTHON": sys.executable, "IMAGE": TEST_IMAGE, **env}, *args)
    assert result.returncode == 0, result.stderr
    assert "not submitting (--dry_run)" in result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


def trainer_argv(spec: dict) -> list[str]:
    """The grpo_fast.py arguments of a spec's `bash -c` command (after the last `&&`)."""
    (command,) = spec["tasks"][0]["arguments"]
    tokens = shlex.split(command)
    last_and = len(tokens) - 1 - tokens[::-1].index("&&")
    trainer = tokens[last_and + 1 :]
    assert trainer[:2] == ["python", "open_instruct/grpo_fast.py"], command
    assert tokens[: tokens.index("&&")] == ["source", "configs/beaker_configs/ray_node_setup.sh"]
    # What mason adds in front for a user without Beaker credentials (open-instruct's mason adds the same).
    assert trainer[2:6] == ["--hf_entity", "allenai", "--wandb_entity", "ai2-llm"], command
    return trainer[6:]


def value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def seed_argv(exp_name: str) -> list[str]:
    """The seed's grpo_fast arguments (tests/fixtures), with its shell variables for qwen2_5 / orz_only_mix."""
    text = "\n".join(
        line for line in (FIXTURES / "seed_grpo_fast_command.txt").read_text().splitlines() if not line.startswith("#")
    )
    variables = {
        "exp_name": exp_name,
        "split_value": SEED_MIXES["orz_only_mix"],
        "add_bos": "False",
        "model_name_or_path": "hamishivi/qwen2_5_openthoughts2",
        "chat_template_name": "tulu_thinker",
    }
    for name, val in variables.items():
        text = text.replace("${" + name + "}", val)
    return shlex.split(text.replace("\\\n", " "))[2:]


# ----------------------------------------------------------------------------- syntax and headers


@pytest.mark.parametrize("script", SCRIPTS + BEAKER_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shell_script_parses(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr


def test_the_experiment_scripts_exist():
    names = {p.name for p in SCRIPTS}
    assert {*LAUNCHERS, "benchmark_generation.sh"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_script_has_a_shebang_and_a_header_naming_the_hardware(script):
    lines = script.read_text().splitlines()
    assert lines[0].startswith("#!") and "bash" in lines[0], f"{script.name}: no bash shebang"
    header = lines[1:10]
    assert header and header[0].startswith("#"), f"{script.name}: no header comment after the shebang"
    assert any(line.startswith("#") and "Hardware:" in line for line in header), (
        f"{script.name}: the header (first 10 lines) must say on what hardware it runs ('Hardware: ...')"
    )
    assert "set -euo pipefail" in script.read_text(), f"{script.name}: missing set -euo pipefail"
    assert os.access(script, os.X_OK), f"{script.name} is not executable (chmod +x)"


# ----------------------------------------------------------------------------- Beaker launchers (dry runs)


def test_long_generations_experiment_prints_one_spec_per_model_and_mix():
    specs = dry_run_specs("long_generations_experiment.sh", {"MODELS": "qwen2_5 qwen3", "MIXES": "orz_only_mix"})
    assert len(specs) == 2
    for model, spec in zip(("qwen2_5", "qwen3"), specs):
        argv = trainer_argv(spec)
        path, add_bos = SEED_MODELS[model]
        assert value(argv, "--model_name_or_path") == path
        assert value(argv, "--add_bos") == add_bos
        assert value(argv, "--exp_name").startswith(f"2606rl_update_fil_dapo_pol_{model}_orz_only_mix_")
        assert spec["description"] == value(argv, "--exp_name")
        (task,) = spec["tasks"]
        assert task["replicas"] == 6 and task["resources"]["gpuCount"] == 8
        assert task["context"] == {"priority": "high", "preemptible": True}
        assert {"name": "VLLM_ALLOW_LONG_MAX_MODEL_LEN", "value": "1"} in task["envVars"]
        assert "source configs/beaker_configs/code_api_setup.sh" in task["arguments"][0]
        assert parse_config(argv).model.model_name_or_path == path  # values validate too
    # qwen2_5 / orz_only_mix is exactly the seed's command, token for token (the run name aside).
    argv = trainer_argv(specs[0])
    assert argv == seed_argv(value(argv, "--exp_name"))


def test_long_generations_experiment_other_models_and_mixes():
    specs = dry_run_specs(
        "long_generations_experiment.sh", {"MODELS": "olmo2_lc", "MIXES": "integration_mix orz_only_mix"}
    )
    assert len(specs) == 2
    for mix, spec in zip(("integration_mix", "orz_only_mix"), specs):
        argv = trainer_argv(spec)
        assert value(argv, "--model_name_or_path") == "hamishivi/olmo2_lc_ot2"
        assert value(argv, "--add_bos") == "True"
        start = argv.index("--dataset_mixer_list") + 1
        assert argv[start : argv.index("--dataset_mixer_list_splits")] == SEED_MIXES[mix].split()


def test_long_generations_experiment_defaults_and_unknown_names():
    (spec,) = dry_run_specs("long_generations_experiment.sh", {})  # MODELS=qwen2_5, MIXES=orz_only_mix
    assert value(trainer_argv(spec), "--model_name_or_path") == "hamishivi/qwen2_5_openthoughts2"
    for env, word in (({"MODELS": "llama"}, "llama"), ({"MIXES": "logic_mix"}, "logic_mix")):
        result = run_script(
            "long_generations_experiment.sh", {"DRY_RUN": "1", "PYTHON": sys.executable, "IMAGE": TEST_IMAGE, **env}
        )
        assert result.returncode == 2 and word in result.stderr and result.stdout.strip() in ("", "---")


def test_multi_node_prints_a_two_node_spec():
    (spec,) = dry_run_specs("multi_node.sh", {"MODEL": "Qwen/Qwen2.5-7B"}, "--seed", "7")
    (task,) = spec["tasks"]
    assert task["replicas"] == 2 and task["resources"]["gpuCount"] == 8
    argv = trainer_argv(spec)
    assert value(argv, "--model_name_or_path") == "Qwen/Qwen2.5-7B"
    assert argv[-2:] == ["--seed", "7"]  # extra arguments reach grpo_fast.py, last (they win)
    cfg = parse_config(argv)
    # 8 learners on one node, 8 single-GPU engines on the other: 16 GPUs.
    assert cfg.world_size == 8 and cfg.generation.vllm_num_engines * cfg.generation.vllm_tensor_parallel_size == 8
    assert cfg.world_size + cfg.generation.vllm_num_engines <= 2 * 8
    assert "--with_tracking" not in argv  # only with WANDB_SECRET

    (spec,) = dry_run_specs("multi_node.sh", {"WANDB_SECRET": "me_WANDB_API_KEY"})
    assert {"name": "WANDB_API_KEY", "secret": "me_WANDB_API_KEY"} in spec["tasks"][0]["envVars"]
    argv = trainer_argv(spec)
    assert "--with_tracking" in argv
    assert parse_config(argv).run.with_tracking is True
    assert value(argv, "--model_name_or_path") == "hamishivi/qwen2_5_openthoughts2"


@pytest.mark.parametrize("name", ("multi_node.sh", "long_generations_experiment.sh"))
def test_the_beaker_launchers_take_the_image_as_their_first_argument_or_from_IMAGE_and_have_no_default(name):
    # As build_image_and_launch.sh passes it: the image first, then grpo_fast flags.
    specs = dry_run_specs(name, {"IMAGE": ""}, "alice/built-here", "--seed", "5")
    for spec in specs:
        assert [task["image"] for task in spec["tasks"]] == [{"beaker": "alice/built-here"}]
        assert trainer_argv(spec)[-2:] == ["--seed", "5"]
    # $1 wins over IMAGE; IMAGE alone works.
    (spec, *_) = dry_run_specs(name, {"IMAGE": "bob/other"}, "alice/built-here")
    assert spec["tasks"][0]["image"] == {"beaker": "alice/built-here"}
    (spec, *_) = dry_run_specs(name, {"IMAGE": "bob/other"}, "--seed", "5")
    assert spec["tasks"][0]["image"] == {"beaker": "bob/other"}
    missing = run_script(name, {"DRY_RUN": "1", "PYTHON": sys.executable})
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.count("\n") == 1 and missing.stderr.startswith(f"{name}: no image: give the Beaker image")
    assert f"build_image_and_launch.sh scripts/{name}" in missing.stderr


def test_no_launch_script_names_open_instructs_image():
    for script in [*SCRIPTS, *sorted((REPO / "scripts" / "train").glob("*.sh")), *BEAKER_CONFIGS]:
        assert "hamishivi/open_instruct" not in script.read_text(), script


# ----------------------------------------------------------------------------- single GPU and benchmark


def test_single_gpu_runs_grpo_fast_with_one_engine_and_one_learner(tmp_path):
    stub = tmp_path / "python"
    stub.write_text(STUB_PYTHON)
    stub.chmod(0o755)
    out = tmp_path / "argv.jsonl"
    result = run_script("single_gpu.sh", {"PYTHON": str(stub), "ARGV_OUT": str(out)}, "--seed", "3")
    assert result.returncode == 0, result.stderr
    (argv,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert argv[0] == "open_instruct/grpo_fast.py"
    argv = argv[1:]
    assert value(argv, "--model_name_or_path") == "Qwen/Qwen2.5-0.5B"
    assert argv[-2:] == ["--seed", "3"]
    cfg = parse_config(argv)
    assert cfg.generation.vllm_num_engines == 1 and cfg.learner.num_learners_per_node == [1]
    assert cfg.learner.single_gpu_mode  # one GPU for both: shared placement, CUDA-IPC transport
    assert cfg.generation.response_length == 1024
    assert not cfg.uses_embedded_default

    out.unlink()
    run_script("single_gpu.sh", {"PYTHON": str(stub), "ARGV_OUT": str(out), "MODEL": "/models/mine"})
    (argv,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert value(argv, "--model_name_or_path") == "/models/mine"


def test_single_node_runs_grpo_fast_with_4_learners_and_4_engines_on_8_gpus(tmp_path):
    from open_instruct.preflight import _resources

    stub = tmp_path / "python"
    stub.write_text(STUB_PYTHON)
    stub.chmod(0o755)
    out = tmp_path / "argv.jsonl"
    result = run_script("single_node.sh", {"PYTHON": str(stub), "ARGV_OUT": str(out)}, "--seed", "3")
    assert result.returncode == 0, result.stderr
    (argv,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert argv[0] == "open_instruct/grpo_fast.py" and argv[-2:] == ["--seed", "3"]
    cfg = parse_config(argv[1:])
    assert cfg.learner.num_learners_per_node == [4] and not cfg.learner.single_gpu_mode
    assert cfg.generation.vllm_num_engines == 4 and cfg.generation.vllm_tensor_parallel_size == 1
    detail, _ = _resources(cfg)  # the placement rules accept it on one node of 8
    assert detail.startswith("4 learners (4 per node) + 4 engines x tp 1 = 8 GPUs on >= 1 node(s) of 8"), detail
    header = (REPO / "scripts" / "single_node.sh").read_text().split("set -euo pipefail")[0]
    assert "4 DeepSpeed learners (ZeRO-2) + 4 vLLM engines" in header and "tensor parallel 1" in header


def test_slurm_script_outside_a_job_or_the_repository_is_one_line(tmp_path):
    outside = run_script("slurm.sh", {"SLURM_SUBMIT_DIR": str(REPO)})
    assert outside.returncode == 2 and outside.stderr.strip() == (
        "slurm.sh: not inside a Slurm job (no SLURM_NNODES): submit it with sbatch"
    )
    elsewhere = run_script("slurm.sh", {"SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_NNODES": "2"})
    assert elsewhere.returncode == 2 and "is not this repository" in elsewhere.stderr
    # sbatch reads its options from the #SBATCH lines: one task per node, 8 GPUs each, 2 nodes.
    text = (REPO / "scripts" / "slurm.sh").read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8"):
        assert line in text.splitlines()


def test_benchmark_script_runs_the_benchmark_module_after_setting_up_the_venv(capsys):
    text = (REPO / "scripts" / "benchmark_generation.sh").read_text()
    body = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert "bash scripts/setup_env.sh" in body
    assert body[-1] == 'exec .venv/bin/python -m benchmarks.generation "$@"'
    # The flags its header advertises are the module's own (--help exits before anything starts).
    from benchmarks import generation as benchmark_generation

    with pytest.raises(SystemExit) as exit_info:
        benchmark_generation.main(["--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    advertised = set(re.findall(r"--\w+", "\n".join(line for line in text.splitlines() if line.startswith("#"))))
    assert advertised and all(flag in help_text for flag in advertised), advertised


# ----------------------------------------------------------------------------- grpo_fast flags


def grpo_fast_flags(script: Path) -> list[str]:
    """Every `--flag` written after `grpo_fast.py` in a script (comments, "$@" and Python here-documents
    excluded)."""
    shell = re.sub(r"<<'PY'.*?\nPY\n", "\n", script.read_text(), flags=re.DOTALL)
    code = "\n".join(line.split(" #")[0] for line in shell.splitlines() if not line.lstrip().startswith("#"))
    after = code[code.index("grpo_fast.py") + len("grpo_fast.py") :]
    return re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", after)


@pytest.mark.parametrize("name", LAUNCHERS)
def test_every_grpo_fast_flag_in_the_scripts_is_known(name):
    known = {opt for action in build_parser()._actions for opt in action.option_strings}
    flags = grpo_fast_flags(REPO / "scripts" / name)
    assert "--model_name_or_path" in flags and "--response_length" in flags  # the extraction found them
    unknown = sorted(set(flags) - known)
    assert not unknown, f"scripts/{name}: flags grpo_fast.py does not accept: {unknown}"


def test_gpu_check_trains_with_flags_grpo_fast_accepts():
    """scripts/gpu_check.sh needs a GPU to run; here its training command is checked against our parser."""
    known = {opt for action in build_parser()._actions for opt in action.option_strings}
    script = REPO / "scripts" / "gpu_check.sh"
    # Its training parts share `train_flags=(...)`, defined before the first grpo_fast.py command.
    shared = re.search(r"^train_flags=\((.*?)\)$", script.read_text(), re.MULTILINE | re.DOTALL).group(1)
    flags = grpo_fast_flags(script) + re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", shared)
    assert {"--dtype", "--vllm_sync_backend", "--inflight_updates", "--single_gpu_mode"} <= set(flags)
    assert {"--inflight_update_kv", "--checkpoint_state_dir", "--vllm_num_engines"} <= set(flags)
    assert not sorted(set(flags) - known)


def gpu_check_dry_run(tmp_path: Path, python: str) -> tuple[subprocess.CompletedProcess, dict[str, tuple[str, str]]]:
    base = {k: v for k, v in os.environ.items() if k not in SCRIPT_ENV + ("CHECK_ONLY", "GPU_VENV", "WARMUP_S")}
    result = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry_run"],
        cwd=REPO,
        env={**base, "PYTHON": python, "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [line.split(None, 2) for line in result.stdout.splitlines() if not line.startswith("gpu_check:")]
    return result, {name: (status, detail) for name, status, detail in lines}


def test_gpu_check_dry_run_runs_the_cpu_parts_and_names_the_gpus_each_gpu_part_needs(tmp_path, model_path):
    """`gpu_check.sh --dry_run` on a CPU machine with the stack: the interpreter, compiler, imports and the
    embedded model are checked for real (as a fresh GPU machine would before its timed parts); every part
    that needs a GPU is SKIP with how many, and nothing fails."""
    result, parts = gpu_check_dry_run(tmp_path, sys.executable)
    assert result.returncode == 0, result.stdout + result.stderr
    assert parts["python"][0] == "PASS" and parts["install"][0] == "PASS" and parts["model"][0] == "PASS", parts
    assert parts["compiler"][0] in ("PASS", "SKIP") and parts["driver"][0] in ("PASS", "SKIP")
    need = {"env": 1, "optimizer": 1, "single_gpu": 1, "train_nccl": 2, "train_gloo": 2, "transfer_failure": 1}
    need |= {"two_learners": 3, "weights_loaded": 1, "engine_killed": 3, "zero3_memory": 1}
    for name, gpus in need.items():
        assert parts[name] == ("SKIP", parts[name][1]) and parts[name][1].startswith(f"needs {gpus} GPU"), parts
    names = list(parts)
    gpu_parts = names[names.index("model") + 1 :]
    assert set(need) <= set(gpu_parts) and all(parts[n][0] == "SKIP" for n in gpu_parts), parts


def test_gpu_check_dry_run_without_the_stack_says_how_a_full_run_installs_it(tmp_path):
    """An interpreter without vllm/ray/deepspeed (the base Python of our venv): the install is SKIP with the
    exact command a full run executes, the model build waits for it, the GPU parts still list their needs."""
    base_python = Path(sys.base_prefix) / "bin" / "python3"
    probe = subprocess.run([str(base_python), "-c", "import vllm"], capture_output=True, check=False)
    if probe.returncode == 0:
        pytest.skip("the base interpreter has vllm: no interpreter without the stack here")
    result, parts = gpu_check_dry_run(tmp_path, str(base_python))
    assert result.returncode == 0, result.stdout + result.stderr
    status, detail = parts["install"]
    assert status == "SKIP" and "-m venv --system-site-packages" in detail
    assert detail.endswith("/python bash scripts/install_locked.sh gpu-cu13")  # the locked GPU stack
    assert parts["model"][0] == "SKIP" and parts["single_gpu"][1].startswith("needs 1 GPU")


def test_cuda_ipc_check_says_in_one_line_that_it_needs_cuda_and_its_loss_comparison_runs_on_any_device():
    """scripts/cuda_ipc_check.py (the GPU check that needs torch alone) on a CPU machine: one line and exit
    status 2, not a traceback; its CPU-vs-device loss comparison runs end to end with the CPU as both."""
    result = subprocess.run(
        [sys.executable, "scripts/cuda_ipc_check.py"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and result.stderr.strip() == "cuda_ipc_check: no CUDA device visible to torch"
    from scripts import cuda_ipc_check

    ok, detail = cuda_ipc_check.check_loss("cpu", "cpu")
    assert ok and detail.startswith("11 outputs"), detail


def test_gpu_check_stack_check_imports_the_package_the_way_the_trainer_does(tmp_path):
    """An interpreter that has vllm, ray and deepspeed but imports open_instruct only from the working directory
    (here: our venv with its editable install hidden) passes `python -c 'import open_instruct'` at the repo root,
    yet `python open_instruct/grpo_fast.py` could not import the package: the stack check must not pass it."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in getattr(f, '__module__', '').lower()]\n"
        "sys.path[:] = [p for p in sys.path if '__editable__' not in p]\n"
    )
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/bash\nPYTHONPATH={hide} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    at_root = subprocess.run([str(wrapper), "-c", "import open_instruct"], cwd=REPO, capture_output=True, check=False)
    assert at_root.returncode == 0, at_root.stderr  # what the old check ran, and passed
    result, parts = gpu_check_dry_run(tmp_path / "out", str(wrapper))
    assert result.returncode == 0, result.stdout + result.stderr
    assert parts["install"][0] == "SKIP" and "lacks the GPU stack" in parts["install"][1], parts
    assert "checks: " in parts["train_nccl"][1] and "rho_mean" in parts["train_nccl"][1]


def test_gpu_check_does_not_take_the_cpu_venv_for_the_gpu_stack_on_a_machine_with_gpus(tmp_path):
    """With GPUs visible (a stand-in nvidia-smi), our CPU environment imports vllm, ray and deepspeed but holds a
    CPU torch: the install part says it lacks the GPU stack and names the locked install, instead of running
    the GPU parts on the CPU build."""
    from helpers import fake_nvidia_smi

    smi = fake_nvidia_smi.install(tmp_path / "smi")
    base = {k: v for k, v in os.environ.items() if k not in SCRIPT_ENV + ("CHECK_ONLY", "GPU_VENV", "WARMUP_S")}
    result = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry_run"],
        cwd=REPO,
        env={**base, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), "PATH": f"{smi}:{base['PATH']}"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [line.split(None, 2) for line in result.stdout.splitlines() if not line.startswith("gpu_check:")]
    parts = {name: (status, detail) for name, status, detail in lines}
    assert parts["driver"][0] == "PASS" and "driver 580.65.06, CUDA 13.0" in parts["driver"][1], parts
    status, detail = parts["install"]
    assert status == "SKIP" and "lacks the GPU stack" in detail and "install_locked.sh gpu-cu13" in detail, parts
