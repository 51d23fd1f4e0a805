"""Local code-execution HTTP service for the `code` / `code_stdio` verifiers (stdlib only).

Why: open-instruct scores code completions by POSTing them to a separate FastAPI service. This module
is a drop-in local replacement that tests and CPU runs start themselves, in-process or as a CLI:

    python -m open_instruct.code_execution_server --host 127.0.0.1 --port 0
    # first stdout line: CODE_API_URL=http://127.0.0.1:PORT

    server, url = start_code_server()          # background thread; server.close() stops it
    with code_server() as (server, url): ...   # same, stopped on exit

HTTP API (compatible with open-instruct's `code_utils/api.py`):

* `GET /health` -> `{"status": "healthy", "sandbox": {...active layers...}}`.
* `POST /test_program` `{"program", "tests": [assert, ...], "max_execution_time"}` -> `{"results": [0|1],
  "runtimes": [s, or -1.0 when not passed], "statuses": [...]}`. Each assert runs in its own process
  after the program (executed as module `solution`, so an `if __name__ == "__main__":` block does not run).
* `POST /test_program_stdio`, tests `[{"input", "output"}, ...]` (or `{"inputs": [...], "outputs": [...]}`):
  the program runs as `__main__` with the input on its real stdin, once per test. A test passes when it
  exits cleanly and, after `strip()`, the stdout has as many lines as the expected output and every line
  matches as stripped text or as a whitespace-separated list of Decimals (so `3.0` equals `3`).
* `tests` may be a list, a JSON string or base64(zlib(pickle(...))) (the pickled value may itself be a
  JSON string). Pickles are decoded here, in the server, with an unpickler that refuses every global:
  only plain containers, strings and numbers can be built, so no pickled code can run. A pickle that
  needs any class or function is rejected with HTTP 400, as is any other malformed body (the JSON
  `error` names the problem). Unlike open-instruct, which scores undecodable tests as 0, a bad row
  therefore surfaces as a verifier error instead of a silent zero.
* `max_execution_time` (default 1.0 s, at most `max_execution_time_cap`) bounds the program's own run
  time, measured from just before the program starts, so interpreter start-up is not charged to it.
  A passing test must finish within it; the process is killed `kill_margin_s` later.
* HTTP 500 means the service itself failed (e.g. a sandbox could not start), never a wrong program.

Sandbox layers, per test process (`python -I -X utf8` with a minimal environment, own session):

* Always: RLIMIT_CPU/AS/FSIZE/NOFILE/CORE, a wall-clock kill of the whole process group, capped
  stdout+stderr capture (the test fails with `output_limit` once exceeded), a fresh work directory
  deleted afterwards, and a Python audit-hook guard installed before the program runs. The guard
  blocks socket creation, process creation (fork/exec/subprocess/os.system), signals, ctypes foreign
  calls, opening directories outside the work dir, and writes/renames/removals outside the work dir.
  Audit hooks cannot be removed from Python, but they are not a security boundary on their own
  (frame introspection, C extensions already loaded).
* When the service runs as root (the normal case in containers), kernel layers on top, each verified
  at start-up by a probe job and then required for every job (a job whose layers fail to come up is a
  500, never a silently weaker sandbox):
  - new network namespace: only a downed loopback exists, so nothing, not even 127.0.0.1, is reachable;
  - new mount namespace: every mount is re-mounted read-only except the work dir, which is a private
    size-capped tmpfs; directories the interpreter needs that sit below a non-world-searchable parent
    (e.g. a pyenv under /root) are re-exposed by a read-only tmpfs over that parent plus bind mounts,
    which also hides the rest of that parent (e.g. /root's other files);
  - new PID and IPC namespaces: the program is PID 1 of its own namespace, so when it is killed every
    process it started dies too, even ones that escaped the process group; a fresh /proc is mounted;
  - an unprivileged uid/gid (one per concurrency slot, `sandbox_uid_base + slot`, falling back to
    `nobody` when those uids are not usable) with no supplementary groups, `no_new_privs`, and
    RLIMIT_NPROC (which root ignores, hence only here).
  Without root only the "always" layers apply: no network or filesystem isolation beyond the guard.
* Concurrency: at most `max_concurrency` test processes run at once (default 2 x CPUs); further work
  queues on a slot pool instead of fork-bombing the machine. A request's tests run in parallel.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import json
import logging
import math
import os
import pickle
import queue
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

_NOBODY_UID = 65534
_ASSERT_PATH = "/test_program"
_STDIO_PATH = "/test_program_stdio"


@dataclass(frozen=True)
class SandboxConfig:
    max_concurrency: int = field(default_factory=lambda: 2 * (os.cpu_count() or 1))
    memory_limit_mb: int = 2048  # RLIMIT_AS: address space, so it over-counts compared with RSS
    max_output_bytes: int = 1 << 20  # stdout+stderr captured per test; beyond it the test fails
    max_file_size_mb: int = 16  # RLIMIT_FSIZE
    workdir_size_mb: int = 64  # tmpfs size of the work dir (kernel layers only)
    max_processes: int = 16  # RLIMIT_NPROC per sandbox uid (kernel layers only)
    max_open_files: int = 256
    max_execution_time_cap: float = 60.0
    startup_timeout_s: float = 10.0  # interpreter + sandbox set-up; beyond it the service is failing
    kill_margin_s: float = 0.5
    kernel_isolation: bool = True  # namespaces + uid drop, when running as root
    python_guard: bool = True
    sandbox_uid_base: int = 990_000
    max_request_bytes: int = 64 << 20
    max_tests: int = 4096
    work_root: str | None = None  # default: a fresh directory under the system temp dir


class BadRequestError(ValueError):
    """The request body is malformed; the message is returned to the client with HTTP 400."""


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program under test); returned with HTTP 500."""


