"""mason.py: turn a training command into a Beaker experiment and submit it (or print it).

What: Ai2 launches open-instruct jobs on its Beaker cluster with

    python mason.py --cluster ai2/jupiter-cirrascale-2 --image USER/IMAGE --pure_docker_mode \\
        --workspace ai2/tulu-thinker --priority high --preemptible --num_nodes 6 --max_retries 0 \\
        --env VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 --budget ai2/oe-adapt --gpus 8 \\
        -- source configs/beaker_configs/ray_node_setup.sh \\&\\& python open_instruct/grpo_fast.py ...

Everything after `--` is the command every replica runs. This script validates the flags, rebuilds the
command as one `bash -c` string, builds a Beaker v2 experiment spec and either submits it with the
`beaker` CLI or prints it as YAML.

Why a rebuilt string: the local shell hands us argv tokens, already unquoted. We quote each token again
with `shlex.quote` so values with spaces or shell characters (`"</answer>"`, the long comma-separated
`--oe_eval_tasks`) reach the container byte for byte. The one exception is the shell operators users
escape locally (`\\&\\&`, `\\|\\|`, `\\;`): a token that is exactly `&&`, `||` or `;` stays unquoted so it
chains commands inside the container.

How to run: `python mason.py --help`; `--dry_run` prints the spec without submitting. Hardware: any
machine with Python 3.11 and PyYAML; the experiment itself runs on Beaker's GPU nodes. Only the standard
library and PyYAML are used so the launcher works outside the training environment.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# Shell operators that may appear as their own token after `--` and are kept unquoted.
SHELL_OPERATORS = ("&&", "||", ";")
PRIORITIES = ("low", "normal", "high", "urgent")
MAX_GPUS_PER_NODE = 8
RESULT_PATH = "/output"  # Beaker keeps this directory as the experiment's result dataset
# How long Beaker waits for all replicas of a multi-node task to be scheduled before failing the
# experiment: large jobs often wait for the last few nodes, a task that never fully starts is useless.
SYNCHRONIZED_START_TIMEOUT = "90m"
# Ray keeps its object store and vLLM/NCCL keep buffers in /dev/shm; Docker's 64 MiB default is too small.
SHARED_MEMORY = "10 GiB"
# Environment every task gets; `--env` overrides any of them.
DEFAULT_ENV: dict[str, str] = {
    # Python block-buffers stdout without a TTY; unbuffered output makes Beaker's live logs show
    # progress (and the last line before a hang) as it happens.
    "PYTHONUNBUFFERED": "1",
    # NCCL's cuMem allocator makes the learner -> vLLM weight broadcast slow and can hang it
    # (vllm-project/vllm#5723); open-instruct disables it on every node for the same reason.
    "NCCL_CUMEM_ENABLE": "0",
}

_ORG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_TASK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class MasonArgs:
    clusters: tuple[str, ...]
    image: str
    workspace: str
    budget: str
    command: tuple[str, ...]  # argv tokens after `--`, exactly as the local shell passed them
    pure_docker_mode: bool = False
    priority: str = "normal"
    preemptible: bool = False
    num_nodes: int = 1
    max_retries: int = 0
    gpus: int = 0
    env: tuple[tuple[str, str], ...] = ()
    secrets: tuple[tuple[str, str], ...] = ()  # (env var name, Beaker secret name); never values
    description: str | None = None
    task_name: str = "open_instruct"
    dry_run: bool = False
    # Local working directory, captured at parse time so build_spec stays pure; used without
    # --pure_docker_mode only.
    local_workdir: str = ""


# ---------------------------------------------------------------------------------------------------------
# Argument parsing. Value checks live in argparse `type=` callables so every error names its flag and
# exits with status 2, like any other argparse usage error.


def _org_name(value: str) -> str:
    if not _ORG_NAME.match(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not of the form org/name (e.g. ai2/jupiter-cirrascale-2)")
    return value


def _int_in_range(low: int, high: int | None):
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


def _env_pair(value: str) -> tuple[str, str]:
    name, sep, val = value.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{value!r} is not KEY=VALUE (no '=')")
    if not _ENV_NAME.match(name):
        raise argparse.ArgumentTypeError(f"{value!r}: {name!r} is not a valid environment variable name")
    return name, val


def _secret_pair(value: str) -> tuple[str, str]:
    name, sep, secret = value.partition("=")
    if not sep or not _ENV_NAME.match(name) or not _SECRET_NAME.match(secret):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not ENV_VAR=SECRET_NAME (the name of a secret stored in the Beaker workspace)"
        )
    return name, secret


def _task_name(value: str) -> str:
    if not _TASK_NAME.match(value):
        raise argparse.ArgumentTypeError(f"{value!r} may only contain letters, digits, '.', '_' and '-'")
    return value


def _non_empty(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value


HELP_EPILOG = f"""\
the command after `--`:
  Every replica runs it with `/bin/bash -c`. Each token is re-quoted with shlex.quote, so arguments
  with spaces or shell characters arrive unchanged. Tokens that are exactly {", ".join(SHELL_OPERATORS)}
  stay shell operators: write them escaped locally (`\\&\\&`) so your shell passes them through.
  Nothing else is interpreted in the container: `$VAR`, pipes and redirections are literal arguments.
  Wrap such logic in a script, or in a single `bash -c '...'` token, if you need it.

