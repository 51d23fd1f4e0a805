"""`generic_sandbox`: open-instruct's coding environment (`execute_bash`, `str_replace_editor`) on our code service.

Why: open-instruct starts a Docker container per sample for this environment. Docker is not available on
our machines, and we already run a sandboxed code service (`code_server`, the `python` tool's `/execute`).
That service gained one honest piece for this: `/execute` with `"language": "bash"` runs a shell command in
the same kind of sandbox (network, mount and PID namespaces, read-only root, a dropped uid, rlimits), with
the sample's workspace unpacked into it and packed back into the reply. Bash runs only where those kernel
layers are up: the Python audit hook that also guards the `python` tool cannot watch a shell.

Per-sample state lives here, not in the service: this environment holds the sample's workspace (its files,
in memory) and the shell's exported variables and working directory, sends them with each command and keeps
what comes back. We chose that over sessions in the service because the service stays stateless: nothing to
leak when a sample ends (our environments have no close hook), nothing lost when the service restarts, and a
retried request is harmless because a step is a function of (workspace, shell state, command). The editor
works on the carried workspace directly, without starting a sandbox.

Same as open-instruct: the two tools, their argument names and the editor's commands (view, create,
str_replace, insert); `reset(task_prompt=...)`; fresh `input/` and `output/` directories; the observation
layout ("Exit code: N", [STDOUT], [STDERR]; editor errors as "ERROR: ..."); long output cut to its first and
last 40 lines; exit code 124 on a timeout; reward 0 for exit code 0 and `penalty` for any other exit code,
editor error or unknown function; the config keys `penalty`, `timeout`, `write_prompt_file` (the prompt goes
to ~/prompt.txt, which here is in the workspace).

Different, and why:
* the workspace is a directory of the service (`workspace_path` in its /health, the same for every command of
  a service), not /testbed, and relative editor paths are relative to it; `python` in the shell is the
  service's interpreter with its packages, not the python:3.12-slim image; no git repository is initialised;
* only the workspace persists between commands, with the exported variables and the directory: the rest of the
  filesystem is read-only (TMPDIR points into the workspace), there is no network, and whatever a command
  left running is stopped when it ends;
* `timeout` defaults to 30 s and may be at most 45 (open-instruct: 300): the rollout gives an environment step
  60 s, and the service's --max_execution_time_cap (60 s) bounds a command too;
* output beyond the service's cap (1 MB) stops the command and its workspace changes are lost (the reply says
  so); a workspace is at most the service's 64 MB work dir, a 16 MB archive and 10,000 entries (a command
  that leaves more keeps none of its changes, and the reply says so), and it is packed and unpacked in a
  thread, off the engine's event loop;
* `backend` is "code_server" (our service, at `api_endpoint`, default $CODE_API_URL's /execute); the Docker
  settings `backend: docker`, another `image` or a `mem_limit` are refused in one line (the memory limit is the
  service's --memory_limit_mb);
* like every environment `--tools` lists, it joins every row's rollout (besides the environments the row's
  `env_config` names), as in open-instruct, which is how its sandbox scripts use it.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import posixpath
import shlex
import tarfile
from dataclasses import dataclass, field
from typing import Any

from open_instruct.agents.base import (
    ENV_STEP_TIMEOUT_S,
    Role,
    StepResult,
    ToolCall,
    ToolDefinition,
    default_execute_url,
)
from open_instruct.agents.http_client import HttpClient
from open_instruct.agents.parsers import coerce_args
from open_instruct.extensions import register_environment
from open_instruct.rewards.code_tests import code_api_headers

ENV_NAME = "generic_sandbox"
_KEEP_LINES = 40  # long output keeps its first and last 40 lines
_MAX_WORKSPACE_BYTES = 64 << 20  # what the service's work dir holds; a reply claiming more is refused
_MAX_WORKSPACE_ENTRIES = 10_000  # the service's max_workspace_entries; a reply with more is refused
_PACK_S = 5.0  # the service's workspace_pack_s: it may take this long after the command's own limit
_HTTP_MARGIN_S = 5.0
_RETRIES = 2  # a step is a pure function of what it sends, so resending it is safe
_ROOTS: dict[str, str] = {}  # service URL -> its workspace path (learned once per process)

EXECUTE_BASH = ToolDefinition(
    "execute_bash",
    "Run a bash command in the sandbox's workspace and see its exit code, stdout and stderr.\n"
    "* Files in the workspace, exported variables and the current directory are kept for the next command.\n"
    "* Nothing interactive: give input through pipes or flags. Stop long commands with `timeout`.\n"
    "* Long output is cut in the middle; filter it with head, tail or grep.",
    {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The bash command to run."}},
        "required": ["command"],
    },
)
STR_REPLACE_EDITOR = ToolDefinition(
    "str_replace_editor",
    "View, create and edit files in the sandbox.\n"
    "* `view` shows a file with line numbers, or a directory two levels deep.\n"
    "* `create` writes a new file; `str_replace` replaces text that occurs exactly once; `insert` adds text "
    "after a line.\n* Changes stay for the rest of the task.",
    {
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "enum": ["view", "create", "str_replace", "insert"],
                "description": "What to do.",
            },
            "path": {
                "type": "string",
                "description": "The file or directory (absolute, or relative to the workspace).",
            },
            "file_text": {"type": "string", "description": "`create`: the whole content of the new file."},
            "old_str": {"type": "string", "description": "`str_replace`: the text to replace; it must occur once."},
            "new_str": {"type": "string", "description": "`str_replace`, `insert`: the new text."},
            "insert_line": {"type": "integer", "description": "`insert`: the line after which the text goes (0: top)."},
            "view_range": {
                "type": "array",
                "items": {"type": "integer"},
                "description": "`view`: optional [first, last] line to show; last -1 means to the end.",
            },
        },
        "required": ["command", "path"],
    },
)


def middle_cut(text: str, keep: int = _KEEP_LINES) -> str:
    """The first and last `keep` lines of a long text, with a marker saying how many were left out."""
    lines = text.splitlines()
    if len(lines) <= 2 * keep:
        return text
    omitted = len(lines) - 2 * keep
    return "\n".join([*lines[:keep], f"[... {omitted} lines omitted ...]", *lines[-keep:]])


class EditorError(Exception):
    """A str_replace_editor problem the model caused: shown as "ERROR: ..." and penalised."""


@dataclass
class _Entry:
    kind: str  # "file", "dir" or "symlink"
    data: bytes = b""
    mode: int = 0o644
    target: str = ""


@dataclass
class Workspace:
    """A sample's files, by path relative to the workspace root, as tar.gz archives carry them."""

    entries: dict[str, _Entry] = field(default_factory=dict)

    def is_dir(self, rel: str) -> bool:
        if rel == "" or (rel in self.entries and self.entries[rel].kind == "dir"):
            return True
        return any(path.startswith(rel + "/") for path in self.entries)

    def add_dirs(self, rel: str) -> None:
        """The directories leading to `rel` (not `rel` itself); an existing file on the way is an error."""
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            parent = "/".join(parts[:i])
            entry = self.entries.get(parent)
            if entry is not None and entry.kind != "dir":
                raise EditorError(f"{parent!r} is a file, not a directory")
            self.entries.setdefault(parent, _Entry("dir", mode=0o755))

    def pack(self) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
            for path in sorted(self.entries):
                entry = self.entries[path]
                info = tarfile.TarInfo(path)
                info.mode = entry.mode
                if entry.kind == "dir":
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif entry.kind == "symlink":
                    info.type, info.linkname = tarfile.SYMTYPE, entry.target
                    tar.addfile(info)
                else:
                    info.size = len(entry.data)
                    tar.addfile(info, io.BytesIO(entry.data))
        return buffer.getvalue()

    @classmethod
    def unpack(cls, archive: bytes) -> Workspace:
        """Read an archive into memory (nothing touches this machine's disk); refuses one over 64 MB unpacked."""
        entries, total = {}, 0
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            for count, member in enumerate(tar, 1):
                if count > _MAX_WORKSPACE_ENTRIES:
                    raise ValueError(f"the workspace has more than {_MAX_WORKSPACE_ENTRIES} entries")
                path = posixpath.normpath(member.name)
                if path in (".", "") or path.startswith(("/", "..")):
                    continue
                if member.isdir():
                    entries[path] = _Entry("dir", mode=member.mode)
                elif member.issym():
                    entries[path] = _Entry("symlink", mode=member.mode, target=member.linkname)
                elif member.isreg():
                    total += member.size
                    if total > _MAX_WORKSPACE_BYTES:
                        raise ValueError(f"the workspace unpacks to more than {_MAX_WORKSPACE_BYTES} bytes")
                    reader = tar.extractfile(member)
                    entries[path] = _Entry("file", reader.read() if reader else b"", member.mode)
        return cls(entries)