# --------------------------------------------------------------------------------------------------
# Child bootstrap. Runs as `python -I -X utf8 -c _CHILD_SOURCE JOB_PATH` in a fresh single-threaded
# interpreter (never preexec_fn, which is unsafe in this threaded server). It reads and deletes its
# job file, builds the sandbox, then reports on the status pipe (JSON lines carrying a per-job token,
# so a program cannot fake a pass by exiting early or printing): "start" right before the program runs
# (the server starts the program's clock on it), then "done" or "error".

_CHILD_SOURCE = r"""
import json, os, sys, time

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x08000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
KEEP_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
              "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}


class Libc:
    def __init__(self):
        import ctypes
        self.ctypes = ctypes
        self.lib = ctypes.CDLL(None, use_errno=True)
        self.lib.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
        self.lib.unshare.argtypes = [ctypes.c_int]
        self.lib.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4

    def check(self, rc, what):
        if rc != 0:
            err = self.ctypes.get_errno()
            raise OSError(err, what + ": " + os.strerror(err))

    def unshare(self, flags):
        self.check(self.lib.unshare(flags), "unshare(%#x)" % flags)

    def mount(self, source, target, fstype, flags, data=None):
        enc = lambda s: None if s is None else os.fsencode(s)
        self.check(self.lib.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), "mount " + target)

    def prctl(self, option, arg):
        self.check(self.lib.prctl(option, arg, 0, 0, 0), "prctl(%d)" % option)


def mount_points():
    import re
    unescape = lambda s: re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)
    with open("/proc/self/mountinfo") as f:
        return [(unescape(p[4]), p[5].split(",")) for p in (line.split() for line in f)]


def first_blocked_ancestor(path):
    # The sandbox uid is neither owner nor group of anything, so only the "other" x bit matters.
    parts = path.strip("/").split("/")[:-1]
    for i in range(len(parts) + 1):
        ancestor = "/" + "/".join(parts[:i])
        if not os.stat(ancestor).st_mode & 0o001:
            return ancestor
    return None


def same_file(path, fd):
    try:
        a, b = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def expose_interpreter(libc, notes):
    needed = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *filter(None, sys.path)}
    paths = sorted({os.path.realpath(p) for p in needed if os.path.isdir(p)})
    # Take handles first: once a tmpfs hides a parent, the original paths no longer resolve.
    fds = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in paths}
    for path in paths:
        blocked = first_blocked_ancestor(path)
        if blocked == "/":
            notes.append("cannot expose %s: / is not world-searchable" % path)
            continue
        if blocked is not None:
            libc.mount("tmpfs", blocked, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
        if not same_file(path, fds[path]):
            os.makedirs(path, 0o755, exist_ok=True)
            libc.mount("/proc/self/fd/%d" % fds[path], path, None, MS_BIND | MS_REC)
    for fd in fds.values():
        os.close(fd)


def remount_readonly(libc, workdir, notes):
    root_ok = False
    for point, opts in mount_points():
        if point == workdir:
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for opt in opts:
            flags |= KEEP_FLAGS.get(opt, 0)
        try:
            libc.mount(None, point, None, flags)
            root_ok = root_ok or point == "/"
        except OSError as e:
            notes.append(str(e))
    return root_ok


def relay_exit(pid):
    # The parent outside the PID namespace runs no program code: it mirrors the child's fate.
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    os._exit(128 + os.WTERMSIG(status))


def kernel_setup(job, layers, notes):
    libc = Libc()
    workdir = job["workdir"]
    try:
        libc.unshare(CLONE_NEWNET)
        layers["netns"] = True
    except OSError as e:
        notes.append(str(e))
    try:
        libc.unshare(CLONE_NEWNS)
        # Without private propagation our mounts could leak into the host namespace: stop if it fails.
        libc.mount(None, "/", None, MS_REC | MS_PRIVATE)
        layers["mountns"] = True
    except OSError as e:
        notes.append(str(e))
    if layers["mountns"]:
        uid = job["uid"] if job["uid"] is not None else 0
        libc.mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV,
                   "size=%d,mode=0700,uid=%d,gid=%d" % (job["workdir_bytes"], uid, uid))
        if job["uid"] is not None:
            expose_interpreter(libc, notes)
        layers["readonly_fs"] = remount_readonly(libc, workdir, notes)
    try:
        libc.unshare(CLONE_NEWPID | CLONE_NEWIPC)
        layers["pidns"] = True
    except OSError as e:
        notes.append(str(e))
    if layers["pidns"]:
        pid = os.fork()
        if pid:
            relay_exit(pid)
        if layers["mountns"]:
            try:
                libc.mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
            except OSError as e:
                notes.append(str(e))
    return libc


def set_limits(job, uid_dropped):
    import resource
    def cap(which, soft, hard=None):
        hard = soft if hard is None else hard
        current = resource.getrlimit(which)[1]
        if current != resource.RLIM_INFINITY:  # without root a hard limit can only go down
            soft, hard = min(soft, current), min(hard, current)
        resource.setrlimit(which, (soft, hard))
    cap(resource.RLIMIT_CPU, job["cpu_seconds"], job["cpu_seconds"] + 1)
    cap(resource.RLIMIT_AS, job["memory_bytes"])
    cap(resource.RLIMIT_FSIZE, job["file_size_bytes"])
    cap(resource.RLIMIT_NOFILE, job["max_open_files"])
    cap(resource.RLIMIT_CORE, 0)
    if uid_dropped:
        cap(resource.RLIMIT_NPROC, job["max_processes"])


def install_guard(workdir):
    realpath, fsdecode, isdir = os.path.realpath, os.fsdecode, os.path.isdir
    root = realpath(workdir)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    blocked = ("socket.", "subprocess.", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork",
               "os.forkpty", "pty.", "os.kill", "os.killpg", "signal.pthread_kill", "ctypes.dlopen",
               "ctypes.dlsym", "ctypes.call_function", "ctypes.cdata")
    path_args = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
                 "os.symlink": (1,), "os.link": (1,), "os.chmod": (0,), "os.chown": (0,),
                 "os.truncate": (0,), "os.utime": (0,), "os.chflags": (0,), "os.lchflags": (0,)}
    devices = {"/dev/null", "/dev/stdout", "/dev/stderr"}

    def inside(path):
        if isinstance(path, int):
            return True
        path = fsdecode(path)
        if path in devices:
            return True
        path = realpath(path)
        return path == root or path.startswith(root + "/")

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            if path is None or isinstance(path, int):
                return
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags)
            # A directory fd outside the work dir would let os.open(..., dir_fd=fd) write through it.
            # Plain reads (every import) skip the realpath cost.
            if (writing or (mode is None and isdir(fsdecode(path)))) and not inside(path):
                raise PermissionError("sandbox: no writes outside the work directory: %r" % (path,))
        elif event in path_args:
            for i in path_args[event]:
                if not inside(args[i]):
                    raise PermissionError("sandbox: %s outside the work directory: %r" % (event, args[i]))
        elif event.startswith(blocked):
            raise PermissionError("sandbox: %s is not allowed" % event)

    sys.addaudithook(hook)


def main():
    job_path = sys.argv[1]
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    os.unlink(job_path)
    token, status_fd, workdir, mode = job.pop("token"), job["status_fd"], job["workdir"], job["mode"]

    def send(kind, **fields):
        os.write(status_fd, (json.dumps(dict(kind=kind, token=token, **fields)) + "\n").encode())

    layers = {"netns": False, "mountns": False, "readonly_fs": False, "pidns": False, "uid_drop": False,
              "no_new_privs": False, "python_guard": False}
    notes = []
    try:
        os.umask(0o022)
        libc = kernel_setup(job, layers, notes) if job["kernel"] and os.geteuid() == 0 else None
        uid = job["uid"]
        if uid is not None and os.geteuid() == 0:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            layers["uid_drop"] = True
        if libc is not None:
            libc.prctl(PR_SET_NO_NEW_PRIVS, 1)
            layers["no_new_privs"] = True
            if layers["pidns"]:
                import signal
                libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
        set_limits(job, layers["uid_drop"])
        os.chdir(workdir)
        os.umask(0o077)
    except Exception as e:
        send("setup_error", error="%s: %s" % (type(e).__name__, e), layers=layers, notes=notes)
        os._exit(70)

    import builtins, traceback, types
    sys.dont_write_bytecode = True
    sys.argv = ["solution.py"]
    name = "__main__" if mode == "stdio" else "solution"
    module = types.ModuleType(name)
    module.__builtins__ = builtins
    sys.modules[name] = module
    program, test = job.pop("program"), job.pop("test", None)
    if job["guard"]:
        install_guard(workdir)
        layers["python_guard"] = True
    missing = [k for k, wanted in job["expected_layers"].items() if wanted and not layers.get(k)]
    if missing:
        send("setup_error", error="sandbox layers failed: " + ", ".join(missing), layers=layers, notes=notes)
        os._exit(70)
    send("start", layers=layers, notes=notes)
    error = None
    t0 = time.perf_counter()
    try:
        exec(compile(program, "<solution>", "exec"), module.__dict__)
        if test is not None:
            exec(compile(test, "<test>", "exec"), module.__dict__)
    except SystemExit as e:
        if mode != "stdio" or e.code not in (None, 0):
            error = "SystemExit"
    except BaseException as e:
        error = type(e).__name__
        try:
            traceback.print_exc()
        except BaseException:
            pass
    runtime = time.perf_counter() - t0
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    if error is None:
        send("done", runtime=runtime)
    else:
        send("error", runtime=runtime, error=error)
    os._exit(0 if error is None else 1)


main()
"""


