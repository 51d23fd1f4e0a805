"""A command's argv as one `bash -c` string, and what mason does to a grpo_fast.py command: the entities,
resumable state and Weka outputs open-instruct's mason.py adds, the dataset cache key, and the local
`--cache_dataset_only` run that produces it. Pure functions over argv tokens."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from open_instruct.launch.settings import TRAINING_ENTRY, WEKA_CLUSTERS, Account, LaunchIds, MasonArgs

SHELL_OPERATORS = ("&&", "||", ";")
# Flags the local caching run leaves out (True: the flag takes a value): tracking and resumable state
# are the job's business, not the tokenizer's.
CACHE_EXCLUDED_FLAGS = {
    "--with_tracking": False,
    "--checkpoint_state_freq": True,
    "--checkpoint_state_dir": True,
    "--gs_checkpoint_state_dir": True,
}
CACHE_KEY_FLAGS = ("--dataset_config_hash", "--dataset_config_eval_hash")
CACHE_KEYS_LINE = "dataset cache keys:"  # what grpo_fast.py --cache_dataset_only prints on stdout
DEFAULT_CACHE_DIR = "local_dataset_cache"  # grpo_fast.py's --dataset_local_cache_dir default
_SHELL_VARIABLE = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class Prepared:
    """A command after mason's rewrites, and one line per rewrite for the user."""

    tokens: tuple[str, ...]
    notes: tuple[str, ...] = ()


