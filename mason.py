"""mason.py: build a Beaker experiment for commands and submit it with the `beaker` CLI, or print it (with
--dry_run, without that CLI or without Beaker credentials).

A drop-in replacement for open-instruct's own mason.py: every option of it (at the commit the tests record)
is accepted with its default and its meaning in the spec, so its launch scripts run unchanged; where its
behaviour is a bug this one differs on purpose. Each `--` starts a command, one Beaker task, which every
replica runs with `bash -c`: its tokens arrive unchanged, except that &&, || and ; stay operators (escape
them here: `\\&\\&`) and `$NAME` expands in the container. A multi-node command begins with `source
configs/beaker_configs/ray_node_setup.sh`. docs/multi_node.md is the manual: each option's place in the spec,
what a grpo_fast.py command gets, and each difference. PyYAML is the one package needed beside the standard
library; the caching runs grpo_fast.py with the repository's `.venv`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from open_instruct.config.fields import out_of_bounds
from open_instruct.launch.beaker_spec import DEFAULT_ENV, build_spec, spec_to_yaml
from open_instruct.launch.commands import (
    CACHE_KEY_FLAGS,
    CACHE_KEYS_LINE,
    Prepared,
    build_command,
    detach_operators,
    entry_segment,
    flag_value,
    rewrite_training,
    without_flags,
)
from open_instruct.launch.settings import TRAINING_ENTRY, Account, LaunchIds, MasonArgs

REPO = Path(__file__).resolve().parent
# W&B settings of the launching shell that the job inherits.
PASSED_THROUGH_ENV = ("WANDB_ENTITY", "WANDB_PROJECT", "WANDB_TAGS")
# Flags the local caching run leaves out (True: the flag takes a value): tracking and resumable state
# are the job's business, not the tokenizer's.
CACHE_EXCLUDED_FLAGS = {
    "--with_tracking": False,
    "--checkpoint_state_freq": True,
    "--checkpoint_state_dir": True,
    "--gs_checkpoint_state_dir": True,
}
DEFAULT_CACHE_DIR = "local_dataset_cache"  # grpo_fast.py's --dataset_local_cache_dir default


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mason.py",
        description=__doc__,
        usage="python mason.py [options] -- COMMAND [ARGS...] [-- COMMAND [ARGS...] ...]",
        epilog=f"Every task gets {' '.join(f'{k}={v}' for k, v in DEFAULT_ENV.items())}, unless --env says otherwise.",
        allow_abbrev=False,  # an abbreviation silently matching another option is worse than an error
    )
    MasonArgs.add_options(parser)
    parser.set_defaults(description=os.environ.get("RUN_NAME", MasonArgs.description))  # depends on where mason runs
    return parser


def parse_args(argv: list[str], environ: dict[str, str] | None = None) -> MasonArgs:
    """Parse mason's own options and the commands after `--`. Usage errors exit with status 2."""
    environ = dict(os.environ if environ is None else environ)
    parser = _build_parser()
    own, rest = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, None)
    ns = parser.parse_args(own)  # --help and every per-option error first
    if rest is None:
        parser.error("missing `-- COMMAND`: put the command to run after `--`")
    # Every `--` starts a new command.
    groups = itertools.groupby(rest, key=lambda token: token == "--")
    commands = [detach_operators(list(tokens)) for separator, tokens in groups if not separator]
    if not commands or any(all(not token.strip() for token in command) for command in commands):
        parser.error("empty command after `--`")
    for command in commands:
        try:
            build_command(command)
        except ValueError as e:
            parser.error(f"command after `--`: {e}")
    names = [name for name, _ in (*ns.env, *ns.secrets)]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        parser.error(f"argument --env/--secret: {', '.join(duplicates)} set more than once (each variable once)")
    args = MasonArgs.from_namespace(
        ns,
        commands=tuple(commands),
        local_workdir=os.getcwd(),
        local_path=environ.get("PATH", ""),
        wandb_env=tuple((name, environ[name]) for name in PASSED_THROUGH_ENV if name in environ),
    )
    if problems := out_of_bounds(args):
        parser.error("; ".join(problems))
    return args