# --------------------------------------------------------------------------------------------------
# Request decoding.


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


def _unpickle_plain(blob: bytes, max_bytes: int) -> Any:
    # Capped decompression: a tiny zlib bomb must not exhaust the server's memory.
    inflater = zlib.decompressobj()
    data = inflater.decompress(blob, max_bytes)
    if inflater.unconsumed_tail:
        raise BadRequestError(f"'tests' decompresses to more than {max_bytes} bytes")
    import io

    return _PlainUnpickler(io.BytesIO(data)).load()


def decode_tests(raw: Any, max_bytes: int) -> Any:
    """A list as is; a string as JSON, else as base64 -> zlib -> pickle (globals refused)."""
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
    try:
        value = _unpickle_plain(blob, max_bytes)
    except BadRequestError:
        raise
    except Exception as e:  # noqa: BLE001 - garbage input makes the unpickler raise almost anything
        raise BadRequestError(f"'tests' base64 payload is not zlib-compressed plain pickle: {e}") from None
    if isinstance(value, (str, bytes)):  # LiveCodeBench-style: the pickle holds a JSON string
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise BadRequestError(f"'tests' pickle holds a string that is not JSON: {e}") from None
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
        tests = [{"input": i, "output": o} for i, o in zip(ins, outs)]
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
    tests = _normalise_tests(decode_tests(body["tests"], config.max_request_bytes), stdio)
    if len(tests) > config.max_tests:
        raise BadRequestError(f"'tests' has {len(tests)} entries; at most {config.max_tests} are accepted")
    limit = body.get("max_execution_time", 1.0)
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit):
        raise BadRequestError("'max_execution_time' must be a number")
    if not 0 < limit <= config.max_execution_time_cap:
        raise BadRequestError(f"'max_execution_time' must be in (0, {config.max_execution_time_cap}]")
    return TestRequest(program=program, tests=tests, max_execution_time=float(limit), stdio=stdio)


