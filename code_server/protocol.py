"""Request bodies of the HTTP API, decoded and validated, and the stdio output comparison.

Apart from the HTTP handler because the executor needs `TestRequest` and `outputs_match` too. The API
itself is described in `code_server.server`.
"""

from __future__ import annotations

import base64
import binascii
import io
import itertools
import json
import math
import pickle
import zlib
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from code_server.config import SandboxConfig


class BadRequestError(ValueError):
    """The request body is malformed; the message is returned to the client with HTTP 400."""


@dataclass(frozen=True)
class TestRequest:
    program: str
    tests: list[Any]  # assert strings, or {"input": str, "output": str} dicts for stdio
    max_execution_time: float
    stdio: bool


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"pickled tests reference {module}.{name}; only plain lists/dicts/strings/numbers are accepted"
        )


def _inflate(blob: bytes, max_bytes: int) -> bytes:
    # One bounded call: zlib stops after max_bytes + 1 bytes of output, so a small bomb never allocates more.
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(blob, max_bytes + 1)
    except zlib.error as e:
        raise BadRequestError(f"'tests' base64 payload is not zlib-compressed: {e}") from None
    if len(data) > max_bytes:
        raise BadRequestError(f"'tests' decompresses to more than {max_bytes} bytes")
    if not inflater.eof:
        raise BadRequestError("'tests' zlib stream is truncated")
    return data


def _unpickle_plain(blob: bytes, max_bytes: int) -> Any:
    data = _inflate(blob, max_bytes)
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # any malformed pickle: the C unpickler raises many kinds
        raise BadRequestError(f"'tests' base64 payload is not zlib-compressed plain pickle: {e}") from None


def loads_json(text: str | bytes, where: str) -> Any:
    """json.loads whose every failure is a BadRequestError: it also raises RecursionError (deep nesting)
    and a plain ValueError (an integer past Python's int-string limit), which would drop the connection."""
    try:
        return json.loads(text)
    except RecursionError:
        raise BadRequestError(f"{where} is nested too deeply to decode") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, the int-string limit
        raise BadRequestError(f"{where} is not valid JSON: {e}") from None


_END = object()


def check_shape(value: Any, max_depth: int, max_bytes: int | None, where: str) -> None:
    """Refuse a value nested deeper than max_depth or (with max_bytes) larger than it once expanded.

    Iterative, and charged per visit rather than per object: a pickle's memo lets a few bytes stand for
    a list holding one long string a million times, or a tree exponentially larger than its encoding, and
    whatever reads the value next (joining stdio lines, writing the job file) would expand it for real.
    A string costs its length, anything else 8 (an int its size), a rough count of bytes.
    """
    budget = max_bytes
    stack = [iter((value,))]
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
            continue
        if isinstance(item, (str, bytes, bytearray)):
            cost = len(item)
        elif isinstance(item, int):
            cost = 8 + item.bit_length() // 8
        else:
            cost = 8
        if isinstance(item, (list, tuple, dict, set, frozenset)):
            if len(stack) > max_depth:
                raise BadRequestError(f"{where} is nested more than {max_depth} levels deep")
            stack.append(iter(itertools.chain.from_iterable(item.items())) if isinstance(item, dict) else iter(item))
        if budget is not None:
            budget -= cost
            if budget < 0:
                raise BadRequestError(f"{where} expands to more than {max_bytes} bytes")


def decode_tests(raw: Any, config: SandboxConfig) -> Any:
    """A list as is; a string as JSON, else as base64 -> zlib -> pickle (globals refused). The result is
    checked against max_json_depth and max_tests_bytes."""
    value = _decode_tests(raw, config.max_tests_bytes)
    check_shape(value, config.max_json_depth, config.max_tests_bytes, "'tests'")
    return value


def _decode_tests(raw: Any, max_bytes: int) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError as json_error:
        try:
            blob = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequestError(
                f"'tests' is a string that is neither JSON ({json_error}) nor base64(zlib(pickle))"
            ) from None
    except RecursionError:
        raise BadRequestError("'tests' is nested too deeply to decode") from None
    except ValueError as e:  # JSON, but with an integer past the int-string limit
        raise BadRequestError(f"'tests' is not valid JSON: {e}") from None
    value = _unpickle_plain(blob, max_bytes)
    if isinstance(value, (str, bytes, bytearray)):  # LiveCodeBench-style: the pickle holds a JSON string
        value = loads_json(value, "'tests' pickle's string")
    return value


def _as_text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    raise BadRequestError(f"{where} must be a string, got {type(value).__name__}")