multi-node (--num_nodes > 1):
  One Beaker task with `replicas: N`, leader selection, host networking, failure/preemption propagation
  and a {SYNCHRONIZED_START_TIMEOUT} synchronized start. All replicas run the same command, so it should begin
  with `source configs/beaker_configs/ray_node_setup.sh`: replica 0 starts the Ray head and continues,
  the others join the Ray cluster and block there (they never run the trainer).

default environment (each overridable with --env):
  {chr(10).join(f"  {k}={v}" for k, v in DEFAULT_ENV.items()).strip()}
  (PYTHONUNBUFFERED: live logs; NCCL_CUMEM_ENABLE=0: fast, hang-free weight broadcast to vLLM.)
  Resources also request {SHARED_MEMORY} of /dev/shm (Ray object store, NCCL).

submission:
  The spec is printed as YAML on stdout (exit 0) instead of submitted when --dry_run is given, when no
  `beaker` CLI is on PATH, or when there are no Beaker credentials (BEAKER_TOKEN or ~/.beaker/config.yml).
  Otherwise it runs `beaker experiment create SPEC --workspace WORKSPACE` and exits with its status.
"""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mason.py",
        description="Build a Beaker experiment for a command and submit it (or print it with --dry_run).",
        usage="python mason.py [options] -- COMMAND [ARGS...]",
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # an abbreviation silently matching another flag is worse than an error
    )
    parser.add_argument(
        "--cluster",
        dest="clusters",
        type=_org_name,
        nargs="+",
        action="extend",
        required=True,
        metavar="ORG/NAME",
        help="Beaker cluster(s) the task may run on; repeat the flag or list several after it.",
    )
    parser.add_argument(
        "--image",
        required=True,
        type=_non_empty,
        help="Image to run. A Beaker image (`user/name`) unless it looks like a Docker reference (has a "
        "':' tag or a registry host with a '.'); force either with a `beaker://` or `docker://` prefix.",
    )
    parser.add_argument(
        "--pure_docker_mode",
        action="store_true",
        help="Run the command from the image's working directory, using the code baked into the image. "
        "Without it the command first does `cd` into your current local directory, which only works "
        "when that path is on a filesystem the cluster mounts at the same path (e.g. Weka).",
    )
    parser.add_argument("--workspace", required=True, type=_org_name, metavar="ORG/NAME", help="Beaker workspace.")
    parser.add_argument(
        "--priority", choices=PRIORITIES, default="normal", help="Beaker job priority (default: normal)."
    )
    parser.add_argument("--preemptible", action="store_true", help="Allow Beaker to preempt the job.")
    parser.add_argument(
        "--num_nodes",
        type=_int_in_range(1, None),
        default=1,
        metavar="N",
        help="Number of nodes (Beaker replicas of the one task); >= 1, default 1.",
    )
    parser.add_argument(
        "--max_retries",
        type=_int_in_range(0, None),
        default=0,
        metavar="N",
        help="How often Beaker may retry a failed task (spec `retry.allowedTaskRetries`); >= 0, default 0.",
    )
    parser.add_argument(
        "--env",
        type=_env_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Environment variable for the task; repeatable.",
    )
    parser.add_argument(
        "--secret",
        dest="secrets",
        type=_secret_pair,
        action="append",
        default=[],
        metavar="ENV=SECRET_NAME",
        help="Expose the Beaker workspace secret SECRET_NAME as environment variable ENV; repeatable. Only "
        "the secret's name goes into the spec, never its value.",
    )
    parser.add_argument("--budget", required=True, type=_org_name, metavar="ORG/NAME", help="Beaker budget.")
    parser.add_argument(
        "--gpus",
        type=_int_in_range(0, MAX_GPUS_PER_NODE),
        default=0,
        metavar="N",
        help=f"GPUs per node, 0..{MAX_GPUS_PER_NODE} (default 0).",
    )
    parser.add_argument(
        "--description",
        default=None,
        help="Experiment description (default: the command's --exp_name value, else the task name).",
    )
    parser.add_argument(
        "--task_name",
        type=_task_name,
        default="open_instruct",
        help="Name of the Beaker task (default: open_instruct).",
    )
    parser.add_argument(
        "--dry_run", action="store_true", help="Print the experiment spec as YAML instead of submitting it."
    )
    return parser


def parse_args(argv: list[str]) -> MasonArgs:
    """Parse mason's own flags and the command after `--`. Usage errors exit with status 2."""
    parser = _build_parser()
    if "--" in argv:
        split = argv.index("--")
        own, command = argv[:split], argv[split + 1 :]
    else:
        own, command = argv, None
    ns = parser.parse_args(own)  # handles --help and every per-flag error first
    if command is None:
        parser.error("missing `-- COMMAND`: put the command to run after `--`")
    if not command or all(not token.strip() for token in command):
        parser.error("empty command after `--`")
    try:
        build_command(command)
    except ValueError as e:
        parser.error(f"command after `--`: {e}")

    env_names = [name for name, _ in ns.env]
    secret_names = [name for name, _ in ns.secrets]
    for flag, names in (("--env", env_names), ("--secret", secret_names)):
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            parser.error(f"argument {flag}: {', '.join(duplicates)} given more than once")
    both = sorted(set(env_names) & set(secret_names))
    if both:
        parser.error(f"argument --secret: {', '.join(both)} is also set with --env")

    return MasonArgs(
        clusters=tuple(dict.fromkeys(ns.clusters)),  # de-duplicated, order kept
        image=ns.image,
        workspace=ns.workspace,
        budget=ns.budget,
        command=tuple(command),
        pure_docker_mode=ns.pure_docker_mode,
        priority=ns.priority,
        preemptible=ns.preemptible,
        num_nodes=ns.num_nodes,
        max_retries=ns.max_retries,
        gpus=ns.gpus,
        env=tuple(ns.env),
        secrets=tuple(ns.secrets),
        description=ns.description,
        task_name=ns.task_name,
        dry_run=ns.dry_run,
        local_workdir=os.getcwd(),
    )