def _service_base(api_endpoint: str) -> str:
    return api_endpoint.rstrip("/").removesuffix("/execute")


@register_environment(ENV_NAME)
class SandboxEnv:
    """execute_bash + str_replace_editor over one sample's workspace (see the module docstring)."""

    response_role: Role = "tool"

    def __init__(
        self,
        *,
        backend: str = "code_server",
        image: str = "python:3.12-slim",
        mem_limit: str = "4g",
        penalty: float = -0.05,
        write_prompt_file: bool = False,
        timeout: float = 30.0,
        api_endpoint: str | None = None,
    ) -> None:
        prefix = f"--tool_configs for {ENV_NAME!r}:"
        if backend != "code_server":
            raise ValueError(
                f"{prefix} backend {backend!r} is not available; commands run in our code service "
                "(backend 'code_server', at api_endpoint)"
            )
        if image != "python:3.12-slim":
            raise ValueError(f"{prefix} 'image' is a Docker setting; commands run with the code service's interpreter")
        if mem_limit != "4g":
            raise ValueError(f"{prefix} 'mem_limit' is a Docker setting; start the code service with --memory_limit_mb")
        most = ENV_STEP_TIMEOUT_S - _PACK_S - 2 * _HTTP_MARGIN_S
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= most:
            raise ValueError(
                f"{prefix} 'timeout' must be in (0, {most:g}] seconds per command, got {timeout!r} "
                f"(an environment step gets {ENV_STEP_TIMEOUT_S:g} s)"
            )
        if isinstance(penalty, bool) or not isinstance(penalty, int | float):
            raise ValueError(f"{prefix} 'penalty' must be a number, got {penalty!r}")
        self.penalty = float(penalty)
        self.timeout = float(timeout)
        self.write_prompt_file = bool(write_prompt_file)
        self.api_endpoint = api_endpoint or default_execute_url()
        self.workspace = Workspace()
        self.shell_state = ""
        self.step_count = 0

    @classmethod
    def tool_definitions(cls) -> tuple[ToolDefinition, ...]:
        return (EXECUTE_BASH, STR_REPLACE_EDITOR)

    async def reset(self, **kwargs: Any) -> None:
        """A fresh workspace with input/ and output/ (and ~/prompt.txt with write_prompt_file). The service is asked
        once per process whether it runs bash: a service that cannot is a ValueError naming the fix."""
        self.workspace = Workspace({"input": _Entry("dir", mode=0o755), "output": _Entry("dir", mode=0o755)})
        self.shell_state = ""
        self.step_count = 0
        task_prompt = kwargs.get("task_prompt")
        if self.write_prompt_file and task_prompt:
            self.workspace.entries["prompt.txt"] = _Entry("file", str(task_prompt).encode())
        await self._root()

    async def _root(self) -> str | None:
        """The service's workspace path; None while the service does not answer (commands then say why)."""
        base = _service_base(self.api_endpoint)
        if base in _ROOTS:
            return _ROOTS[base]
        http = HttpClient()
        try:
            status, _, text = await http.request("GET", base + "/health", None, _HTTP_MARGIN_S, code_api_headers(), 0)
        except Exception:
            return None
        finally:
            await http.close()
        if status != 200:
            return None
        health = json.loads(text)
        if not health.get("bash"):
            raise ValueError(
                f"{ENV_NAME}: the code service at {base} cannot run bash (it needs root for its kernel sandbox "
                "layers); start it as root, e.g. with code_api_setup.sh"
            )
        _ROOTS[base] = health["workspace_path"]
        return _ROOTS[base]

    async def step(self, call: ToolCall) -> StepResult:
        self.step_count += 1
        definition = {d.name: d for d in self.tool_definitions()}.get(call.name)
        if definition is None:
            message = f"Unknown function {call.name!r}; use execute_bash or str_replace_editor."
            return StepResult(f"ERROR: {message}", reward=self.penalty, error=message)
        try:
            args = coerce_args(definition, call.args)
        except ValueError as error:
            return self._failed(call.name, str(error))
        if call.name == "execute_bash":
            command = args.get("command")
            if not isinstance(command, str) or not command.strip():
                return self._failed("execute_bash", "'command' is required")
            return await self._bash(command)
        try:
            return StepResult(f"Execution output of [str_replace_editor]:\n{await self._edit(args)}")
        except EditorError as error:
            return self._failed("str_replace_editor", str(error))

    def _failed(self, tool: str, message: str) -> StepResult:
        return StepResult(f"Execution output of [{tool}]:\nERROR: {message}", reward=self.penalty, error=message)

    # ------------------------------------------------------------------------------------------ execute_bash

    async def _run(self, command: str) -> dict[str, Any]:
        """One command through the service; raises RuntimeError with a line for the model when it fails."""
        payload = {
            "code": command,
            "language": "bash",
            "timeout": self.timeout,
            "workspace": await self.pack_workspace(self.workspace),
            "shell_state": self.shell_state,
        }
        http = HttpClient()
        try:
            wait_s = self.timeout + _PACK_S + _HTTP_MARGIN_S
            headers = code_api_headers()
            status, reason, text = await http.request("POST", self.api_endpoint, payload, wait_s, headers, _RETRIES)
        except TimeoutError:
            raise RuntimeError(f"the sandbox service did not answer within {wait_s:g} s") from None
        except Exception as error:
            raise RuntimeError(f"the sandbox service is unreachable: {type(error).__name__}: {error}") from None
        finally:
            await http.close()
        if status != 200:
            try:
                detail = json.loads(text).get("error", text)
            except ValueError:
                detail = text
            raise RuntimeError(f"the sandbox service answered HTTP {status} {reason}: {str(detail)[:300]}")
        reply = json.loads(text)
        if reply.get("workspace") is not None:
            try:
                self.workspace = await self.unpack_workspace(reply["workspace"])
            except (tarfile.TarError, ValueError, EOFError, OSError) as error:
                raise RuntimeError(f"the workspace in the reply is unusable: {error}") from None
            self.shell_state = reply.get("shell_state", self.shell_state)
        if reply.get("workspace_path"):
            _ROOTS[_service_base(self.api_endpoint)] = reply["workspace_path"]
        return reply

    @staticmethod
    async def pack_workspace(workspace: Workspace) -> str:
        # In a thread: packing (and unpacking) a large workspace must not stall the engine's event loop.
        return await asyncio.to_thread(lambda: base64.b64encode(workspace.pack()).decode())

    @staticmethod
    async def unpack_workspace(text: str) -> Workspace:
        return await asyncio.to_thread(lambda: Workspace.unpack(base64.b64decode(text)))

    async def _bash(self, command: str) -> StepResult:
        try:
            reply = await self._run(command)
        except (RuntimeError, ValueError) as error:  # the service's problem, not the model's: no penalty
            message = f"Sandbox error: {error}"
            return StepResult(message, error=message)
        exit_code = reply.get("exit_code")
        stderr = reply.get("error", "")
        if reply.get("status") == "timeout" and exit_code == 124:
            stderr = f"Timed out after {self.timeout:g} s; the command was stopped.\n" + stderr
        notes = "".join(f"[sandbox] {note}\n" for note in reply.get("notes", ()))
        if exit_code is None:
            exit_code = 137  # stopped by the service (128 + SIGKILL)
        observation = (
            f"Exit code: {exit_code}\nExecution output of [execute_bash]:\n"
            f"[STDOUT]\n{middle_cut(reply.get('output', ''))}\n[STDERR]\n{middle_cut(stderr + notes)}"
        )
        return StepResult(observation, reward=0.0 if exit_code == 0 else self.penalty)

    # ------------------------------------------------------------------------------------- str_replace_editor

    def _resolve(self, path: str, root: str | None) -> str | None:
        """The workspace-relative path, or None for a path outside the workspace."""
        normal = posixpath.normpath(path)
        if not path.startswith("/"):
            return None if normal == ".." or normal.startswith("../") else ("" if normal == "." else normal)
        if root is not None and (normal == root or normal.startswith(root + "/")):
            return normal[len(root) + 1 :]
        return None

    async def _edit(self, args: dict[str, Any]) -> str:
        command, path = args.get("command"), args.get("path")
        if not isinstance(path, str) or not path:
            raise EditorError("'path' is required")
        if command not in ("view", "create", "str_replace", "insert"):
            raise EditorError(f"unknown command {command!r}; use view, create, str_replace or insert")
        root = await self._root()
        rel = self._resolve(path, root)
        if path.startswith("/") or root is None:
            shown = posixpath.normpath(path) if path.startswith("/") else rel or "."
        else:
            shown = posixpath.join(root, rel) if rel else root
        if command == "view":
            if rel is None:
                return await self._view_outside(path, args.get("view_range"))
            return self._view(rel, shown, args.get("view_range"))
        if rel is None:
            raise EditorError(
                f"{path} is outside the workspace ({root or 'the sandbox directory'}), which alone is writable"
            )
        if command == "create":
            return self._create(rel, shown, args.get("file_text"))
        return self._change(rel, shown, command, args)

    def _create(self, rel: str, shown: str, text: Any) -> str:
        ws = self.workspace
        if not isinstance(text, str):
            raise EditorError("'file_text' is required for create")
        if ws.is_dir(rel):
            raise EditorError(f"{shown} is a directory")
        if rel in ws.entries:
            raise EditorError(f"{shown} already exists; change it with str_replace or insert")
        ws.add_dirs(rel)
        ws.entries[rel] = _Entry("file", text.encode())
        return f"Created {shown}."

    def _change(self, rel: str, shown: str, command: str, args: dict[str, Any]) -> str:
        """str_replace or insert on an existing file of the workspace."""
        ws = self.workspace
        entry = ws.entries.get(rel)
        if entry is None or entry.kind != "file":
            raise EditorError(
                f"{shown} is not a file" if entry is not None or ws.is_dir(rel) else f"{shown} does not exist"
            )
        content = entry.data.decode("utf-8", errors="replace")
        new = args.get("new_str")
        if not isinstance(new, str):
            raise EditorError(f"'new_str' is required for {command}")
        if command == "str_replace":
            old = args.get("old_str")
            if not isinstance(old, str) or not old:
                raise EditorError("'old_str' is required for str_replace")
            count = content.count(old)
            if count != 1:
                where = "does not occur" if count == 0 else f"occurs {count} times"
                raise EditorError(f"old_str {where} in {shown}; it must occur exactly once")
            content = content.replace(old, new, 1)
        else:
            line = args.get("insert_line")
            if not isinstance(line, int):
                raise EditorError("'insert_line' is required for insert")
            lines = content.splitlines(keepends=True)
            at = max(0, min(line, len(lines)))
            if at and not lines[at - 1].endswith("\n"):
                lines[at - 1] += "\n"
            lines[at:at] = (new if new.endswith("\n") else new + "\n").splitlines(keepends=True)
            content = "".join(lines)
        entry.data = content.encode()
        return f"Edited {shown}; check the result with view."

    def _view(self, rel: str, shown: str, view_range: Any) -> str:
        ws = self.workspace
        entry = ws.entries.get(rel)
        if entry is None and ws.is_dir(rel):
            entry = _Entry("dir")
        if entry is None:
            raise EditorError(f"{shown} does not exist")
        if entry.kind == "symlink":
            raise EditorError(f"{shown} is a symbolic link to {entry.target}; view its target")
        if entry.kind == "dir":
            # Two levels deep, hidden names left out, sorted, at most 100 lines (as `find -maxdepth 2 | sort`).
            prefix = rel + "/" if rel else ""
            below = [
                p[len(prefix) :]
                for p in ws.entries
                if p.startswith(prefix) and p != rel and p[len(prefix) :].count("/") < 2
            ]
            visible = sorted(
                posixpath.join(shown, p) for p in below if not any(part.startswith(".") for part in p.split("/"))
            )
            return "\n".join([shown, *visible][:100])
        return middle_cut(_numbered(entry.data.decode("utf-8", errors="replace"), view_range))

    async def _view_outside(self, path: str, view_range: Any) -> str:
        """A path outside the workspace (the read-only system files) is read by a command in the sandbox."""
        quoted = shlex.quote(path)
        # Exit 10 says "a directory", 11 "a file"; anything else is the error.
        command = (
            f"if [ -d {quoted} ]; then find {quoted} -maxdepth 2 -not -path '*/.*' | sort | head -100; exit 10; fi; "
            f"cat -- {quoted} && exit 11"
        )
        try:
            reply = await self._run(command)
        except (RuntimeError, ValueError) as error:
            raise EditorError(f"cannot read {path}: {error}") from None
        text = reply.get("output", "")
        if reply.get("exit_code") == 10:
            return middle_cut(text.rstrip("\n"))
        if reply.get("exit_code") == 11:
            return middle_cut(_numbered(text, view_range))
        raise EditorError(f"cannot read {path}: {reply.get('error', '').strip() or 'no such file'}")

    def metrics(self) -> dict[str, float]:
        return {"step_count": float(self.step_count)}


def _numbered(text: str, view_range: Any) -> str:
    """`cat -n` numbering, optionally only lines [first, last] (last -1: to the end)."""
    if isinstance(view_range, str):
        try:
            view_range = json.loads(view_range)
        except ValueError:
            raise EditorError(f"view_range must be [first, last], got {view_range!r}") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    first, last = 1, len(lines)
    if view_range is not None:
        if not (isinstance(view_range, list) and len(view_range) == 2 and all(isinstance(n, int) for n in view_range)):
            raise EditorError(f"view_range must be [first, last], got {view_range!r}")
        first, last = view_range[0], len(lines) if view_range[1] == -1 else view_range[1]
        if first < 1 or last < first:
            raise EditorError(f"view_range {view_range} is not a range of lines (the file has {len(lines)})")
    return "\n".join(f"{n:6}\t{lines[n - 1]}" for n in range(first, min(last, len(lines)) + 1))