def _normalise_tests(tests: Any, stdio: bool) -> list[Any]:
    if stdio and isinstance(tests, dict) and "inputs" in tests and "outputs" in tests:
        ins, outs = tests["inputs"], tests["outputs"]
        if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
            raise BadRequestError("'tests' inputs/outputs must be lists of equal length")
        tests = [{"input": i, "output": o} for i, o in zip(ins, outs, strict=True)]
    if not isinstance(tests, list):
        raise BadRequestError(f"'tests' must decode to a list, got {type(tests).__name__}")
    if not stdio:
        for i, test in enumerate(tests):
            if not isinstance(test, str):
                raise BadRequestError(f"'tests[{i}]' must be a string (an assert statement)")
        return tests
    normalised = []
    for i, test in enumerate(tests):
        if not isinstance(test, dict) or "input" not in test or "output" not in test:
            raise BadRequestError(f"'tests[{i}]' must be an object with 'input' and 'output'")
        normalised.append(
            {
                "input": _as_text(test["input"], f"'tests[{i}].input'"),
                "output": _as_text(test["output"], f"'tests[{i}].output'"),
            }
        )
    return normalised


def parse_test_request(body: Any, stdio: bool, config: SandboxConfig) -> TestRequest:
    if not isinstance(body, dict):
        raise BadRequestError("request body must be a JSON object")
    program = body.get("program")
    if not isinstance(program, str):
        raise BadRequestError("'program' must be a string")
    if "tests" not in body:
        raise BadRequestError("'tests' is missing")
    tests = _normalise_tests(decode_tests(body["tests"], config), stdio)
    if len(tests) > config.max_tests:
        raise BadRequestError(f"'tests' has {len(tests)} entries; at most {config.max_tests} are accepted")
    limit = body.get("max_execution_time", 1.0)
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit):
        raise BadRequestError("'max_execution_time' must be a number")
    if not 0 < limit <= config.max_execution_time_cap:
        raise BadRequestError(f"'max_execution_time' must be in (0, {config.max_execution_time_cap}]")
    return TestRequest(program=program, tests=tests, max_execution_time=float(limit), stdio=stdio)


@dataclass(frozen=True)
class ExecuteRequest:
    """`POST /execute`: one snippet for the `python` tool, run as `__main__` with empty stdin; or, with
    `language` "bash", one shell command run in a workspace the request carries (`workspace`, a tar.gz
    archive, empty for a new one) with the exported variables and directory of the previous command
    (`shell_state`, opaque text from the previous reply)."""

    code: str
    timeout: float
    language: str = "python"
    workspace: bytes = b""
    shell_state: str = ""


_MAX_SHELL_STATE = 1 << 20


def parse_execute_request(body: Any, config: SandboxConfig) -> ExecuteRequest:
    if not isinstance(body, dict):
        raise BadRequestError("request body must be a JSON object")
    code = body.get("code")
    if not isinstance(code, str):
        raise BadRequestError("'code' must be a string")
    timeout = body.get("timeout", 3.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout):
        raise BadRequestError("'timeout' must be a number")
    if not 0 < timeout <= config.max_execution_time_cap:
        raise BadRequestError(f"'timeout' must be in (0, {config.max_execution_time_cap}]")
    language = body.get("language", "python")
    if language not in ("python", "bash"):
        raise BadRequestError(f"'language' must be python or bash, got {language!r}")
    if language == "python":
        if "workspace" in body or "shell_state" in body:
            raise BadRequestError("'workspace' and 'shell_state' go with language bash")
        return ExecuteRequest(code=code, timeout=float(timeout))
    workspace, shell_state = body.get("workspace") or "", body.get("shell_state") or ""
    if not isinstance(workspace, str) or not isinstance(shell_state, str):
        raise BadRequestError("'workspace' (base64 tar.gz) and 'shell_state' must be strings")
    try:
        archive = base64.b64decode(workspace, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequestError("'workspace' is not base64") from None
    if len(archive) > config.max_workspace_bytes:
        raise BadRequestError(f"'workspace' is {len(archive)} bytes; at most {config.max_workspace_bytes}")
    if len(shell_state) > _MAX_SHELL_STATE:
        raise BadRequestError(f"'shell_state' is over {_MAX_SHELL_STATE} characters")
    return ExecuteRequest(code, float(timeout), "bash", archive, shell_state)


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(token) for token in line.split()]
    except InvalidOperation:
        return None


def outputs_match(actual: str, expected: str) -> bool:
    """The stdio verdict: as many lines after `strip()`, each equal as stripped text or as Decimals."""
    got, want = actual.strip().splitlines(), expected.strip().splitlines()
    if len(got) != len(want):
        return False
    for got_line, want_line in zip(got, want, strict=True):
        got_line, want_line = got_line.strip(), want_line.strip()
        if got_line == want_line:
            continue
        got_num, want_num = _decimals(got_line), _decimals(want_line)
        if got_num is None or want_num is None or not _same_numbers(got_num, want_num):
            return False
    return True


def _same_numbers(got: list[Decimal], want: list[Decimal]) -> bool:
    """Equal as numbers; a NaN (quiet or signalling, which makes `==` raise) equals nothing: whatever a program
    prints is a verdict, never an exception in the service."""
    if len(got) != len(want) or any(number.is_nan() for number in (*got, *want)):
        return False
    return all(a == b for a, b in zip(got, want, strict=True))
