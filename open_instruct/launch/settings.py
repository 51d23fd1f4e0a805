"""A launch's settings, each of mason.py's options declared once as a field of `MasonArgs` (its flag, check and
help with it: `add_options` builds the parser from them, `from_namespace` the settings), and the facts about
Ai2's clusters that open-instruct's mason.py encodes (the recorded commit's lists)."""

from __future__ import annotations

import argparse
import re
import secrets
import string
import time
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

TRAINING_ENTRY = "open_instruct/grpo_fast.py"
EXTERNAL_USER = "external_user"  # open-instruct's name for someone without Beaker credentials
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
MAX_GPUS_PER_NODE = 8
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"  # a Beaker name: an org, a cluster, a workspace, a secret, a task
_ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"

# Value checks are argparse `type=` callables, so every error names its option and exits with status 2.


def matching(pattern: str, expected: str):
    def check(value: str) -> str:
        if not re.fullmatch(pattern, value.strip()):
            raise argparse.ArgumentTypeError(f"{value!r} is not {expected}")
        return value.strip()

    return check


org_name = matching(f"{_NAME}/{_NAME}", "of the form org/name (e.g. ai2/jupiter)")


def int_in_range(low: int, high: int | None = None):
    def check(value: str) -> int:
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer {bound}") from None
        if number < low or (high is not None and number > high):
            raise argparse.ArgumentTypeError(f"{number} is out of range: must be {bound}")
        return number

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


def option(default: Any = MISSING, help: str = "", *, flag: str = "", **argparse_kwargs):
    """A `MasonArgs` field that is one of mason.py's options: its flag (`--<field name>` unless `flag` says
    otherwise), its argparse arguments and help. A list option's values become a tuple of the distinct ones,
    first occurrence first."""
    return field(default=default, metadata={"flag": flag, "argparse": {"help": help, **argparse_kwargs}})


def add_options(parser: argparse.ArgumentParser) -> None:
    """Every option of `MasonArgs` on `parser`, with its default in its help."""
    for setting in fields(MasonArgs):
        if "flag" not in setting.metadata:
            continue
        kwargs = dict(setting.metadata["argparse"])
        if setting.default is MISSING:
            kwargs["required"] = True
        else:
            # A list option's tuple default as a list: argparse's append and extend actions add to it.
            kwargs["default"] = list(setting.default) if isinstance(setting.default, tuple) else setting.default
        # A value's default in --help (a flag's default is its absence, None's is said in words).
        if type(setting.default) in (str, int) and "%(default)" not in kwargs["help"]:
            kwargs["help"] += " Default: %(default)s."
        flag = setting.metadata["flag"] or f"--{setting.name}"
        parser.add_argument(flag, dest=setting.name, **kwargs)


def from_namespace(ns: argparse.Namespace, **rest: Any) -> MasonArgs:
    """The settings from parsed options (`rest`: the fields that are not options)."""
    values = {}
    for setting in fields(MasonArgs):
        if "flag" in setting.metadata:
            value = getattr(ns, setting.name)
            values[setting.name] = tuple(dict.fromkeys(value)) if isinstance(value, list) else value
    return MasonArgs(**values, **rest)