# ---------------------------------------------------------------------------------------------------------
# Spec building (pure).


def build_command(tokens: list[str] | tuple[str, ...]) -> str:
    """Rebuild argv tokens into one shell string: operators bare, every other token shlex-quoted.

    Raises ValueError when an operator has no command on one of its sides (`&& python x`, `a && && b`).
    """
    parts: list[str] = []
    expect_command = True  # at the start and right after an operator a command must follow
    for token in tokens:
        if token in SHELL_OPERATORS:
            if expect_command:  # bash: "syntax error near unexpected token"
                raise ValueError(f"{token!r} has no command before it")
            parts.append(token)
            expect_command = True
        else:
            parts.append(shlex.quote(token))
            expect_command = False
    if not parts:
        raise ValueError("empty command")
    if parts[-1] in ("&&", "||"):  # a trailing ';' is valid shell, a trailing '&&' is not
        raise ValueError(f"{parts[-1]!r} has no command after it")
    return " ".join(parts)


def _image_spec(image: str) -> dict[str, str]:
    if image.startswith("beaker://"):
        return {"beaker": image.removeprefix("beaker://")}
    if image.startswith("docker://"):
        return {"docker": image.removeprefix("docker://")}
    first = image.split("/", 1)[0]
    looks_like_docker = ":" in image or "@" in image or ("/" in image and ("." in first or first == "localhost"))
    return {"docker": image} if looks_like_docker else {"beaker": image}


def _flag_value(tokens: tuple[str, ...], flag: str) -> str | None:
    for i, token in enumerate(tokens):
        if token == flag and i + 1 < len(tokens):
            return tokens[i + 1]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return None


