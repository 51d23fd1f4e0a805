"""A launch's settings, each of mason.py's options declared once as a field of `MasonArgs` (its flag, check and
help with it; the parser is built from the fields and read back into them), and the facts about Ai2's clusters
that open-instruct's mason.py encodes (the recorded commit's lists)."""

from __future__ import annotations

import argparse
import re
import secrets
import string
import time
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from open_instruct.config.fields import NO_EFFECT, arg, moved_flags, rendered_help

TRAINING_ENTRY = "open_instruct/grpo_fast.py"
EXTERNAL_USER = "external_user"  # open-instruct's name for someone without Beaker credentials
RUN_ID_ALPHABET = string.ascii_lowercase + string.digits  # open-instruct's W&B run ids: 8 of these
# Clusters that mount Weka, and those with a fast interconnect between nodes (a multi-node job elsewhere
# runs, slowly).
WEKA_CLUSTERS = (
    "ai2/jupiter",
    "ai2/saturn",
    "ai2/titan",
    "ai2/neptune",
    "ai2/ceres",
    "ai2/triton",
    "ai2/rhea",
    "ai2/prometheus",
    "ai2/holmes",
)
INTERCONNECT_CLUSTERS = ("ai2/jupiter", "ai2/ceres", "ai2/titan", "ai2/holmes")
AI2_ON_WEKA = "/weka/oe-adapt-default/allennlp"  # the Hugging Face caches and the automatic directories
MAX_GPUS_PER_NODE = 8
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"  # a Beaker name: an org, a cluster, a workspace, a secret, a task
_ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
DEPRECATED = "open-instruct marks it deprecated; it does nothing"

# Value checks are argparse `type=` callables and a number's `bounds` (checked once parsed, as the trainer's
# are), so every error names its option and exits with status 2.


def matching(pattern: str, expected: str):
    def check(value: str) -> str:
        if not re.fullmatch(pattern, value.strip()):
            raise argparse.ArgumentTypeError(f"{value!r} is not {expected}")
        return value.strip()

    return check


def pair(separator: str, key: str, value: str, form: str):
    """KEY<separator>VALUE, split at the first separator, each side matching its pattern."""

    def check(text: str) -> tuple[str, str]:
        left, sep, right = text.partition(separator)
        if not sep or not re.fullmatch(key, left) or not re.fullmatch(value, right):
            raise argparse.ArgumentTypeError(f"{text!r} is not {form}")
        return left, right

    return check