@dataclass(frozen=True)
class MasonArgs:
    """mason.py's options (docs/multi_node.md has each one's default and its place in the spec), then what
    parse_args captures beside them."""

    clusters: tuple[str, ...] = option(
        help="Beaker clusters to run on.",
        flag="--cluster",
        type=org_name,
        nargs="+",
        action="extend",
        metavar="ORG/NAME",
    )
    hostnames: tuple[str, ...] = option(
        (),
        "Beaker hosts to run on, instead of the clusters.",
        flag="--hostname",
        type=non_empty,
        nargs="+",
        action="extend",
    )
    image: str = option(
        "ai2/cuda11.8-cudnn8-dev-ubuntu20.04",
        "A Beaker image, or a Docker reference (a ':' tag or a registry host); beaker:// or docker:// forces one.",
        type=non_empty,
    )
    pure_docker_mode: bool = option(
        False, "Run in the image's working directory, not `cd` here with this PATH.", action="store_true"
    )
    workspace: str | None = option(None, "Beaker workspace. Default: yours.", type=org_name)
    budget: str | None = option(None, "Beaker budget. Default: the workspace's.", type=org_name)
    priority: str = option("normal", "Job priority.", choices=("low", "normal", "high", "urgent"))
    preemptible: bool = option(False, "Allow Beaker to preempt the job.", action="store_true")
    num_nodes: int = option(1, "Nodes: Beaker replicas of each task.", type=int_in_range(1))
    max_retries: int = option(0, "Beaker's task retries.", type=int_in_range(0))
    gpus: int = option(0, "GPUs per node.", type=int_in_range(0, MAX_GPUS_PER_NODE))
    shared_memory: str = option(
        "10.24gb",
        "Size of /dev/shm (Ray's object store, NCCL buffers).",
        type=matching(r"(?i)\d+(\.\d+)?\s*([KMGT]i?B?|B)?", "a size like 10.24gb or 64GiB"),
    )
    timeout: str | None = option(
        None,
        "Beaker stops the task after this long. Default: no limit.",
        type=matching(r"(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+", "a duration like 15m, 2h or 2h30m"),
    )
    host_networking: bool = option(
        True, "Give the task its own network namespace.", flag="--no-host-networking", action="store_false"
    )
    description: str = option("Beaker-Mason job.", "Experiment description. Default: $RUN_NAME, else %(default)r.")
    task_name: str = option(
        "beaker_mason",
        "Base name of the Beaker tasks: NAME__0, NAME__1, ...",
        type=matching(_NAME, "made of letters, digits, '.', '_' and '-'"),
    )
    dry_run: bool = option(False, "Print the spec and every step mason would take, taking none.", action="store_true")
    mount_docker_socket: bool = option(
        False, "Mount the host's /var/run/docker.sock (Docker in Docker).", action="store_true"
    )
    beaker_datasets: tuple[tuple[str, str], ...] = option(  # (mount path, dataset id)
        (),
        "Beaker datasets to mount.",
        type=pair(":", "/[^:]*", "[^:]+", "MOUNT_PATH:DATASET_ID (e.g. /models:01HQXGAYGCS6D4)"),
        nargs="*",
        metavar="MOUNT_PATH:ID",
    )
    env: tuple[tuple[str, str], ...] = option(
        (),
        "An environment variable of the task; repeatable.",
        type=pair("=", _ENV_NAME, "(?s).*", "KEY=VALUE (KEY an environment variable name)"),
        action="append",
        metavar="KEY=VALUE",
    )
    # (variable, secret name): a secret enters the spec by its name only.
    secrets: tuple[tuple[str, str], ...] = option(
        (),
        "The workspace secret SECRET_NAME as the variable ENV; repeatable.",
        flag="--secret",
        type=pair("=", _ENV_NAME, _NAME, "ENV_VAR=SECRET_NAME (the name of a secret stored in the Beaker workspace)"),
        action="append",
        metavar="ENV=SECRET_NAME",
    )
    resumable: bool = option(
        True, "No resumable state directory or W&B resume.", flag="--non_resumable", action="store_false"
    )
    auto_dataset_cache: bool = option(
        True, "Do not tokenize the datasets here first.", flag="--no_auto_dataset_cache", action="store_false"
    )
    auto_output_dir_path: str = option(
        "/weka/oe-adapt-default/allennlp/deletable_checkpoint",
        "On Weka, --output_dir becomes PATH/USER/ ('' keeps yours).",
    )
    auto_checkpoint_state_dir: str = option(
        "/weka/oe-adapt-default/allennlp/deletable_checkpoint_states",
        "Resumable state goes to PATH/USER/<time>_<n> ('' keeps yours).",
    )
    artifact_ttl: str | None = option(None, "Append tmp-TTL (e.g. 1d) to the automatic directories.", type=non_empty)
    commands: tuple[tuple[str, ...], ...] = ()  # one per `--` group, argv tokens as the local shell passed them
    ignored: tuple[str, ...] = ()  # deprecated options that were given
    # The local directory, PATH and W&B settings, captured at parse time so the spec stays pure.
    local_workdir: str = ""
    local_path: str = ""
    wandb_env: tuple[tuple[str, str], ...] = ()

    @property
    def on_weka(self) -> bool:
        """Every cluster mounts Weka, so the task may rely on it."""
        return all(cluster in WEKA_CLUSTERS for cluster in self.clusters)


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
    """What makes one launch unique: its W&B run id and its resumable state's directory name. Fixed in the
    spec, so every Beaker retry of the launch resumes the same run from the same state."""

    wandb_run_id: str
    state_dir_name: str

    @staticmethod
    def new() -> LaunchIds:
        alphabet = string.ascii_lowercase + string.digits
        run_id = "".join(secrets.choice(alphabet) for _ in range(8))
        return LaunchIds(run_id, f"{int(time.time())}_{secrets.randbelow(1_000_000)}")
