"""A launch's settings, parsed once from mason.py's options, and the facts about Ai2's clusters that
open-instruct's mason.py encodes (the recorded commit's lists)."""

from __future__ import annotations

import secrets
import string
import time
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Mount:
    mount_path: str
    source: tuple[str, str]  # ("beaker", dataset id) | ("weka", bucket) | ("hostPath", path)


@dataclass(frozen=True)
class MasonArgs:
    clusters: tuple[str, ...]
    commands: tuple[tuple[str, ...], ...]  # one per `--` group, argv tokens as the local shell passed them
    image: str = "ai2/cuda11.8-cudnn8-dev-ubuntu20.04"
    workspace: str | None = None  # None: the account's default workspace
    budget: str | None = None  # None: the workspace's default budget
    hostnames: tuple[str, ...] = ()  # when given, they constrain the task instead of the clusters
    pure_docker_mode: bool = False
    priority: str = "normal"
    preemptible: bool = False
    num_nodes: int = 1
    max_retries: int = 0
    gpus: int = 0
    shared_memory: str = "10.24gb"
    timeout: str | None = None
    host_networking: bool = True
    mount_docker_socket: bool = False
    beaker_datasets: tuple[Mount, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    secrets: tuple[tuple[str, str], ...] = ()  # (env var name, Beaker secret name); never values
    description: str = "Beaker-Mason job."
    task_name: str = "beaker_mason"
    resumable: bool = True
    auto_dataset_cache: bool = True
    auto_output_dir_path: str = "/weka/oe-adapt-default/allennlp/deletable_checkpoint"
    auto_checkpoint_state_dir: str = "/weka/oe-adapt-default/allennlp/deletable_checkpoint_states"
    artifact_ttl: str | None = None
    dry_run: bool = False
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
