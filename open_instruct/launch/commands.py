"""A command's argv as one `bash -c` string, and what mason does to a grpo_fast.py command: the entities,
resumable state and Weka outputs open-instruct's mason.py adds, and the dataset cache key. Pure functions
over argv tokens."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from open_instruct.launch.settings import TRAINING_ENTRY, WEKA_CLUSTERS, Account, LaunchIds, MasonArgs

# The one line grpo_fast.py --cache_dataset_only prints for mason.py to read: both sides import these.
CACHE_KEY_FLAGS = ("--dataset_config_hash", "--dataset_config_eval_hash")
CACHE_KEYS_LINE = "dataset cache keys:"

SHELL_OPERATORS = ("&&", "||", ";")
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
    if not tokens:
        raise ValueError("empty command")
    for before, token in zip((None, *tokens), tokens):  # bash: "syntax error near unexpected token"
        if token in SHELL_OPERATORS and (before is None or before in SHELL_OPERATORS):
            raise ValueError(f"{token!r} has no command before it")
    if tokens[-1] in ("&&", "||"):  # a trailing ';' is valid shell, a trailing '&&' is not
        raise ValueError(f"{tokens[-1]!r} has no command after it")
    return " ".join(token if token in SHELL_OPERATORS else quote(token) for token in tokens)


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
    """A grpo_fast.py command with mason's additions (any other command unchanged), put in front: the command's
    own tokens stay last, where a repeated flag wins."""
    segment = entry_segment(tokens)
    if segment is None:
        return Prepared(tokens)
    start, end = segment
    trainer = list(tokens[start:end])
    added: list[str] = []
    for flag, value in (("--hf_entity", "allenai"), ("--wandb_entity", "ai2-llm")):
        if not any(flag.removeprefix("--") in token for token in trainer):  # open-instruct's own test
            added += [flag, value]
    # The directories mason chooses, (flag, path, how to keep yours); an external user's command keeps its own,
    # as the automatic ones are on Ai2's Weka.
    chosen = []
    ttl = f"/tmp-{args.artifact_ttl}" if args.artifact_ttl else ""
    if not account.external and args.resumable and args.auto_checkpoint_state_dir:
        # This launch's own, fixed in the spec: every Beaker retry of it resumes from there.
        state = f"{args.auto_checkpoint_state_dir.rstrip('/')}/{account.user}/{ids.state_dir_name}{ttl}"
        chosen.append(("--checkpoint_state_dir", state, "resumable; --non_resumable keeps yours"))
    weka_cluster = any(cluster in WEKA_CLUSTERS for cluster in args.clusters)
    if not account.external and args.auto_output_dir_path and weka_cluster:
        # On Weka, where evaluation jobs and people can read them.
        output = f"{args.auto_output_dir_path.rstrip('/')}/{account.user}{ttl}/"
        chosen.append(("--output_dir", output, "a Weka cluster; --auto_output_dir_path '' keeps yours"))
    notes = []
    for flag, path, keep in chosen:
        given = flag_value(trainer, flag)
        if given is None or "/weka/" not in given:  # one on Weka is the user's own, e.g. to continue a run
            trainer = without_flags(trainer, {flag: True})
            added += [flag, path]
            notes.append(f"{flag} set to {path} ({keep})")
    for key_flag, key in zip(cache_keys[::2], cache_keys[1::2]):
        if flag_value(trainer, key_flag) is None:
            added += [key_flag, key]
    return Prepared((*tokens[:start], *added, *trainer, *tokens[end:]), tuple(notes))
