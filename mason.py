"""mason.py: turn training commands into a Beaker experiment and submit it (or print it).

What: Ai2 launches open-instruct jobs on its Beaker clusters with

    python mason.py --cluster ai2/jupiter --image USER/IMAGE --pure_docker_mode \\
        --workspace ai2/tulu-thinker --priority high --preemptible --num_nodes 6 \\
        --env VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 --gpus 8 \\
        -- source configs/beaker_configs/ray_node_setup.sh \\&\\& python open_instruct/grpo_fast.py ...

Every option of open-instruct's own mason.py (at the commit the tests record) is accepted with its
default and its meaning in the experiment spec, so its launch scripts run unchanged. Each command after
a `--` becomes one Beaker task. For a grpo_fast command mason also, as open-instruct's does:
tokenizes the datasets locally first (`--cache_dataset_only`) and hands the cache key to the job,
gives the run resumable state under `--auto_checkpoint_state_dir` (and a W&B run id that resumes), and
on Weka clusters writes outputs under `--auto_output_dir_path`. Where open-instruct's behaviour is a
bug, this one differs on purpose; docs/multi_node.md lists each difference and why.

How to run: `python mason.py --help`; `--dry_run` prints the spec and every step it would take without
running any. Only the standard library and PyYAML are needed for the spec itself; the dataset caching
runs grpo_fast.py with the repository's `.venv` when there is one.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from open_instruct.launch.beaker_spec import DEFAULT_ENV, build_spec, spec_to_yaml
from open_instruct.launch.commands import (
    SHELL_OPERATORS,
    Prepared,
    build_command,
    cache_readable_by_job,
    caching_command,
    detach_operators,
    entry_segment,
    parse_cache_keys,
    rewrite_training,
)
from open_instruct.launch.settings import (
    INTERCONNECT_CLUSTERS,
    TRAINING_ENTRY,
    Account,
    LaunchIds,
    MasonArgs,
    add_options,
    from_namespace,
)

REPO = Path(__file__).resolve().parent
# Options open-instruct's mason.py accepted once and now ignores.
DEPRECATED_NO_OPS = {
    "no_hf_cache_env": "open-instruct marks it deprecated; it does nothing",
    "no_mount_nfs": "open-instruct marks it deprecated; it does nothing",
    "gs_model_name": "it named a model uploaded to Google Cloud Storage for the retired Augusta cluster",
}
# W&B settings of the launching shell that the job inherits.
PASSED_THROUGH_ENV = ("WANDB_ENTITY", "WANDB_PROJECT", "WANDB_TAGS")

HELP_EPILOG = f"""\
the commands after `--`:
  Each `--` starts a command; each command is one Beaker task (TASK_NAME__0, TASK_NAME__1, ...).
  Every replica runs its task's command with `/bin/bash -c`. Tokens are re-quoted so arguments with
  spaces or shell characters arrive unchanged; tokens that are exactly {", ".join(SHELL_OPERATORS)} stay shell
  operators (write them escaped locally: `\\&\\&`), and `$NAME` / `${{NAME}}` expand in the container (set
  by an earlier `source ...setup.sh`, e.g. `$CODE_API_URL/test_program`). Nothing else is interpreted.