def non_empty(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value


org_name = matching(f"{_NAME}/{_NAME}", "of the form org/name (e.g. ai2/jupiter)")
beaker_name = matching(_NAME, "made of letters, digits, '.', '_' and '-'")
memory_size = matching(r"(?i)\d+(\.\d+)?\s*([KMGT]i?B?|B)?", "a size like 10.24gb or 64GiB")
duration = matching(r"(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+", "a duration like 15m, 2h or 2h30m")
dataset_mount = pair(":", "/[^:]*", "[^:]+", "MOUNT_PATH:DATASET_ID (e.g. /models:01HQXGAYGCS6D4)")
env_pair = pair("=", _ENV_NAME, "(?s).*", "KEY=VALUE (KEY an environment variable name)")
secret_pair = pair("=", _ENV_NAME, _NAME, "ENV_VAR=SECRET_NAME (the name of a secret stored in the Beaker workspace)")


@dataclass(frozen=True)
class MasonArgs:
    """mason.py's options (docs/multi_node.md has each one's default and its place in the spec), then what
    parse_args captures beside them. A list option's values are a tuple of the distinct ones, first occurrence
    first."""

    clusters: tuple[str, ...] = arg(
        MISSING,
        "Beaker clusters to run on.",
        flag="--cluster",
        type=org_name,
        nargs="+",
        action="extend",
        metavar="ORG/NAME",
    )
    hostnames: tuple[str, ...] = arg(
        (),
        "Beaker hosts to run on, instead of the clusters.",
        flag="--hostname",
        type=non_empty,
        nargs="+",
        action="extend",
    )
    image: str = arg(
        "ai2/cuda11.8-cudnn8-dev-ubuntu20.04",
        "A Beaker image, or a Docker reference (a ':' tag or a registry host); beaker:// or docker:// forces one.",
        type=non_empty,
    )
    pure_docker_mode: bool = arg(False, "Run in the image's working directory, not `cd` here with this PATH.")
    workspace: str | None = arg(None, "Beaker workspace. Default: yours.", type=org_name)
    budget: str | None = arg(None, "Beaker budget. Default: the workspace's.", type=org_name)
    priority: str = arg("normal", "Job priority.", choices=("low", "normal", "high", "urgent"))
    preemptible: bool = arg(False, "Allow Beaker to preempt the job.")
    num_nodes: int = arg(1, "Nodes: Beaker replicas of each task.", type=int, bounds=">= 1")
    max_retries: int = arg(0, "Beaker's task retries.", type=int, bounds=">= 0")
    gpus: int = arg(0, "GPUs per node.", type=int, bounds=f"[0, {MAX_GPUS_PER_NODE}]")
    shared_memory: str = arg("10.24gb", "Size of /dev/shm (Ray's object store, NCCL buffers).", type=memory_size)
    timeout: str | None = arg(None, "Beaker stops the task after this long. Default: no limit.", type=duration)
    host_networking: bool = arg(True, "Give the task its own network namespace.", flag="--no-host-networking")
    description: str = arg("Beaker-Mason job.", "Experiment description. Default: $RUN_NAME, else %(default)r.")
    task_name: str = arg("beaker_mason", "Base name of the Beaker tasks: NAME__0, NAME__1, ...", type=beaker_name)
    dry_run: bool = arg(False, "Print the spec and every step mason would take, taking none.")
    mount_docker_socket: bool = arg(False, "Mount the host's /var/run/docker.sock (Docker in Docker).")
    beaker_datasets: tuple[tuple[str, str], ...] = arg(  # (mount path, dataset id)
        (), "Beaker datasets to mount.", type=dataset_mount, nargs="*", metavar="MOUNT_PATH:ID"
    )
    env: tuple[tuple[str, str], ...] = arg(
        (), "An environment variable of the task; repeatable.", type=env_pair, action="append", metavar="KEY=VALUE"
    )
    # (variable, secret name): a secret enters the spec by its name only.
    secrets: tuple[tuple[str, str], ...] = arg(
        (),
        "The workspace secret SECRET_NAME as the variable ENV; repeatable.",
        flag="--secret",
        type=secret_pair,
        action="append",
        metavar="ENV=SECRET_NAME",
    )
    resumable: bool = arg(True, "No resumable state directory or W&B resume.", flag="--non_resumable")
    auto_dataset_cache: bool = arg(True, "Do not tokenize the datasets here first.", flag="--no_auto_dataset_cache")
    auto_output_dir_path: str = arg(
        f"{AI2_ON_WEKA}/deletable_checkpoint", "On Weka, --output_dir becomes PATH/USER/ ('' keeps yours)."
    )
    auto_checkpoint_state_dir: str = arg(
        f"{AI2_ON_WEKA}/deletable_checkpoint_states", "Resumable state goes to PATH/USER/<time>_<n> ('' keeps yours)."
    )
    artifact_ttl: str | None = arg(None, "Append tmp-TTL (e.g. 1d) to the automatic directories.", type=non_empty)
    # Options open-instruct's mason.py accepted once and now ignores (a warning says so).
    no_hf_cache_env: bool = arg(False, kind=NO_EFFECT, reason=DEPRECATED)
    no_mount_nfs: bool = arg(False, kind=NO_EFFECT, reason=DEPRECATED)
    gs_model_name: str | None = arg(
        None, kind=NO_EFFECT, reason="it named a model uploaded to Google Cloud Storage for the retired Augusta cluster"
    )
    commands: tuple[tuple[str, ...], ...] = ()  # one per `--` group, argv tokens as the local shell passed them
    # The local directory, PATH and W&B settings, captured at parse time so the spec stays pure.
    local_workdir: str = ""
    local_path: str = ""
    wandb_env: tuple[tuple[str, str], ...] = ()

    @property
    def on_weka(self) -> bool:
        """Every cluster mounts Weka, so the task may rely on it."""
        return all(cluster in WEKA_CLUSTERS for cluster in self.clusters)

    def warnings(self) -> list[str]:
        notes = [f"--{name} is ignored: {why}" for name, _, why in moved_flags(self, NO_EFFECT)]
        words = [token for command in self.commands for token in command]
        if self.num_nodes > 1 and not any("ray_node_setup.sh" in word for word in words):
            notes.append(
                f"--num_nodes {self.num_nodes} but no command sources ray_node_setup.sh: every replica runs the "
                "whole command on its own"
            )
        if self.num_nodes > 1 and not self.host_networking:
            notes.append("--no-host-networking with --num_nodes > 1: the nodes cannot reach each other's Ray and NCCL")
        if self.num_nodes > 1 and not all(cluster in INTERCONNECT_CLUSTERS for cluster in self.clusters):
            notes.append(
                "a multi-node job on a cluster without a fast interconnect (those with one: "
                f"{', '.join(INTERCONNECT_CLUSTERS)})"
            )
        names = {name for name, _ in self.env} | {name for name, _ in self.secrets}
        if "--with_tracking" in words and "WANDB_API_KEY" not in names:
            notes.append(
                "--with_tracking: the job needs WANDB_API_KEY (--secret WANDB_API_KEY=<secret name>, or a workspace "
                "secret named <user>_WANDB_API_KEY or WANDB_API_KEY)"
            )
        return notes

    @classmethod
    def add_options(cls, parser: argparse.ArgumentParser) -> None:
        """Every option (a field with help) on `parser`, its default in its help. As HfArgumentParser reads the
        trainer's flags: a bool field is a switch that flips its default."""
        for setting in fields(cls):
            if "help" not in setting.metadata:
                continue
            ours = ("flag", "kind", "reason", "bounds")
            kwargs = {key: value for key, value in setting.metadata.items() if key not in ours}
            kwargs["help"] = rendered_help(setting)  # with its bounds, checked after parsing (`out_of_bounds`)
            if setting.metadata.get("kind") == NO_EFFECT:
                kwargs["help"] = f"Accepted and ignored: {setting.metadata['reason']}."
            if setting.default is MISSING:
                kwargs["required"] = True
            elif isinstance(setting.default, bool):
                kwargs["action"] = "store_false" if setting.default else "store_true"
            else:
                # A list option's tuple default as a list: argparse's append and extend actions add to it.
                kwargs["default"] = list(setting.default) if isinstance(setting.default, tuple) else setting.default
            # A value's default in --help (a flag's default is its absence, None's is said in words).
            if type(setting.default) in (str, int) and "%(default)" not in kwargs["help"]:
                kwargs["help"] += " Default: %(default)s."
            parser.add_argument(setting.metadata.get("flag", f"--{setting.name}"), dest=setting.name, **kwargs)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace, **rest: Any) -> MasonArgs:
        """The settings from parsed options (`rest`: the fields that are not options)."""
        lists = {name: tuple(dict.fromkeys(value)) for name, value in vars(ns).items() if isinstance(value, list)}
        return cls(**{**vars(ns), **lists}, **rest)


@dataclass(frozen=True)
class Account:
    """Who launches: the Beaker user and the names of the workspace's secrets (external: no credentials)."""

    user: str = EXTERNAL_USER
    secret_names: frozenset[str] = frozenset()

    @property
    def external(self) -> bool:
        return self.user == EXTERNAL_USER


@dataclass(frozen=True)
class LaunchIds:
    """What makes one launch unique: its W&B run id and its resumable state's directory name, new ones unless
    given. Fixed in the spec, so every Beaker retry of the launch resumes the same run from the same state."""

    wandb_run_id: str = field(default_factory=lambda: "".join(secrets.choice(RUN_ID_ALPHABET) for _ in range(8)))
    state_dir_name: str = field(default_factory=lambda: f"{int(time.time())}_{secrets.randbelow(1_000_000)}")