def beaker_unavailable() -> str | None:
    """Why the spec cannot be submitted from here (and the account not looked up), or None."""
    if shutil.which("beaker") is None:
        return "no `beaker` CLI on PATH"
    if not os.environ.get("BEAKER_TOKEN") and not Path("~/.beaker/config.yml").expanduser().is_file():
        return "no Beaker credentials (BEAKER_TOKEN or ~/.beaker/config.yml)"
    return None


class LaunchError(Exception):
    """A step before submission failed; nothing was submitted."""


def _beaker_json(*arguments: str) -> Any:
    failed = f"`beaker {' '.join(arguments)}` failed"
    try:
        result = subprocess.run(
            ["beaker", *arguments, "--format", "json"], capture_output=True, text=True, timeout=120, check=True
        )
        return json.loads(result.stdout)
    except subprocess.CalledProcessError as error:
        raise LaunchError(f"{failed}: {error.stderr.strip() or f'exit {error.returncode}'}") from None
    except ValueError as error:
        raise LaunchError(f"{failed}: its output is not JSON ({error})") from None
    except (OSError, subprocess.TimeoutExpired) as error:
        raise LaunchError(f"{failed}: {error}") from None


def look_up_account(workspace: str | None) -> Account:
    """The user and the workspace's secret names, from the beaker CLI; external without it or credentials."""
    if beaker_unavailable():
        return Account()
    try:
        user = _beaker_json("account", "whoami")[0]["name"]
        listed = _beaker_json("secret", "list", *(("--workspace", workspace) if workspace else ()))
        return Account(user, frozenset(item["name"] for item in listed))
    except (KeyError, IndexError, TypeError) as error:
        raise LaunchError(f"the beaker CLI's answer about the account is not understood: {error!r}") from None


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
    # ('--dataset_config_hash', KEY, ...) from the first line naming them; none without one or not understood.
    line = next((line for line in lines if line.startswith(CACHE_KEYS_LINE)), CACHE_KEYS_LINE)
    keys = tuple(line.removeprefix(CACHE_KEYS_LINE).split())
    return keys if len(keys) % 2 == 0 and set(keys[::2]) <= set(CACHE_KEY_FLAGS) else ()


def prepare(args: MasonArgs, account: Account, ids: LaunchIds) -> list[Prepared]:
    """Each command with mason's rewrites and its dataset cache key (the caching runs here, unless a dry run)."""
    venv_python = REPO / ".venv" / "bin" / "python"  # the repository's stack, when it has one
    python = str(venv_python) if venv_python.exists() else sys.executable
    prepared = []
    for tokens in args.commands:
        keys: tuple[str, ...] = ()
        segment = entry_segment(tokens) if args.auto_dataset_cache else None
        if segment:
            script, trainer = tokens[segment[0] - 1], list(tokens[segment[0] : segment[1]])
            entry = script if Path(script).is_file() else str(REPO / TRAINING_ENTRY)  # else this repository's
            caching = [python, entry, *without_flags(trainer, CACHE_EXCLUDED_FLAGS), "--cache_dataset_only"]
            if args.dry_run:
                print(f"mason.py: would cache the datasets first: {shlex.join(caching)}", file=sys.stderr)
            else:
                keys = run_caching(caching)
            # The job can reuse the cache only where it sees the same directory: its working directory when it
            # runs from this one (no --pure_docker_mode), or a Weka path that every cluster of the task mounts.
            cache_dir = flag_value(trainer, "--dataset_local_cache_dir") or DEFAULT_CACHE_DIR
            if keys and args.pure_docker_mode and not (cache_dir.startswith("/weka/") and args.on_weka):
                print(
                    "mason.py: the dataset cache is on this machine only (--pure_docker_mode and a cache "
                    "directory off Weka): the job tokenizes its datasets itself",
                    file=sys.stderr,
                )
                keys = ()
        prepared.append(rewrite_training(args, tokens, account, ids, keys))
    return prepared


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
    for note in args.warnings():
        print(f"mason.py: warning: {note}", file=sys.stderr)
    try:
        account = look_up_account(args.workspace)
        ids = LaunchIds()
        commands = prepare(args, account, ids)
    except LaunchError as error:
        print(f"mason.py: {error}", file=sys.stderr)
        return 1
    for note in (note for prepared in commands for note in prepared.notes):
        print(f"mason.py: {note}", file=sys.stderr)
    text = spec_to_yaml(build_spec(args, commands, account, ids))
    reason = "--dry_run" if args.dry_run else beaker_unavailable()
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