def detach_operators(tokens: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Operators written against a word become their own tokens: a script's `\\&\\&python` reaches us as
    `&&python`, which bash in the container (open-instruct joins tokens unquoted) reads as `&& python`. An
    operator inside a word (`a&&b`) stays part of it."""
    out: list[str] = []
    for token in tokens:
        tail: list[str] = []
        for op in SHELL_OPERATORS if token not in SHELL_OPERATORS else ():
            if token.startswith(op) and len(token) > len(op):
                out.append(op)
                token = token[len(op) :]
            if token.endswith(op) and len(token) > len(op):
                tail.insert(0, op)
                token = token[: -len(op)]
        out += [token, *tail]
    return tuple(out)


def build_command(tokens: list[str] | tuple[str, ...]) -> str:
    """Rebuild argv tokens into one shell string: operators bare, `$NAME` references left to expand in the
    container, everything else literal.

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
            parts.append(quote(token))
            expect_command = False
    if not parts:
        raise ValueError("empty command")
    if parts[-1] in ("&&", "||"):  # a trailing ';' is valid shell, a trailing '&&' is not
        raise ValueError(f"{parts[-1]!r} has no command after it")
    return " ".join(parts)


def quote(token: str) -> str:
    """Single quotes make a token literal. A token naming `$NAME` or `${NAME}` (open-instruct's scripts pass
    `$CODE_API_URL/test_program`, set in the container by code_api_setup.sh) gets double quotes instead, in
    which only those references expand: backslashes, quotes, backticks and any other `$` are escaped."""
    if not _SHELL_VARIABLE.search(token):
        return shlex.quote(token)
    escaped = re.sub(r'([\\"`])', r"\\\1", token)
    escaped = re.sub(r"\$(?!\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_])", r"\\$", escaped)
    return f'"{escaped}"'


def entry_segment(tokens: tuple[str, ...]) -> tuple[int, int] | None:
    """[start, end) of grpo_fast.py's arguments: from after the script to the next shell operator."""
    for i, token in enumerate(tokens):
        if token == TRAINING_ENTRY or token.endswith("/" + TRAINING_ENTRY):
            end = next((j for j in range(i + 1, len(tokens)) if tokens[j] in SHELL_OPERATORS), len(tokens))
            return i + 1, end
    return None


def trainer_args(tokens: tuple[str, ...]) -> tuple[str, ...]:
    segment = entry_segment(tokens)
    return tokens[segment[0] : segment[1]] if segment else ()


def without_flags(args: list[str], flags: dict[str, bool]) -> list[str]:
    """`args` less each flag in `flags` (True: with its value, unless the next token is another flag)."""
    kept: list[str] = []
    i = 0
    while i < len(args):
        name = args[i].split("=", 1)[0]
        if name in flags:
            takes_value = flags[name] and "=" not in args[i]
            i += 2 if takes_value and i + 1 < len(args) and not args[i + 1].startswith("--") else 1
            continue
        kept.append(args[i])
        i += 1
    return kept


def flag_value(args: list[str] | tuple[str, ...], flag: str) -> str | None:
    """The last value given to `flag` (`--flag v` or `--flag=v`), the one argparse keeps."""
    value = None
    for i, token in enumerate(args):
        if token == flag and i + 1 < len(args):
            value = args[i + 1]
        elif token.startswith(flag + "="):
            value = token.split("=", 1)[1]
    return value


def rewrite_training(
    args: MasonArgs, tokens: tuple[str, ...], account: Account, ids: LaunchIds, cache_keys: tuple[str, ...] = ()
) -> Prepared:
    """A grpo_fast.py command with mason's additions (any other command unchanged). An external user's
    command keeps its directories: the automatic ones are on Ai2's Weka."""
    segment = entry_segment(tokens)
    if segment is None:
        return Prepared(tokens)
    start, end = segment
    trainer = list(tokens[start:end])
    added: list[str] = []  # in front: the command's own tokens stay last, where a repeated flag wins
    notes = []
    for flag, value in (("--hf_entity", "allenai"), ("--wandb_entity", "ai2-llm")):
        if not any(flag.removeprefix("--") in token for token in trainer):  # open-instruct's own test
            added += [flag, value]
    if not account.external:
        for rewrite in (resumable_state_dir, weka_output_dir):
            trainer, flag_and_path, note = rewrite(args, trainer, account, ids)
            added += flag_and_path
            notes += [note] if note else []
    added += new_cache_keys(cache_keys, trainer)
    return Prepared((*tokens[:start], *added, *trainer, *tokens[end:]), tuple(notes))


def _with_ttl(path: str, ttl: str | None) -> str:
    return f"{path}/tmp-{ttl}" if ttl else path


# Each rewrite: (the command's arguments less what it replaces, the flag and value it adds, a note).
Rewrite = tuple[list[str], list[str], str | None]


def resumable_state_dir(args: MasonArgs, trainer: list[str], account: Account, ids: LaunchIds) -> Rewrite:
    """A state directory of this launch's own: every Beaker retry of it resumes from there."""
    given = flag_value(trainer, "--checkpoint_state_dir")
    # A state directory on Weka is the user's own, e.g. to continue an earlier run.
    if not args.resumable or not args.auto_checkpoint_state_dir or (given is not None and "/weka/" in given):
        return trainer, [], None
    base = f"{args.auto_checkpoint_state_dir.rstrip('/')}/{account.user}/{ids.state_dir_name}"
    path = _with_ttl(base, args.artifact_ttl)
    note = f"--checkpoint_state_dir set to {path} (resumable; --non_resumable keeps yours)"
    return without_flags(trainer, {"--checkpoint_state_dir": True}), ["--checkpoint_state_dir", path], note


def weka_output_dir(args: MasonArgs, trainer: list[str], account: Account, ids: LaunchIds) -> Rewrite:
    """On a Weka cluster the outputs go to Weka, where evaluation jobs and people can read them."""
    given = flag_value(trainer, "--output_dir")
    on_weka = any(cluster in WEKA_CLUSTERS for cluster in args.clusters)
    if not args.auto_output_dir_path or not on_weka or (given is not None and "/weka/" in given):
        return trainer, [], None
    path = _with_ttl(f"{args.auto_output_dir_path.rstrip('/')}/{account.user}", args.artifact_ttl) + "/"
    note = f"--output_dir set to {path} (a Weka cluster; --auto_output_dir_path '' keeps yours)"
    return without_flags(trainer, {"--output_dir": True}), ["--output_dir", path], note


def new_cache_keys(cache_keys: tuple[str, ...], trainer: list[str]) -> list[str]:
    """The (flag, key) pairs of `cache_keys` whose flag the command does not already give."""
    pairs = zip(cache_keys[::2], cache_keys[1::2])
    return [token for flag, key in pairs if flag_value(trainer, flag) is None for token in (flag, key)]


def caching_command(tokens: tuple[str, ...], python: str, entry: str) -> list[str] | None:
    """The local `--cache_dataset_only` run of a grpo_fast.py command (None: it trains nothing)."""
    segment = entry_segment(tokens)
    if segment is None:
        return None
    trainer = without_flags(list(tokens[segment[0] : segment[1]]), CACHE_EXCLUDED_FLAGS)
    return [python, entry, *trainer, "--cache_dataset_only"]


def cache_readable_by_job(args: MasonArgs, tokens: tuple[str, ...]) -> bool:
    """The job can reuse the cache only where it sees the same directory: its working directory when it runs
    from this one (no --pure_docker_mode), or a Weka path that every cluster of the task mounts."""
    cache_dir = flag_value(trainer_args(tokens), "--dataset_local_cache_dir") or DEFAULT_CACHE_DIR
    return not args.pure_docker_mode or (cache_dir.startswith("/weka/") and args.on_weka)


def parse_cache_keys(output: str) -> tuple[str, ...]:
    """('--dataset_config_hash', KEY, ...) from grpo_fast.py --cache_dataset_only's output."""
    for line in output.splitlines():
        if line.startswith(CACHE_KEYS_LINE):
            tokens = tuple(line.removeprefix(CACHE_KEYS_LINE).split())
            return tokens if len(tokens) % 2 == 0 and set(tokens[::2]) <= set(CACHE_KEY_FLAGS) else ()
    return ()
