"""A launch's settings, each of mason.py's options declared once as a field of `MasonArgs` (its flag, checks and
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
PRIORITIES = ("low", "normal", "high", "urgent")
MAX_GPUS_PER_NODE = 8
OPTION_GROUPS = {
    "placement": "where and how the tasks run",
    "environment": "what the tasks see: mounts, variables, secrets",
    "training": "what mason does to a grpo_fast.py command (open-instruct's resumable mode and dataset caching)",
}

_ORG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_TASK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")
_MEMORY = re.compile(r"^\d+(\.\d+)?\s*([KMGT]i?B?|B)?$", re.IGNORECASE)


# Value checks are argparse `type=` callables, so every error names its option and exits with status 2.


def org_name(value: str) -> str:
    if not _ORG_NAME.match(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not of the form org/name (e.g. ai2/jupiter)")
    return value


def int_in_range(low: int, high: int | None):
    def check(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if number < low or (high is not None and number > high):
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"{number} is out of range: must be {bound}")
        return number

    return check


def matching(pattern: re.Pattern, example: str):
    def check(value: str) -> str:
        if not pattern.match(value.strip()):
            raise argparse.ArgumentTypeError(f"{value!r} is not like {example}")
        return value.strip()

    return check


def env_pair(value: str) -> tuple[str, str]:
    name, sep, val = value.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{value!r} is not KEY=VALUE (no '=')")
    if not _ENV_NAME.match(name):
        raise argparse.ArgumentTypeError(f"{value!r}: {name!r} is not a valid environment variable name")
    return name, val


def secret_pair(value: str) -> tuple[str, str]:
    name, sep, secret = value.partition("=")
    if not sep or not _ENV_NAME.match(name) or not _SECRET_NAME.match(secret):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not ENV_VAR=SECRET_NAME (the name of a secret stored in the Beaker workspace)"
        )
    return name, secret


def beaker_dataset(value: str) -> Mount:
    mount_path, sep, dataset = value.partition(":")
    if not sep or not mount_path.startswith("/") or not dataset or ":" in dataset:
        raise argparse.ArgumentTypeError(f"{value!r} is not MOUNT_PATH:DATASET_ID (e.g. /models:01HQXGAYGCS6D4)")
    return Mount(mount_path, ("beaker", dataset))


def valid_task_name(value: str) -> str:
    if not _TASK_NAME.match(value):
        raise argparse.ArgumentTypeError(f"{value!r} may only contain letters, digits, '.', '_' and '-'")
    return value


def non_empty(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def option(
    default: Any = MISSING, help: str = "", *, group: str, flag: str = "", unique: bool = False, **argparse_kwargs
):
    """A `MasonArgs` field that is one of mason.py's options: its flag (`--<field name>` unless `flag` says
    otherwise), its argparse arguments and help, in `group` of --help. A list option's values become a tuple;
    `unique` ones keep their first occurrence only."""
    metadata = {"group": group, "flag": flag, "unique": unique, "argparse": {"help": help, **argparse_kwargs}}
    return field(default=default, metadata=metadata)


def add_options(parser: argparse.ArgumentParser, defaults: dict[str, Any]) -> None:
    """Every option of `MasonArgs` on `parser`, in its group; `defaults` overrides a declared default (one that
    depends on the environment)."""
    groups = {name: parser.add_argument_group(f"{name} ({about})") for name, about in OPTION_GROUPS.items()}
    for setting in fields(MasonArgs):
        if "group" not in setting.metadata:
            continue
        kwargs = dict(setting.metadata["argparse"])
        if setting.default is MISSING:
            kwargs["required"] = True
        else:
            default = defaults.get(setting.name, setting.default)
            # A list option's tuple default as a list: argparse's append and extend actions add to it.
            kwargs["default"] = list(default) if isinstance(default, tuple) else default
        flag = setting.metadata["flag"] or f"--{setting.name}"
        groups[setting.metadata["group"]].add_argument(flag, dest=setting.name, **kwargs)


def from_namespace(ns: argparse.Namespace, **rest: Any) -> MasonArgs:
    """The settings from parsed options (`rest`: the fields that are not options)."""
    values = {}
    for setting in fields(MasonArgs):
        if "group" in setting.metadata:
            value = getattr(ns, setting.name)
            if isinstance(value, list):
                value = tuple(dict.fromkeys(value)) if setting.metadata["unique"] else tuple(value)
            values[setting.name] = value
    return MasonArgs(**values, **rest)


@dataclass(frozen=True)
class Mount:
    mount_path: str
    source: tuple[str, str]  # ("beaker", dataset id) | ("weka", bucket) | ("hostPath", path)


@dataclass(frozen=True)
class MasonArgs:
    clusters: tuple[str, ...] = option(
        group="placement",
        flag="--cluster",
        unique=True,
        type=org_name,
        nargs="+",
        action="extend",
        metavar="ORG/NAME",
        help="Beaker cluster(s) the task may run on; repeat the option or list several after it.",
    )
    commands: tuple[tuple[str, ...], ...] = ()  # one per `--` group, argv tokens as the local shell passed them
    hostnames: tuple[str, ...] = option(
        (),
        group="placement",
        flag="--hostname",
        unique=True,
        type=non_empty,
        nargs="+",
        action="extend",
        help="Beaker host(s) the task may run on; when given they constrain the task instead of --cluster.",
    )
    image: str = option(
        "ai2/cuda11.8-cudnn8-dev-ubuntu20.04",
        group="placement",
        type=non_empty,
        help="Image to run (default: %(default)s). A Beaker image (`user/name`) unless it looks like a Docker "
        "reference (a ':' tag or a registry host); force either with a `beaker://` or `docker://` prefix.",
    )
    pure_docker_mode: bool = option(
        False,
        group="placement",
        action="store_true",
        help="Run from the image's working directory with the code baked into it. Without it the command first "
        "does `cd` into this directory and gets this shell's PATH (both must be on a filesystem the cluster "
        "mounts at the same path, e.g. Weka).",
    )
    workspace: str | None = option(
        None, group="placement", type=org_name, metavar="ORG/NAME", help="Beaker workspace (default: yours)."
    )
    budget: str | None = option(
        None,
        group="placement",
        type=org_name,
        metavar="ORG/NAME",
        help="Beaker budget (default: the workspace's default budget).",
    )
    priority: str = option("normal", group="placement", choices=PRIORITIES, help="Job priority (default: normal).")
    preemptible: bool = option(False, group="placement", action="store_true", help="Allow Beaker to preempt the job.")
    num_nodes: int = option(
        1,
        group="placement",
        type=int_in_range(1, None),
        metavar="N",
        help="Number of nodes (Beaker replicas of each task); >= 1, default 1.",
    )
    max_retries: int = option(
        0,
        group="placement",
        type=int_in_range(0, None),
        metavar="N",
        help="How often Beaker may retry a failed task (retry.allowedTaskRetries); >= 0, default 0.",
    )
    gpus: int = option(
        0,
        group="placement",
        type=int_in_range(0, MAX_GPUS_PER_NODE),
        metavar="N",
        help=f"GPUs per node, 0..{MAX_GPUS_PER_NODE} (default 0).",
    )
    shared_memory: str = option(
        "10.24gb",
        group="placement",
        type=matching(_MEMORY, "10.24gb or 64GiB"),
        help="Size of /dev/shm (Ray's object store, NCCL buffers); default %(default)s.",
    )
    timeout: str | None = option(
        None,
        group="placement",
        type=matching(_DURATION, "15m, 2h or 2h30m"),
        help="Beaker stops the task after this long (e.g. 15m, 2h30m); default: no limit.",
    )
    host_networking: bool = option(
        True,
        group="placement",
        flag="--no-host-networking",
        action="store_false",
        help="Give the task its own network namespace (multi-node jobs need host networking).",
    )
    description: str = option(
        "Beaker-Mason job.", group="placement", help="Experiment description (default: $RUN_NAME, else %(default)r)."
    )
    task_name: str = option(
        "beaker_mason",
        group="placement",
        type=valid_task_name,
        help="Base name of the Beaker tasks (NAME__0, NAME__1, ...); default %(default)s.",
    )
    dry_run: bool = option(
        False,
        group="placement",
        action="store_true",
        help="Print the spec and every step mason would take (dataset caching, submission), taking none.",
    )
    mount_docker_socket: bool = option(
        False,
        group="environment",
        action="store_true",
        help="Mount the host's /var/run/docker.sock (Docker in Docker, e.g. a code-execution sandbox).",
    )
    beaker_datasets: tuple[Mount, ...] = option(
        (),
        group="environment",
        type=beaker_dataset,
        nargs="*",
        metavar="MOUNT:ID",
        help="Beaker datasets to mount, each MOUNT_PATH:DATASET_ID (e.g. /models:01HQXGAYGCS6D4ZK51K83CM49Y).",
    )
    env: tuple[tuple[str, str], ...] = option(
        (),
        group="environment",
        type=env_pair,
        action="append",
        metavar="KEY=VALUE",
        help="Environment variable for the task; repeatable.",
    )
    # (env var name, Beaker secret name); never values
    secrets: tuple[tuple[str, str], ...] = option(
        (),
        group="environment",
        flag="--secret",
        type=secret_pair,
        action="append",
        metavar="ENV=SECRET_NAME",
        help="Expose the workspace secret SECRET_NAME as ENV; repeatable. Only its name enters the spec.",
    )
    resumable: bool = option(
        True,
        group="training",
        flag="--non_resumable",
        action="store_false",
        help="No automatic resumable state directory and no W&B resume for grpo_fast.py commands.",
    )
    auto_dataset_cache: bool = option(
        True,
        group="training",
        flag="--no_auto_dataset_cache",
        action="store_false",
        help="Do not tokenize the datasets here before submitting.",
    )
    auto_output_dir_path: str = option(
        "/weka/oe-adapt-default/allennlp/deletable_checkpoint",
        group="training",
        help="On Weka clusters --output_dir becomes PATH/USER/ ('' keeps yours); default %(default)s.",
    )
    auto_checkpoint_state_dir: str = option(
        "/weka/oe-adapt-default/allennlp/deletable_checkpoint_states",
        group="training",
        help="Resumable state goes to PATH/USER/<time>_<n> ('' keeps --checkpoint_state_dir); default %(default)s.",
    )
    artifact_ttl: str | None = option(
        None,
        group="training",
        type=non_empty,
        metavar="TTL",
        help="Append tmp-TTL (e.g. 1d) to the automatic output and state directories (a retention class).",
    )
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
