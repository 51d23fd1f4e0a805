"""The Beaker v2 experiment spec of a launch: one task per command, with the environment, secrets and
mounts open-instruct's mason.py gives its tasks (pure; the caller supplies the account and the ids)."""

from __future__ import annotations

import shlex
from typing import Any

import yaml

from open_instruct.launch.commands import Prepared, build_command, entry_segment
from open_instruct.launch.settings import AI2_ON_WEKA, Account, LaunchIds, MasonArgs

RESULT_PATH = "/output"  # Beaker keeps this directory as the experiment's result dataset
WEKA_BUCKETS = ("oe-adapt-default", "oe-training-default")
HF_CACHE_ON_WEKA = f"{AI2_ON_WEKA}/.cache"
DOCKER_SOCKET = "/var/run/docker.sock"
DEFAULT_ENV: dict[str, str] = {
    # open-instruct's defaults (torch.compile's cache is unreliable there, compiling itself is fine).
    "RAY_CGRAPH_get_timeout": "300",
    "VLLM_DISABLE_COMPILE_CACHE": "1",
    "NCCL_DEBUG": "ERROR",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
    # Ours. Python block-buffers stdout without a TTY: unbuffered, Beaker's live logs show the last line
    # before a hang.
    "PYTHONUNBUFFERED": "1",
    # NCCL's cuMem allocator makes the learner -> vLLM weight broadcast slow and can hang it
    # (vllm-project/vllm#5723).
    "NCCL_CUMEM_ENABLE": "0",
}
# Secrets a job commonly needs: exposed when the workspace holds `<user>_NAME` (preferred) or `NAME`.
USEFUL_SECRETS = (
    "HF_TOKEN",
    "WANDB_API_KEY",
    "BEAKER_TOKEN",
    "OPENAI_API_KEY",
    "AZURE_API_KEY",
    "AZURE_API_BASE",
    "ANTHROPIC_API_KEY",
    "SLACK_WEBHOOK_URL",
)


def image_spec(image: str) -> dict[str, str]:
    for kind in ("beaker", "docker"):
        if image.startswith(f"{kind}://"):
            return {kind: image.removeprefix(f"{kind}://")}
    first = image.split("/", 1)[0]
    looks_like_docker = ":" in image or "@" in image or ("/" in image and ("." in first or first == "localhost"))
    return {"docker": image} if looks_like_docker else {"beaker": image}


def env_vars(args: MasonArgs, account: Account, ids: LaunchIds) -> list[dict[str, str]]:
    """The task's environment, each name once: what mason adds (defaults, W&B pass-through, Weka caches,
    resumption, the workspace's useful secrets) unless the user's --env or --secret names it."""
    added: dict[str, str] = {**DEFAULT_ENV, **dict(args.wandb_env)}
    if not args.pure_docker_mode:
        added["PATH"] = args.local_path  # the local interpreter's PATH, on the shared filesystem
    if args.on_weka:
        added["HF_HOME"] = f"{HF_CACHE_ON_WEKA}/huggingface"
        added["HF_DATASETS_CACHE"] = f"{HF_CACHE_ON_WEKA}/huggingface"
        added["HF_HUB_CACHE"] = f"{HF_CACHE_ON_WEKA}/hub"
        added["CHECKPOINT_OUTPUT_DIR"] = f"{args.auto_checkpoint_state_dir.rstrip('/')}/{ids.wandb_run_id}"
        if args.num_nodes > 1:  # NCCL over the InfiniBand interfaces, not the bonded Ethernet one
            added.update({"NCCL_SOCKET_IFNAME": "ib", "NCCL_IB_HCA": "^=mlx5_bond_0"})
    if args.resumable and any(entry_segment(command) for command in args.commands):
        added.update({"WANDB_RUN_ID": ids.wandb_run_id, "WANDB_RESUME": "allow"})
    named = {name for name, _ in args.env} | {name for name, _ in args.secrets}
    values = {**{name: value for name, value in added.items() if name not in named}, **dict(args.env)}
    entries = [{"name": name, "value": value} for name, value in values.items()]
    entries += [{"name": name, "secret": secret} for name, secret in args.secrets]
    for name in USEFUL_SECRETS:
        found = [secret for secret in (f"{account.user}_{name}", name) if secret in account.secret_names]
        if found and name not in named and name not in values:
            entries.append({"name": name, "secret": found[0]})
    return entries


def build_spec(args: MasonArgs, commands: list[Prepared], account: Account, ids: LaunchIds) -> dict[str, Any]:
    """The Beaker v2 experiment spec (a plain dict, ready for YAML) for prepared commands."""
    environment = env_vars(args, account, ids)
    cd = "" if args.pure_docker_mode else f"cd {shlex.quote(args.local_workdir)} && "
    tasks = []
    for index, prepared in enumerate(commands):
        task: dict[str, Any] = {"name": f"{args.task_name}__{index}", "replicas": args.num_nodes}
        if args.num_nodes > 1:
            # Replica 0 leads (its hostname is BEAKER_LEADER_REPLICA_HOSTNAME on every replica); one replica
            # failing or preempted takes the group down: a Ray cluster missing a node cannot continue.
            task |= {"leaderSelection": True, "propagateFailure": True, "propagatePreemption": True}
        task |= {
            "hostNetworking": args.host_networking,
            "image": image_spec(args.image),
            "command": ["/bin/bash", "-c"],
            "arguments": [cd + build_command(prepared.tokens)],
            "envVars": environment,
            "datasets": mounts(args),
            "result": {"path": RESULT_PATH},
            "resources": {"gpuCount": args.gpus, "sharedMemory": args.shared_memory},
            "context": {"priority": args.priority, "preemptible": args.preemptible},
            "constraints": {"hostname": list(args.hostnames)} if args.hostnames else {"cluster": list(args.clusters)},
        }
        if args.timeout:
            task["timeout"] = args.timeout
        tasks.append(task)
    spec: dict[str, Any] = {"version": "v2", "description": args.description}
    if args.budget:
        spec["budget"] = args.budget
    return spec | {"tasks": tasks, "retry": {"allowedTaskRetries": args.max_retries}}


def mounts(args: MasonArgs) -> list[dict[str, Any]]:
    found = []
    if args.on_weka:
        found += [{"mountPath": f"/weka/{bucket}", "source": {"weka": bucket}} for bucket in WEKA_BUCKETS]
    if args.mount_docker_socket:
        found.append({"mountPath": DOCKER_SOCKET, "source": {"hostPath": DOCKER_SOCKET}})
    return found + [{"mountPath": path, "source": {"beaker": dataset}} for path, dataset in args.beaker_datasets]


def spec_to_yaml(spec: dict[str, Any]) -> str:
    # Wide lines: the long command stays on one line, easy to grep and copy.
    return yaml.safe_dump(spec, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1 << 16)