a grpo_fast.py command (as open-instruct's mason.py):
  - its datasets are tokenized here first (`--cache_dataset_only`, with this repository's .venv) and
    the job gets the cache key when it can read the cache (--no_auto_dataset_cache skips this);
  - resumable (unless --non_resumable): --checkpoint_state_dir becomes a new directory under
    --auto_checkpoint_state_dir/USER (kept when already on /weka/), and W&B resumes the same run id;
  - on a Weka cluster, --output_dir goes under --auto_output_dir_path/USER (kept when on /weka/);
  - --hf_entity allenai and --wandb_entity ai2-llm are added when absent.
  Without Beaker credentials (an external user) the command is left as written.

multi-node (--num_nodes > 1):
  One task with `replicas: N`, leader selection and failure/preemption propagation. All replicas run
  the same command, so it should begin with `source configs/beaker_configs/ray_node_setup.sh`.

default environment (each overridable with --env):
  {chr(10).join(f"  {k}={v}" for k, v in DEFAULT_ENV.items()).strip()}
  Weka clusters add the Hugging Face cache paths on Weka; resumable runs add WANDB_RUN_ID and
  WANDB_RESUME=allow; WANDB_ENTITY, WANDB_PROJECT and WANDB_TAGS pass through from this shell.

submission:
  The spec is printed as YAML on stdout (exit 0) instead of submitted with --dry_run, without a
  `beaker` CLI on PATH, or without Beaker credentials (BEAKER_TOKEN or ~/.beaker/config.yml).
  Otherwise it runs `beaker experiment create SPEC [--workspace WORKSPACE]` and exits with its status.
"""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mason.py",
        description="Build a Beaker experiment for commands and submit it (or print it with --dry_run).",
        usage="python mason.py [options] -- COMMAND [ARGS...] [-- COMMAND [ARGS...] ...]",
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # an abbreviation silently matching another option is worse than an error
    )
    # The one default that depends on where mason runs.
    add_options(parser, {"description": os.environ.get("RUN_NAME", MasonArgs.description)})
    for name in DEPRECATED_NO_OPS:
        takes_value = name == "gs_model_name"
        parser.add_argument(
            f"--{name}",
            action="store" if takes_value else "store_true",
            default=None if takes_value else False,
            help=f"Accepted and ignored: {DEPRECATED_NO_OPS[name]}.",
        )
    return parser


def split_commands(tokens: list[str]) -> list[list[str]]:
    """['a', 'b', '--', 'c'] -> [['a', 'b'], ['c']]: every `--` starts a new command."""
    commands: list[list[str]] = [[]]
    for token in tokens:
        if token == "--":
            commands.append([])
        else:
            commands[-1].append(token)
    return [command for command in commands if command]


def parse_args(argv: list[str], environ: dict[str, str] | None = None) -> MasonArgs:
    """Parse mason's own options and the commands after `--`. Usage errors exit with status 2."""
    environ = dict(os.environ if environ is None else environ)
    parser = _build_parser()
    own, rest = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, None)
    ns = parser.parse_args(own)  # --help and every per-option error first
    if rest is None:
        parser.error("missing `-- COMMAND`: put the command to run after `--`")
    commands = [detach_operators(command) for command in split_commands(rest)]
    if not commands or any(all(not token.strip() for token in command) for command in commands):
        parser.error("empty command after `--`")
    for command in commands:
        try:
            build_command(command)
        except ValueError as e:
            parser.error(f"command after `--`: {e}")
    _check_unique_names(parser, ns.env, ns.secrets)
    return from_namespace(
        ns,
        commands=tuple(commands),
        ignored=tuple(name for name in DEPRECATED_NO_OPS if getattr(ns, name)),
        local_workdir=os.getcwd(),
        local_path=environ.get("PATH", ""),
        wandb_env=tuple((name, environ[name]) for name in PASSED_THROUGH_ENV if name in environ),
    )


def _check_unique_names(parser, env: list[tuple[str, str]], secret_pairs: list[tuple[str, str]]) -> None:
    env_names = [name for name, _ in env]
    secret_names = [name for name, _ in secret_pairs]
    for option, names in (("--env", env_names), ("--secret", secret_names)):
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            parser.error(f"argument {option}: {', '.join(duplicates)} given more than once")
    both = sorted(set(env_names) & set(secret_names))
    if both:
        parser.error(f"argument --secret: {', '.join(both)} is also set with --env")


# ---------------------------------------------------------------------------------------------------------
# The Beaker account, the local dataset caching, submission.


def has_credentials() -> bool:
    return bool(os.environ.get("BEAKER_TOKEN")) or Path("~/.beaker/config.yml").expanduser().is_file()


class LaunchError(Exception):
    """A step before submission failed; nothing was submitted."""


def _beaker_json(*arguments: str) -> Any:
    failed = f"`beaker {' '.join(arguments)}` failed"
    try:
        result = subprocess.run(
            ["beaker", *arguments, "--format", "json"], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise LaunchError(f"{failed}: {error}") from None
    if result.returncode != 0:
        raise LaunchError(f"{failed}: {result.stderr.strip() or f'exit {result.returncode}'}")
    try:
        return json.loads(result.stdout)
    except ValueError as error:
        raise LaunchError(f"{failed}: its output is not JSON ({error})") from None


def look_up_account(workspace: str | None) -> Account:
    """The user and the workspace's secret names, from the beaker CLI; external without credentials."""
    if not has_credentials() or shutil.which("beaker") is None:
        return Account()
    try:
        user = _beaker_json("account", "whoami")[0]["name"]
        listed = _beaker_json("secret", "list", *(("--workspace", workspace) if workspace else ()))
        return Account(user, frozenset(item["name"] for item in listed))
    except (KeyError, IndexError, TypeError) as error:
        raise LaunchError(f"the beaker CLI's answer about the account is not understood: {error!r}") from None


def local_python() -> str:
    """The interpreter of the caching run: this repository's .venv when there is one (it has the stack)."""
    venv_python = REPO / ".venv" / "bin" / "python"
    return str(venv_python) if venv_python.exists() else sys.executable


def local_entry(script: str) -> str:
    """The grpo_fast.py to run here: the command's own path, else this repository's."""
    return script if Path(script).is_file() else str(REPO / TRAINING_ENTRY)


def run_caching(command: list[str]) -> tuple[str, ...]:
    """Run the caching command here, its output shown as it comes; the cache keys it printed."""
    print(f"mason.py: caching the datasets first: {shlex.join(command)}", file=sys.stderr)
    lines: list[str] = []
    try:
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
            assert process.stdout is not None
            for line in process.stdout:
                sys.stderr.write(line)
                lines.append(line.rstrip("\n"))
    except OSError as error:
        raise LaunchError(f"could not run the dataset caching: {error}") from None
    if process.returncode != 0:
        last = next((line.strip() for line in reversed(lines) if line.strip()), "no output")
        raise LaunchError(
            f"caching the datasets failed (exit {process.returncode}): {last}; nothing was submitted "
            "(--no_auto_dataset_cache skips this step)"
        )
    return parse_cache_keys("\n".join(lines))


def prepare(args: MasonArgs, account: Account, ids: LaunchIds) -> list[Prepared]:
    """Each command with mason's rewrites and its dataset cache key (the caching runs here, unless a dry run)."""
    prepared = []
    for tokens in args.commands:
        keys: tuple[str, ...] = ()
        segment = entry_segment(tokens) if args.auto_dataset_cache else None
        caching = caching_command(tokens, local_python(), local_entry(tokens[segment[0] - 1])) if segment else None
        if caching and args.dry_run:
            print(f"mason.py: would cache the datasets first: {shlex.join(caching)}", file=sys.stderr)
        elif caching:
            keys = run_caching(caching)
            if keys and not cache_readable_by_job(args, tokens):
                print(
                    "mason.py: the dataset cache is on this machine only (--pure_docker_mode and a cache "
                    "directory off Weka): the job tokenizes its datasets itself",
                    file=sys.stderr,
                )
                keys = ()
        prepared.append(rewrite_training(args, tokens, account, ids, keys))
    return prepared


def launch_warnings(args: MasonArgs) -> list[str]:
    notes = [f"--{name} is ignored: {DEPRECATED_NO_OPS[name]}" for name in args.ignored]
    words = [token for command in args.commands for token in command]
    if args.num_nodes > 1 and not any("ray_node_setup.sh" in word for word in words):
        notes.append(
            f"--num_nodes {args.num_nodes} but no command sources ray_node_setup.sh: every replica runs the "
            "whole command on its own"
        )
    if args.num_nodes > 1 and not args.host_networking:
        notes.append("--no-host-networking with --num_nodes > 1: the nodes cannot reach each other's Ray and NCCL")
    if args.num_nodes > 1 and not all(cluster in INTERCONNECT_CLUSTERS for cluster in args.clusters):
        notes.append(
            "a multi-node job on a cluster without a fast interconnect (those with one: "
            f"{', '.join(INTERCONNECT_CLUSTERS)})"
        )
    names = {name for name, _ in args.env} | {name for name, _ in args.secrets}
    if "--with_tracking" in words and "WANDB_API_KEY" not in names:
        notes.append(
            "--with_tracking: the job needs WANDB_API_KEY (--secret WANDB_API_KEY=<secret name>, or a workspace "
            "secret named <user>_WANDB_API_KEY or WANDB_API_KEY)"
        )
    return notes


def _no_submit_reason(args: MasonArgs) -> str | None:
    if args.dry_run:
        return "--dry_run"
    if shutil.which("beaker") is None:
        return "no `beaker` CLI on PATH"
    if not has_credentials():
        return "no Beaker credentials (BEAKER_TOKEN or ~/.beaker/config.yml)"
    return None


def beaker_command(spec_path: str, workspace: str | None) -> list[str]:
    return ["beaker", "experiment", "create", spec_path, *(("--workspace", workspace) if workspace else ())]


def submit(text: str, workspace: str | None) -> int:
    with tempfile.TemporaryDirectory(prefix="mason_") as tmp:
        spec_path = Path(tmp) / "experiment.yaml"
        spec_path.write_text(text)
        command = beaker_command(str(spec_path), workspace)
        print(f"mason.py: {shlex.join(command)}", file=sys.stderr)
        try:
            return subprocess.run(command, check=False).returncode
        except OSError as error:
            print(f"mason.py: could not run the beaker CLI: {error}", file=sys.stderr)
            return 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    for note in launch_warnings(args):
        print(f"mason.py: warning: {note}", file=sys.stderr)
    try:
        account = look_up_account(args.workspace)
        ids = LaunchIds.new()
        commands = prepare(args, account, ids)
    except LaunchError as error:
        print(f"mason.py: {error}", file=sys.stderr)
        return 1
    for note in (note for prepared in commands for note in prepared.notes):
        print(f"mason.py: {note}", file=sys.stderr)
    text = spec_to_yaml(build_spec(args, commands, account, ids))
    reason = _no_submit_reason(args)
    if reason is None:
        return submit(text, args.workspace)
    # The command that would submit it, beside the spec (a YAML comment, so stdout stays valid YAML): the
    # workspace goes only to the beaker command line, not into the spec.
    command = shlex.join(beaker_command("experiment.yaml", args.workspace))
    print(f"mason.py: not submitting ({reason}); printing the experiment spec", file=sys.stderr)
    print(f"mason.py: would run: {command}  (experiment.yaml = the spec on stdout)", file=sys.stderr)
    sys.stdout.write(f"# {command}\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