def build_spec(args: MasonArgs) -> dict[str, Any]:
    """The Beaker v2 experiment spec (a plain dict, ready for YAML) for parsed arguments."""
    command = build_command(args.command)
    if not args.pure_docker_mode:
        command = f"cd {shlex.quote(args.local_workdir)} && {command}"

    env = {**DEFAULT_ENV, **dict(args.env)}
    env_vars: list[dict[str, str]] = [{"name": name, "value": value} for name, value in env.items()]
    env_vars += [{"name": name, "secret": secret} for name, secret in args.secrets]

    task: dict[str, Any] = {"name": args.task_name}
    if args.num_nodes > 1:
        # Beaker's multi-node convention: N replicas of one task, replica 0 elected leader (its hostname
        # is BEAKER_LEADER_REPLICA_HOSTNAME on every replica), host networking so Ray/NCCL reach each
        # other directly, and one replica failing or being preempted takes the whole group down (a Ray
        # cluster missing a node cannot continue).
        task.update(
            {
                "replicas": args.num_nodes,
                "leaderSelection": True,
                "hostNetworking": True,
                "propagateFailure": True,
                "propagatePreemption": True,
                "synchronizedStartTimeout": SYNCHRONIZED_START_TIMEOUT,
            }
        )
    task.update(
        {
            "image": _image_spec(args.image),
            "command": ["/bin/bash", "-c"],
            "arguments": [command],
            "envVars": env_vars,
            "result": {"path": RESULT_PATH},
            "resources": {"gpuCount": args.gpus, "sharedMemory": SHARED_MEMORY},
            "context": {"priority": args.priority, "preemptible": args.preemptible},
            "constraints": {"cluster": list(args.clusters)},
        }
    )
    description = args.description or _flag_value(args.command, "--exp_name") or args.task_name
    return {
        "version": "v2",
        "budget": args.budget,
        "description": description,
        "tasks": [task],
        "retry": {"allowedTaskRetries": args.max_retries},
    }


def spec_to_yaml(spec: dict[str, Any]) -> str:
    # Wide lines: the long command stays on one line, easy to grep and copy.
    return yaml.safe_dump(spec, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1 << 16)


# ---------------------------------------------------------------------------------------------------------
# Submission.


def _warnings(args: MasonArgs) -> list[str]:
    notes = []
    text = " ".join(args.command)
    if args.num_nodes > 1 and "ray_node_setup.sh" not in text:
        notes.append(
            f"--num_nodes {args.num_nodes} but the command does not source ray_node_setup.sh: every replica "
            "will run the full command independently"
        )
    names = {name for name, _ in args.env} | {name for name, _ in args.secrets}
    if "--with_tracking" in args.command and "WANDB_API_KEY" not in names:
        notes.append("--with_tracking without WANDB_API_KEY: add --secret WANDB_API_KEY=<your wandb secret name>")
    return notes


def _no_submit_reason(args: MasonArgs) -> str | None:
    if args.dry_run:
        return "--dry_run"
    if shutil.which("beaker") is None:
        return "no `beaker` CLI on PATH"
    if not os.environ.get("BEAKER_TOKEN") and not Path("~/.beaker/config.yml").expanduser().is_file():
        return "no Beaker credentials (BEAKER_TOKEN or ~/.beaker/config.yml)"
    return None


def beaker_command(spec_path: str, workspace: str) -> list[str]:
    return ["beaker", "experiment", "create", spec_path, "--workspace", workspace]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    spec = build_spec(args)
    text = spec_to_yaml(spec)
    for note in _warnings(args):
        print(f"mason.py: warning: {note}", file=sys.stderr)

    reason = _no_submit_reason(args)
    if reason is not None:
        # The command that would submit it, beside the spec (a YAML comment, so stdout stays valid YAML):
        # the workspace goes only to the beaker command line, not into the spec.
        command = shlex.join(beaker_command("experiment.yaml", args.workspace))
        print(f"mason.py: not submitting ({reason}); printing the experiment spec", file=sys.stderr)
        print(f"mason.py: would run: {command}  (experiment.yaml = the spec on stdout)", file=sys.stderr)
        sys.stdout.write(f"# {command}\n{text}")
        return 0

    with tempfile.TemporaryDirectory(prefix="mason_") as tmp:
        spec_path = Path(tmp) / "experiment.yaml"
        spec_path.write_text(text)
        cmd = beaker_command(str(spec_path), args.workspace)
        print(f"mason.py: {shlex.join(cmd)}", file=sys.stderr)
        try:
            return subprocess.run(cmd, check=False).returncode
        except OSError as e:
            print(f"mason.py: could not run the beaker CLI: {e}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