# --------------------------------------------------------------------------------------------------
# Output comparison (stdio mode).


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(token) for token in line.split()]
    except InvalidOperation:
        return None


def outputs_match(actual: str, expected: str) -> bool:
    got, want = actual.strip().splitlines(), expected.strip().splitlines()
    if len(got) != len(want):
        return False
    for got_line, want_line in zip(got, want):
        got_line, want_line = got_line.strip(), want_line.strip()
        if got_line == want_line:
            continue
        got_num, want_num = _decimals(got_line), _decimals(want_line)
        if got_num is None or want_num is None or got_num != want_num:
            return False
    return True


# --------------------------------------------------------------------------------------------------
# Running one test in a sandboxed process.


@dataclass
class RunOutcome:
    status: str  # "ok", "error:<Exc>", "timeout", "output_limit", "killed:<SIG>", "exited:<code>"
    runtime: float
    stdout: bytes
    stderr: bytes


_EXPECTED_LAYER_KEYS = (
    "netns",
    "mountns",
    "readonly_fs",
    "pidns",
    "uid_drop",
    "no_new_privs",
    "python_guard",
)


class CodeExecutor:
    """Runs programs against tests in sandboxed subprocesses, at most `max_concurrency` at a time."""

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        if self.config.max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        # realpath: the child matches the work dir against /proc/self/mountinfo and resolved paths.
        self._work_root = os.path.realpath(
            tempfile.mkdtemp(prefix="oi-code-exec-", dir=self.config.work_root)
        )
        # Children with a dropped uid must traverse it but not list or write it.
        os.chmod(self._work_root, 0o711)
        self._slots: queue.Queue[int] = queue.Queue()
        for slot in range(self.config.max_concurrency):
            self._slots.put(slot)
        self._uid_for_slot: Any = lambda slot: None
        self._kernel = False
        self._expected: dict[str, bool] = {}
        self._max_processes = self.config.max_processes
        self.layers: dict[str, Any] = {}
        try:
            self._probe()
        except BaseException:
            self.close()
            raise

    # -- set-up ------------------------------------------------------------------------------------

    def _probe(self) -> None:
        """Find the strongest sandbox that works here, then require it for every later job."""
        cfg = self.config
        candidates: list[tuple[str, Any, bool]] = [("none", lambda slot: None, False)]
        if cfg.kernel_isolation and os.geteuid() == 0:
            candidates = [
                ("per-slot", lambda slot: cfg.sandbox_uid_base + slot, True),
                ("nobody", lambda slot: _NOBODY_UID, True),
                *candidates,
            ]
        failures = []
        for name, uid_for_slot, kernel in candidates:
            self._uid_for_slot, self._kernel = uid_for_slot, kernel
            try:
                outcome, layers = self._run(
                    "import heapq, fractions, decimal, json", "assert 1", None, 5.0, expected={}, slot=0
                )
            except SandboxError as e:
                failures.append(f"uid {name}: {e}")
                continue
            if outcome.status == "ok" and (uid_for_slot(0) is None or layers.get("uid_drop")):
                self.layers = {**layers, "uid": name if uid_for_slot(0) is not None else None}
                self._expected = {k: bool(layers.get(k)) for k in _EXPECTED_LAYER_KEYS}
                if name == "nobody":  # RLIMIT_NPROC is per uid, and now all slots share one
                    self._max_processes = cfg.max_processes * cfg.max_concurrency
                break
            failures.append(f"uid {name}: probe status {outcome.status}: {outcome.stderr[-500:]!r}")
        else:
            raise SandboxError("no working sandbox configuration: " + "; ".join(failures))
        if failures:
            logger.warning("code sandbox fell back: %s", "; ".join(failures))
        logger.info("code sandbox layers: %s", self.layers)

    def close(self) -> None:
        shutil.rmtree(self._work_root, ignore_errors=True)

    # -- requests ----------------------------------------------------------------------------------

    def run_request(self, request: TestRequest) -> dict[str, Any]:
        if not request.tests:
            return {"results": [], "runtimes": [], "statuses": []}
        workers = min(len(request.tests), self.config.max_concurrency)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="code-test") as pool:
            verdicts = list(pool.map(lambda test: self._judge(request, test), request.tests))
        return {
            "results": [int(status == "passed") for status, _ in verdicts],
            "runtimes": [runtime if status == "passed" else -1.0 for status, runtime in verdicts],
            "statuses": [status for status, _ in verdicts],
        }

    def _judge(self, request: TestRequest, test: Any) -> tuple[str, float]:
        limit = request.max_execution_time
        if request.stdio:
            expected = test["output"].encode()
            output_cap = max(self.config.max_output_bytes, 2 * len(expected) + 4096)
            outcome, _ = self._run(
                request.program, None, test["input"].encode(), limit, output_cap=output_cap
            )
        else:
            outcome, _ = self._run(request.program, test, None, limit)
        status = outcome.status
        if request.stdio and status == "exited:0":  # os._exit(0) after printing is a normal stdio exit
            status = "ok"
        if status == "ok" and outcome.runtime > limit:
            status = "timeout"
        if status == "ok":
            if request.stdio and not outputs_match(outcome.stdout.decode(errors="replace"), test["output"]):
                return "failed", outcome.runtime
            return "passed", outcome.runtime
        if status == "error:AssertionError":
            return "failed", outcome.runtime
        if status == "error:MemoryError":
            return "memory_limit", outcome.runtime
        return status, outcome.runtime

    def _run(
        self,
        program: str,
        test: str | None,
        stdin_data: bytes | None,
        limit: float,
        *,
        expected: dict[str, bool] | None = None,
        slot: int | None = None,
        output_cap: int | None = None,
    ) -> tuple[RunOutcome, dict[str, Any]]:
        """Run one program (+ assert, or + stdin) in a fresh sandbox; returns outcome and its layers."""
        acquired = slot is None
        if acquired:
            slot = self._slots.get()
        expected = self._expected if expected is None else expected
        try:
            return self._run_in_slot(
                program, test, stdin_data, limit, slot, expected, output_cap or self.config.max_output_bytes
            )
        finally:
            if acquired:
                self._slots.put(slot)

    def _run_in_slot(
        self,
        program: str,
        test: str | None,
        stdin_data: bytes | None,
        limit: float,
        slot: int,
        expected: dict[str, bool],
        output_cap: int,
    ) -> tuple[RunOutcome, dict[str, Any]]:
        cfg = self.config
        uid = self._uid_for_slot(slot)
        workdir = tempfile.mkdtemp(prefix=f"slot{slot}-", dir=self._work_root)
        token = secrets.token_hex(16)
        status_r, status_w = os.pipe()
        proc: subprocess.Popen[bytes] | None = None
        stdin_file = None
        try:
            if uid is not None:  # matters only without a mount namespace (its tmpfs has this owner)
                os.chown(workdir, uid, uid)
            job = {
                "token": token,
                "status_fd": status_w,
                "workdir": workdir,
                "mode": "stdio" if stdin_data is not None else "assert",
                "program": program,
                "test": test,
                "kernel": self._kernel,
                "guard": cfg.python_guard,
                "uid": uid,
                "expected_layers": expected,
                "cpu_seconds": math.ceil(limit) + 1,
                "memory_bytes": cfg.memory_limit_mb << 20,
                "file_size_bytes": cfg.max_file_size_mb << 20,
                "workdir_bytes": cfg.workdir_size_mb << 20,
                "max_processes": self._max_processes,
                "max_open_files": cfg.max_open_files,
            }
            job_path = os.path.join(workdir, "job.json")
            fd = os.open(job_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(job, f)
            if stdin_data is not None:
                # A file, not a pipe: no writer thread, no deadlock if the program never reads.
                stdin_file = tempfile.TemporaryFile(dir=workdir)  # noqa: SIM115 - closed in finally
                stdin_file.write(stdin_data)
                stdin_file.seek(0)
            env = {
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "HOME": workdir,
                "TMPDIR": workdir,
                "LANG": "C.UTF-8",
                "LC_ALL": "C.UTF-8",
                "OMP_NUM_THREADS": "1",
                "OPENBLAS_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
            }
            proc = subprocess.Popen(
                [sys.executable, "-I", "-X", "utf8", "-c", _CHILD_SOURCE, job_path],
                stdin=stdin_file if stdin_file is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(status_w,),
                cwd=workdir,
                env=env,
                start_new_session=True,
            )
            os.close(status_w)
            status_w = -1
            return self._supervise(proc, status_r, token, limit, output_cap)
        finally:
            if proc is not None:
                _kill_group(proc)
            for fd in (status_r, status_w):
                if fd >= 0:
                    os.close(fd)
            if stdin_file is not None:
                stdin_file.close()
            shutil.rmtree(workdir, onerror=_force_remove)

    def _supervise(
        self, proc: subprocess.Popen[bytes], status_r: int, token: str, limit: float, output_cap: int
    ) -> tuple[RunOutcome, dict[str, Any]]:
        cfg = self.config
        assert proc.stdout is not None and proc.stderr is not None
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        buffers: dict[int, bytearray] = {out_fd: bytearray(), err_fd: bytearray()}
        status_buf = bytearray()
        messages: list[dict[str, Any]] = []
        selector = selectors.DefaultSelector()
        for fd in (*buffers, status_r):
            selector.register(fd, selectors.EVENT_READ)
        spawned = time.monotonic()
        deadline = spawned + cfg.startup_timeout_s
        started_at: float | None = None
        ended_at: float | None = None
        verdict: str | None = None
        try:
            while selector.get_map():
                now = time.monotonic()
                if now >= deadline:
                    verdict = "timeout"
                    break
                if ended_at is None and _has_exited(proc):
                    ended_at = now
                    # Descendants that escaped the group may hold the pipes open: drain briefly only.
                    deadline = min(deadline, now + 0.5)
                for key, _ in selector.select(timeout=min(deadline - now, 0.25)):
                    fd = key.fd
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        selector.unregister(fd)
                        continue
                    if fd == status_r:
                        status_buf += chunk
                        *lines, rest = status_buf.split(b"\n")
                        status_buf = bytearray(rest)
                        for line in lines:
                            message = _parse_status(line, token)
                            if message is None:
                                continue
                            messages.append(message)
                            if message["kind"] == "start" and started_at is None:
                                started_at = time.monotonic()
                                deadline = started_at + limit + cfg.kill_margin_s
                    else:
                        buffers[fd] += chunk
                        if sum(len(b) for b in buffers.values()) > output_cap:
                            verdict = "output_limit"
                            break
                if verdict is not None:
                    break
        finally:
            selector.close()
        _kill_group(proc)
        ended = ended_at if ended_at is not None else time.monotonic()
        stdout, stderr = bytes(buffers[out_fd]), bytes(buffers[err_fd])
        kinds = {m["kind"]: m for m in messages}
        if "setup_error" in kinds:
            raise SandboxError(f"sandbox set-up failed: {kinds['setup_error'].get('error')}")
        if started_at is None:
            what = "did not start in time" if verdict == "timeout" else f"exited with code {proc.returncode}"
            raise SandboxError(f"sandbox {what}; stderr: {stderr[-1000:].decode(errors='replace')}")
        layers = kinds["start"].get("layers", {})
        runtime = ended - started_at
        if verdict is None:
            if "done" in kinds:
                verdict, runtime = "ok", float(kinds["done"].get("runtime", runtime))
            elif "error" in kinds:
                verdict, runtime = f"error:{kinds['error'].get('error')}", float(kinds["error"]["runtime"])
            else:
                verdict = _describe_exit(proc.returncode)
        return RunOutcome(verdict, runtime, stdout, stderr), layers


def _parse_status(line: bytes, token: str) -> dict[str, Any] | None:
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("token") != token:
        return None
    return message


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "killed"
    if returncode < 0 or returncode > 128:
        signum = -returncode if returncode < 0 else returncode - 128
        with contextlib.suppress(ValueError):
            return f"killed:{signal.Signals(signum).name}"
        return f"killed:{signum}"
    if returncode == 0:
        return "exited:0"  # e.g. os._exit(0) before the test ran: not a pass
    return f"exited:{returncode}"


def _has_exited(proc: subprocess.Popen[bytes]) -> bool:
    # WNOWAIT leaves the zombie in place, so its pid (= the group id) cannot be reused before killpg.
    return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.returncode is None:  # once reaped, the group id may belong to someone else
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None and not stream.closed:
            stream.close()


def _force_remove(func: Any, path: str, exc_info: Any) -> None:
    # Without root a program may chmod its own files read-only; restore access and retry once.
    with contextlib.suppress(OSError):
        os.chmod(os.path.dirname(path), 0o700)
        os.chmod(path, 0o700)
        func(path)


# --------------------------------------------------------------------------------------------------
# HTTP layer.


class CodeExecutionServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # many concurrent clients connect at once; the default backlog is 5

    def __init__(self, address: tuple[str, int], executor: CodeExecutor):
        self.executor = executor
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        """Stop serving (if serving), release the socket and delete the work directories."""
        if getattr(self, "_serving_thread", None) is not None:
            self.shutdown()
        self.server_close()
        self.executor.close()


class _Handler(BaseHTTPRequestHandler):
    server: CodeExecutionServer
    protocol_version = "HTTP/1.1"  # keep-alive for pooled clients

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_GET(self) -> None:
        if urlsplit(self.path).path.rstrip("/") == "/health":
            self._send_json(200, {"status": "healthy", "sandbox": self.server.executor.layers})
        else:
            self._send_json(404, {"error": f"unknown path {self.path!r}"})

    def do_POST(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        if path not in (_ASSERT_PATH, _STDIO_PATH):
            self.close_connection = True
            self._send_json(
                404, {"error": f"unknown path {self.path!r}; use {_ASSERT_PATH} or {_STDIO_PATH}"}
            )
            return
        executor = self.server.executor
        try:
            body = self._read_json(executor.config.max_request_bytes)
            request = parse_test_request(body, stdio=path == _STDIO_PATH, config=executor.config)
        except BadRequestError as e:
            self._send_json(400, {"error": str(e)})
            return
        try:
            result = executor.run_request(request)
        except SandboxError as e:
            logger.error("code sandbox failure: %s", e)
            self._send_json(500, {"error": f"sandbox failure: {e}"})
            return
        except Exception as e:
            logger.exception("code execution failed")
            self._send_json(500, {"error": f"internal error: {type(e).__name__}: {e}"})
            return
        self._send_json(200, result)

    def _read_json(self, max_bytes: int) -> Any:
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            self.close_connection = True
            raise BadRequestError("Content-Length header is required")
        try:
            length = int(length_header)
        except ValueError:
            self.close_connection = True
            raise BadRequestError(f"invalid Content-Length {length_header!r}") from None
        if length < 0 or length > max_bytes:
            self.close_connection = True
            raise BadRequestError(f"request body of {length} bytes exceeds the {max_bytes}-byte limit")
        raw = self.rfile.read(length)
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRequestError(f"request body is not valid JSON: {e}") from None


def start_code_server(
    host: str = "127.0.0.1", port: int = 0, config: SandboxConfig | None = None
) -> tuple[CodeExecutionServer, str]:
    """Start the service in a daemon thread; returns (server, base URL). Stop it with `server.close()`."""
    executor = CodeExecutor(config)
    try:
        server = CodeExecutionServer((host, port), executor)
    except BaseException:
        executor.close()
        raise
    thread = threading.Thread(target=server.serve_forever, name="code-execution-server", daemon=True)
    server._serving_thread = thread  # type: ignore[attr-defined]
    thread.start()
    return server, server.url


@contextlib.contextmanager
def code_server(
    host: str = "127.0.0.1", port: int = 0, config: SandboxConfig | None = None
) -> Iterator[tuple[CodeExecutionServer, str]]:
    server, url = start_code_server(host, port, config)
    try:
        yield server, url
    finally:
        server.close()


def main(argv: list[str] | None = None) -> None:
    defaults = SandboxConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--max_concurrency", type=int, default=defaults.max_concurrency)
    parser.add_argument("--memory_limit_mb", type=int, default=defaults.memory_limit_mb)
    parser.add_argument("--max_output_bytes", type=int, default=defaults.max_output_bytes)
    parser.add_argument("--max_processes", type=int, default=defaults.max_processes)
    parser.add_argument("--max_execution_time_cap", type=float, default=defaults.max_execution_time_cap)
    parser.add_argument("--sandbox_uid_base", type=int, default=defaults.sandbox_uid_base)
    parser.add_argument("--work_root", default=None)
    parser.add_argument("--no_kernel_isolation", action="store_true", help="skip namespaces and uid drop")
    parser.add_argument("--no_python_guard", action="store_true")
    parser.add_argument("--log_level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    config = SandboxConfig(
        max_concurrency=args.max_concurrency,
        memory_limit_mb=args.memory_limit_mb,
        max_output_bytes=args.max_output_bytes,
        max_processes=args.max_processes,
        max_execution_time_cap=args.max_execution_time_cap,
        sandbox_uid_base=args.sandbox_uid_base,
        work_root=args.work_root,
        kernel_isolation=not args.no_kernel_isolation,
        python_guard=not args.no_python_guard,
    )
    executor = CodeExecutor(config)
    server = CodeExecutionServer((args.host, args.port), executor)
    print(f"CODE_API_URL={server.url}", flush=True)

    def stop(signum: int, frame: Any) -> None:
        # shutdown() blocks until serve_forever returns, so it cannot run on the serving thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        executor.close()


if __name__ == "__main__":
    main()
