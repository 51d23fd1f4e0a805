"""One RLVR row -> prompt messages, labels and verifier names; then chat template and tokens.

Split out of `open_instruct.data.dataset` so the per-row rules read in one place. `parse_row`
applies open-instruct's semantics (string `dataset` wraps both columns into one-element
lists; list `dataset` needs as many labels; a trailing assistant turn is dropped when
there is more than one message; --system_prompt_override replaces or inserts the system
message) and validates every verifier name against the registry (after --remap_verifier,
case-insensitively), so an unknown name fails at load time instead of silently scoring 0.
Problems raise `BadRow` with a reason (counted in the report) and a message.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from open_instruct.data.sources import ROW_ERROR_KEY, ROW_KEYS_KEY
from open_instruct.extensions import registered_environments, verifier_key
from open_instruct.messages import AgentRequest, EnvSpec

VERIFIER_KEY = "dataset"  # fixed by the RLVR format: the verifier name(s) of the row
# Malformed-row reasons; the report counts skipped rows per reason.
UNREADABLE = "unreadable row"
MISSING_KEY = "missing key"
WRONG_TYPE = "wrong type"
EMPTY_MESSAGES = "empty messages"
BAD_MESSAGE = "bad message"
UNKNOWN_VERIFIER = "unknown verifier"
LENGTH_MISMATCH = "label/verifier length mismatch"
TEMPLATE_ERROR = "chat template error"
BAD_AGENT_COLUMN = "bad tools/env_config"
TOOLS_KEY, ENV_CONFIG_KEY = "tools", "env_config"  # optional columns of multi-turn rows
SKIP_HINT = "; fix the row or pass --dataset_skip_bad_rows to skip (and count) such rows"
ENCODE_BATCH = 512


@dataclass(frozen=True)
class RowSettings:
    """Every setting that shapes a prompt or a skip decision; all of it goes into the cache key."""

    sft_messages_key: str
    ground_truths_key: str
    max_prompt_token_length: int
    dataset_skip_bad_rows: bool
    add_bos: bool
    system_prompt_override: str | None
    remap: tuple[tuple[str, str], ...]
    known_verifiers: tuple[str, ...]
    tool_names: tuple[str, ...] = ()  # call names of --tools, what a row's `tools` column may list
    known_environments: tuple[str, ...] = ()
    tool_schemas: tuple[tuple[str, str], ...] = ()  # call name -> JSON schema, for the chat template
    # Environments --tools lists: every row plays in them (with no reset arguments of its own) besides the ones
    # its env_config names, as open-instruct starts every configured environment for every sample.
    tools_environments: tuple[str, ...] = ()
    pass_tools_to_chat_template: bool = True


class BadRow(Exception):
    def __init__(self, reason: str, message: str, hint: str = SKIP_HINT):
        super().__init__(message)
        self.reason, self.message, self.hint = reason, message, hint


def parse_row(
    row: dict[str, Any], settings: RowSettings
) -> tuple[list[dict], list[Any], list[str], AgentRequest | None]:
    """(prompt messages, labels, verifier names, multi-turn part) of a valid row; raises BadRow naming the problem."""
    if ROW_ERROR_KEY in row:
        raise BadRow(UNREADABLE, row[ROW_ERROR_KEY])
    for key, flag in (
        (settings.sft_messages_key, "--sft_messages_key"),
        (settings.ground_truths_key, "--ground_truths_key"),
    ):
        if key not in row:
            has = ", ".join(row.get(ROW_KEYS_KEY, ()))
            raise BadRow(MISSING_KEY, f"missing key {key!r} (row has: {has}); {flag} names this column")
    if VERIFIER_KEY not in row:
        has = ", ".join(row.get(ROW_KEYS_KEY, ()))
        raise BadRow(MISSING_KEY, f"missing key {VERIFIER_KEY!r}, the verifier name(s) (row has: {has})")
    messages = _check_messages(row[settings.sft_messages_key], settings.sft_messages_key)
    verifiers, truths = row[VERIFIER_KEY], row[settings.ground_truths_key]
    if truths is None:
        raise BadRow(WRONG_TYPE, f"{settings.ground_truths_key!r} is null")
    if isinstance(verifiers, str) and verifiers:
        verifiers, truths = [verifiers], [truths]
    elif isinstance(verifiers, list) and verifiers and all(isinstance(v, str) and v for v in verifiers):
        labels = f"{len(truths)} labels" if isinstance(truths, list) else f"a {type(truths).__name__}"
        if not isinstance(truths, list) or len(truths) != len(verifiers):
            raise BadRow(
                LENGTH_MISMATCH,
                f"{VERIFIER_KEY!r} lists {len(verifiers)} verifier(s) "
                f"but {settings.ground_truths_key!r} is {labels}; "
                "a list-typed row pairs label i with verifier i",
            )
    else:
        raise BadRow(
            WRONG_TYPE,
            f"{VERIFIER_KEY!r} must be a verifier name or a non-empty list of names, got {verifiers!r}",
        )
    remap = dict(settings.remap)
    for name in verifiers:
        resolved = remap.get(verifier_key(name), verifier_key(name))
        if resolved not in settings.known_verifiers:
            via = f" (remapped to {resolved!r} by --remap_verifier)" if resolved != verifier_key(name) else ""
            close = difflib.get_close_matches(resolved, settings.known_verifiers, n=1, cutoff=0.3)
            raise BadRow(
                UNKNOWN_VERIFIER,
                f"unknown verifier {name!r}{via} (known: {', '.join(settings.known_verifiers)})",
                f"; use --remap_verifier {name}={close[0] if close else 'NEW'} or --dataset_skip_bad_rows",
            )
    if len(messages) > 1 and messages[-1]["role"] == "assistant":
        messages = messages[:-1]  # ORZ-style rows carry the gold answer as a trailing assistant turn
    if settings.system_prompt_override is not None:
        system = {"role": "system", "content": settings.system_prompt_override}
        messages = [system, *messages[1:]] if messages[0]["role"] == "system" else [system, *messages]
    return messages, truths, verifiers, parse_agent_columns(row.get(TOOLS_KEY), row.get(ENV_CONFIG_KEY), settings)


def parse_agent_columns(tools: Any, env_config: Any, settings: RowSettings) -> AgentRequest | None:
    """A row's `tools` (call names it may use) and `env_config` (the environments it plays in).

    `env_config` takes open-instruct's three shapes: one {"env_name", ...reset kwargs} dict (a `max_steps`
    inside it is the row's call limit), a list of such dicts, or {"max_steps"?, "env_configs": [...]}.
    Anything else is a bad row here, where open-instruct silently plays no environment."""
    if tools is None and env_config is None and not settings.tools_environments:
        return None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(name, str) for name in tools)):
        raise BadRow(BAD_AGENT_COLUMN, f"{TOOLS_KEY!r} must be a list of tool call names, got {tools!r}")
    for name in tools or ():
        if name not in settings.tool_names:
            configured = ", ".join(settings.tool_names) or "none"
            raise BadRow(BAD_AGENT_COLUMN, f"tool {name!r} in {TOOLS_KEY!r} is not configured (--tools: {configured})")
    entries, max_steps = _env_entries(env_config)
    envs = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("env_name"), str):
            raise BadRow(BAD_AGENT_COLUMN, f'{ENV_CONFIG_KEY!r} entry {entry!r} has no "env_name"')
        if entry["env_name"] not in settings.known_environments:
            known = ", ".join(settings.known_environments)
            raise BadRow(BAD_AGENT_COLUMN, f"unknown environment {entry['env_name']!r} (known: {known})")
        kwargs = tuple(
            sorted((k, v) for k, v in entry.items() if k not in ("env_name", "is_text_env") and v is not None)
        )
        envs.append(EnvSpec(entry["env_name"], kwargs))
    named = {env.name for env in envs}
    envs += [EnvSpec(name, ()) for name in settings.tools_environments if name not in named]
    if max_steps is not None and not (isinstance(max_steps, int) and max_steps >= 1):
        raise BadRow(BAD_AGENT_COLUMN, f"{ENV_CONFIG_KEY!r} max_steps must be an integer >= 1, got {max_steps!r}")
    return AgentRequest(tools=tuple(tools or ()), envs=tuple(envs), max_steps=max_steps)


def _env_entries(env_config: Any) -> tuple[list[Any], Any]:
    if env_config is None:
        return [], None
    if isinstance(env_config, list):
        return env_config, None
    if isinstance(env_config, dict) and "env_configs" in env_config:
        entries = env_config["env_configs"]
        if not isinstance(entries, list):
            raise BadRow(BAD_AGENT_COLUMN, f"{ENV_CONFIG_KEY!r} env_configs must be a list, got {entries!r}")
        return entries, env_config.get("max_steps")
    if isinstance(env_config, dict) and "env_name" in env_config:
        entry = dict(env_config)
        return [entry], entry.pop("max_steps", None)
    raise BadRow(
        BAD_AGENT_COLUMN, f"{ENV_CONFIG_KEY!r} must name an env_name (or list env_configs), got {env_config!r}"
    )


def _check_messages(messages: Any, key: str) -> list[dict]:
    if not isinstance(messages, list):
        raise BadRow(WRONG_TYPE, f"{key!r} must be a list of {{role, content}} messages, got {type(messages).__name__}")
    if not messages:
        raise BadRow(EMPTY_MESSAGES, f"{key!r} is an empty list")
    for position, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRow(
                BAD_MESSAGE,
                f"{key!r} message {position} is a {type(message).__name__}, not {{role, content}}",
            )
        for part in ("role", "content"):
            if message.get(part) is None:
                raise BadRow(BAD_MESSAGE, f"{key!r} message {position} has no {part!r}")
            if not isinstance(message[part], str):
                raise BadRow(
                    BAD_MESSAGE,
                    f"{key!r} message {position} {part!r} must be a string, got {type(message[part]).__name__}",
                )
    return messages


def render_prompt(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False)


def row_tool_schemas(agent: AgentRequest | None, settings: RowSettings) -> list[dict]:
    """The schemas the chat template renders for one row: its allowed tools, then its environments' functions."""
    import json

    environments = registered_environments()
    allowed = agent.tools if agent is not None and agent.tools else tuple(name for name, _ in settings.tool_schemas)
    schemas = [json.loads(schema) for name, schema in settings.tool_schemas if name in allowed]
    for env in agent.envs if agent is not None else ():
        schemas += [d.as_openai() for d in environments[env.name].tool_definitions()]
    return schemas


def encode_texts(tokenizer, texts: list[str], add_bos: bool) -> list[list[int]]:
    """Tokenize rendered prompts in batches, exactly as apply_chat_template(tokenize=True) would."""
    ids: list[list[int]] = []
    for start in range(0, len(texts), ENCODE_BATCH):
        ids += [list(x) for x in tokenizer(texts[start : start + ENCODE_BATCH], add_special_tokens=False)["input_ids"]]
    if add_bos:  # OLMo-style models need BOS and most templates do not emit it
        bos = tokenizer.bos_token_id
        ids = [x if x[:1] == [bos] else [bos, *x] for x in ids]
    return ids
