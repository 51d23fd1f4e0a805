"""Runs a request's tests, each in a fresh sandboxed child interpreter (`code_server/sandbox.py`).

At start-up the executor probes which sandbox layers work here (see `code_server.sandbox`) and from then
on requires them for every job: a job whose layers fail to come up raises `SandboxError` (HTTP 500),
never a silently weaker sandbox. Where a kernel layer is missing (not root, or a container without the
capability) the executor refuses to start, naming the layer, unless `allow_weak_sandbox` asks for the
weak mode (the Python guard and rlimits only), which it then announces with a warning on every start.

At most `max_concurrency` tests run at once (default 2 x CPUs); further work queues on a slot pool instead
of fork-bombing the machine. A request's tests run in parallel.

An assert test takes two sandboxes of its slot: the program's, which answers requests (in the slot's
cgroup), and a judge's, which runs the test against those answers and alone reports the verdict
(`code_server/remote_calls.py`), so no program can forge its pass. A stdio test's output is compared here.
Time is never taken from the program: an assert test is charged its program process's CPU time by the
kernel's count (reaped with `wait4`, less what the runner had used at its "start"), less the calibrated cost
of answering each of the judge's requests, so pipe round trips are not charged; a stdio run the time from
the runner's "start" to the child's exit (so interpreter start-up is not charged). Whatever the program
writes or answers is a per-test verdict: only the sandbox's own failure is a `SandboxError`. Each child's
whole process group is killed `kill_margin_s` after its time budget,
and its output is captured up to a cap.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import math
import os
import py_compile
import queue
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

from code_server import remote_calls, sandbox, slot_cgroups, syscall_filter
from code_server.config import SandboxConfig
from code_server.protocol import BadRequestError, ExecuteRequest, TestRequest, outputs_match
from code_server.slot_cgroups import SlotLimits

logger = logging.getLogger(__name__)

_NOBODY_UID = 65534
# By file path, not `-m`: `-I` ignores PYTHONPATH, and the runner needs nothing from the package.
_RUNNER = os.path.abspath(sandbox.__file__)
_REMOTE_CALLS = os.path.abspath(remote_calls.__file__)
_EXIT_DRAIN_S = 0.5
_READ_CHUNK = 1 << 16


# What only the kernel gives (the service runs as root). Without all of them the service starts only in the
# explicit weak mode; and a shell, which the audit-hook guard cannot watch, runs only where all are up.
KERNEL_LAYERS = ("netns", "mountns", "readonly_fs", "pidns", "uid_drop", "no_new_privs", "seccomp")
WEAK_ENV_VAR = "CODE_SANDBOX_ALLOW_WEAK"
_TASK_COUNT_TTL_S = 1.0
_CALIBRATION_CALLS = 100
_MAX_REQUEST_CPU_S = 200e-6
_MAX_JUDGE_SETUP_S = 5.0

_SANDBOX_FRAME = re.compile(r'  File "[^"]*code_server/sandbox\.py", line \d+, in \w+\n(    .*\n)?')


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program under test); returned with HTTP 500."""


@dataclass
class RunOutcome:
    status: str  # "ok", "error:<Exc>", "timeout", "output_limit", "killed:<SIG>", "exited:<code>"
    runtime: float
    stdout: bytes
    stderr: bytes
    report: dict[str, Any] = field(default_factory=dict)  # the runner's "done" message (a bash job's results)
    cpu: float | None = None  # the program's CPU seconds after "start", by the kernel's count (None: not reaped)


class CodeExecutor:
    """Runs programs against tests in sandboxed subprocesses, at most `max_concurrency` at a time."""

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        if self.config.max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        # realpath: the child matches the work dir against /proc/self/mountinfo and resolved paths.
        self._work_root = os.path.realpath(tempfile.mkdtemp(prefix="oi-code-exec-", dir=self.config.work_root))
        # Children with a dropped uid must traverse it but not list or write it.
        os.chmod(self._work_root, 0o711)
        self._runner = _compile_runner(self._work_root)
        # Where a bash job's workspace is mounted, in the job's own mount namespace: an empty directory here,
        # the same path for every job, so paths a command prints stay valid in the sample's next command.
        self.workspace_path = os.path.join(self._work_root, "testbed")
        os.mkdir(self.workspace_path)
        os.chmod(self.workspace_path, 0o755)
        self._bash = shutil.which("bash", path="/usr/bin:/bin")
        self._slots: queue.Queue[int] = queue.Queue()
        for slot in range(self.config.max_concurrency):
            self._slots.put(slot)
        self._uid_for_slot: Any = lambda slot: None
        self._kernel = False
        self._expected: dict[str, bool] = {}
        self._task_count_lock = threading.Lock()
        self._task_count: tuple[float, int] = (-math.inf, 0)  # (when counted, tasks of the service's uid)
        self.layers: dict[str, Any] = {}
        self._request_cpu_s = 0.0
        self._cgroups, self.cgroups = _slot_cgroups(self.config, f"{os.getpid()}-{id(self)}")
        bpf, self._seccomp_missing = syscall_filter.compile_filter()
        self._seccomp_bpf = base64.b64encode(bpf).decode() if bpf else None
        try:
            self._probe()
        except BaseException:
            self.close()
            raise

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
            notes = layers.pop("notes", []) + ([self._seccomp_missing] if self._seccomp_missing else [])
            if outcome.status == "ok" and (uid_for_slot(0) is None or layers.get("uid_drop")):
                self.layers = {**layers, "uid": name if uid_for_slot(0) is not None else None}
                self._expected = {k: bool(layers.get(k)) for k in sandbox.LAYERS}
                break
            failures.append(f"uid {name}: probe status {outcome.status}: {outcome.stderr[-500:]!r}")
        else:
            raise SandboxError("no working sandbox configuration: " + "; ".join(failures))
        self._settle_mode(failures, notes)
        self._request_cpu_s = _calibrate(self)
        self.layers["request_cpu_us"] = round(self._request_cpu_s * 1e6, 1)

    def _settle_mode(self, failures: list[str], notes: list[str]) -> None:
        """Full mode has every kernel layer; anything less is the weak mode, which must be asked for."""
        cfg = self.config
        missing = [k for k in KERNEL_LAYERS if not self.layers.get(k)]
        self.layers.update(mode="weak" if missing else "full", missing=missing)
        self.layers["process_limit"] = _describe_process_limit(cfg, self.layers, self._process_limit)
        self.layers["cgroups"] = self.cgroups
        if not missing:
            if failures:
                logger.warning("code sandbox fell back: %s", "; ".join(failures))
            logger.info("code sandbox: full mode, layers %s", self.layers)
            return
        why = _why_weak(cfg, failures + notes)
        if not cfg.python_guard:
            raise SandboxError(
                f"code sandbox: kernel layers missing ({', '.join(missing)}: {why}) and the Python guard is off, "
                "so nothing would confine a program; turn the guard on or run the service as root"
            )
        if not cfg.allow_weak_sandbox:
            raise SandboxError(
                f"code sandbox: kernel layers missing ({', '.join(missing)}): {why}; run the service as root, "
                f"or accept the weak mode (Python guard and rlimits only) with --allow_weak_sandbox or {WEAK_ENV_VAR}=1"
            )
        logger.warning(
            "code sandbox: WEAK mode (allowed by allow_weak_sandbox): kernel layers missing (%s): %s; only the "
            "Python guard and rlimits confine programs, see docs/rewards.md; layers %s",
            ", ".join(missing),
            why,
            self.layers,
        )

    def _process_limit(self) -> int:
        """RLIMIT_NPROC for the next job. The kernel counts every task (thread or process) of the job's real
        uid, so where slots share a uid each slot's share comes on top of what that uid already runs: the
        service's own threads and other processes must not make a correct program's thread fail (this also
        holds for root in a container without CAP_SYS_RESOURCE, where the limit binds root too)."""
        cfg = self.config
        uid = self.layers.get("uid")
        if uid == "per-slot":
            return cfg.max_processes
        share = cfg.max_processes * cfg.max_concurrency
        if uid == "nobody":
            return share
        with self._task_count_lock:
            counted_at, count = self._task_count
            if time.monotonic() - counted_at > _TASK_COUNT_TTL_S:
                count = _tasks_of_uid(os.getuid())
                self._task_count = (time.monotonic(), count)
        return count + share

    def close(self) -> None:
        shutil.rmtree(self._work_root, ignore_errors=True)
        if getattr(self, "_cgroups", None) is not None:
            self._cgroups.close()

    @property
    def bash_ready(self) -> bool:
        return self._bash is not None and self._kernel and all(self._expected.get(k) for k in KERNEL_LAYERS)

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

    def execute(self, request: ExecuteRequest) -> dict[str, Any]:
        """The `python` tool: what the snippet printed, what went wrong, and whether it ran cleanly.

        Unlike open-instruct's tool server, stdout is kept when the snippet fails: what it printed
        before the exception is what the model needs to debug it."""
        if request.language == "bash":
            return self._execute_bash(request)
        outcome, _ = self._run(request.code, None, b"", request.timeout)
        status = "ok" if outcome.status == "exited:0" else outcome.status
        if status == "ok" and outcome.runtime > request.timeout:
            status = "timeout"
        # The sandbox's own frame would only confuse the model reading the traceback.
        stderr = _SANDBOX_FRAME.sub("", outcome.stderr.decode(errors="replace"))
        error = {
            "ok": stderr,
            "timeout": f"Timeout after {request.timeout:g} seconds",
            "output_limit": f"output exceeded {self.config.max_output_bytes} bytes",
        }.get(status, stderr or status)
        return {
            "output": outcome.stdout.decode(errors="replace"),
            "error": error,
            "success": status == "ok" and not stderr,
            "status": status,
            "runtime": outcome.runtime,
        }

    def _execute_bash(self, request: ExecuteRequest) -> dict[str, Any]:
        """The generic_sandbox environment's command: run in the sample's workspace (unpacked from the request,
        packed into the reply) with its previous shell state. A non-zero exit is a result, not an error; only a
        run the supervisor had to cut (output flood, a stuck pack) loses the workspace, and says so."""
        if not self.bash_ready:
            raise BadRequestError(
                "language bash needs /bin/bash and the kernel sandbox layers (" + ", ".join(KERNEL_LAYERS) + "): "
                "run the service as root"
            )
        cfg = self.config
        shared_memory = bool(self._cgroups and "memory" in self._cgroups.controllers)
        extra = _bash_job(cfg, request, self.workspace_path, self._bash, shared_memory)
        outcome, _ = self._run("", None, None, request.timeout + cfg.workspace_pack_s, job_extra=extra)
        return _bash_reply(outcome, request, cfg, self.workspace_path)

    def _judge(self, request: TestRequest, test: Any) -> tuple[str, float]:
        """One test's (status, runtime). Only the sandbox's own failure raises: whatever the program made of
        its output, its answers or its status pipe is this test's verdict, never the request's failure."""
        try:
            return self._judge_one(request, test)
        except SandboxError:
            raise
        except Exception as e:
            logger.exception("code test could not be judged")
            return f"error:verdict:{type(e).__name__}", -1.0

    def _judge_one(self, request: TestRequest, test: Any) -> tuple[str, float]:
        limit = request.max_execution_time
        if request.stdio:
            expected = test["output"].encode()
            output_cap = max(self.config.max_output_bytes, 2 * len(expected) + 4096)
            outcome, _ = self._run(request.program, None, test["input"].encode(), limit, output_cap=output_cap)
        else:
            outcome = self._run_judged(request.program, test, limit)
        return _verdict(outcome, request, test), outcome.runtime

    def _run_judged(self, program: str, test: str, limit: float) -> RunOutcome:
        """An assert test: the program runs in one sandbox and answers the requests of a judge, which runs the
        test in another (see `code_server.remote_calls`). Both take the same slot."""
        slot = self._slots.get()
        to_program_r, to_program_w = os.pipe()
        to_judge_r, to_judge_w = os.pipe()
        served: list[RunOutcome] = []
        judge_done_r, judge_done_w = os.pipe()
        judge_cgroup = self._cgroups.procs_files(self.config.max_concurrency + slot) if self._cgroups else []
        serve, judge = _judged_jobs(self.config, program, limit, judge_cgroup)
        serve.update(channel_in=to_program_r, channel_out=to_judge_w, stop_fd=judge_done_r)
        judge.update(channel_in=to_judge_r, channel_out=to_program_w)
        judge_layers = dict(self._expected)
        cap = self.config.max_output_bytes

        def run_program() -> None:
            try:
                served.append(self._run_in_slot(program, None, None, limit, slot, self._expected, cap, serve)[0])
            finally:
                os.close(judge_done_r)

        # Each run owns its child's two ends and closes them once the child has them, so that either side
        # sees the end of the stream when the other ends.
        thread = threading.Thread(target=run_program, name="code-test-program", daemon=True)
        try:
            try:
                thread.start()
            except BaseException:
                for fd in (to_program_r, to_judge_w, judge_done_r, judge_done_w):
                    os.close(fd)
                raise
            try:
                judged, _ = self._run_in_slot("", test, None, limit, slot, judge_layers, cap, judge)
            finally:
                # Also when the judge's sandbox failed: the program then sees the end of its channel and ends
                # (or is stopped shortly after), and the slot goes back only once both are gone.
                os.close(judge_done_w)
                thread.join()
        finally:
            self._slots.put(slot)
        if not served:  # the program's sandbox failed: that run raised SandboxError in its thread
            raise SandboxError("the program's sandbox did not run")
        return _combine(served[0], judged, self._request_cpu_s)

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
        job_extra: dict[str, Any] | None = None,
    ) -> tuple[RunOutcome, dict[str, Any]]:
        """Run one program (+ assert, or + stdin) in a fresh sandbox; returns outcome and its layers.
        `job_extra` overrides job fields (a bash job's mode, workspace and command)."""
        acquired = slot is None
        if acquired:
            slot = self._slots.get()
        expected = self._expected if expected is None else expected
        try:
            return self._run_in_slot(
                program,
                test,
                stdin_data,
                limit,
                slot,
                expected,
                output_cap or self.config.max_output_bytes,
                job_extra or {},
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
        job_extra: dict[str, Any],
    ) -> tuple[RunOutcome, dict[str, Any]]:
        channels = tuple(job_extra[k] for k in ("channel_in", "channel_out") if k in job_extra)
        stop_fd = job_extra.get("stop_fd")
        uid = self._uid_for_slot(slot)
        workdir = tempfile.mkdtemp(prefix=f"slot{slot}-", dir=self._work_root)
        token = secrets.token_hex(16)
        status_r, status_w = os.pipe()
        proc: subprocess.Popen[bytes] | None = None
        stdin_file = None
        try:
            if uid is not None:  # matters only without a mount namespace (its tmpfs has this owner)
                os.chown(workdir, uid, uid)
            job = self._job(token, status_w, workdir, program, test, stdin_data is not None, uid, expected, limit)
            job["cgroup_procs"] = self._cgroups.procs_files(slot) if self._cgroups else []
            supervision = ("stop_fd", "wall_budget_s", "extend_per_request_s")
            job.update({k: v for k, v in job_extra.items() if k not in supervision})
            job_fd = _write_job(job)
            if stdin_data is not None:
                # A file, not a pipe: no writer thread, no deadlock if the program never reads.
                stdin_file = tempfile.TemporaryFile(dir=workdir)  # noqa: SIM115 - closed in finally
                stdin_file.write(stdin_data)
                stdin_file.seek(0)
            try:
                proc = _spawn_runner(self._runner, job_fd, workdir, stdin_file, (status_w, *channels))
            finally:
                os.close(job_fd)
            # Our copies of the write ends must go, or the pipes never reach EOF when the child ends.
            os.close(status_w)
            status_w = -1
            for fd in channels:
                os.close(fd)
            channels = ()
            budget = job_extra.get("wall_budget_s", limit + self.config.kill_margin_s)
            extend = job_extra.get("extend_per_request_s", 0.0)
            return self._supervise(proc, status_r, token, budget, output_cap, stop_fd, extend)
        finally:
            if proc is not None:
                _kill_group(proc)
            for fd in (status_r, status_w, *channels):
                if fd >= 0:
                    os.close(fd)
            if stdin_file is not None:
                stdin_file.close()
            shutil.rmtree(workdir, onerror=_force_remove)

    def _job(
        self,
        token: str,
        status_fd: int,
        workdir: str,
        program: str,
        test: str | None,
        stdio: bool,
        uid: int | None,
        expected: dict[str, bool],
        limit: float,
    ) -> dict[str, Any]:
        """What `sandbox.main` reads from its job file."""
        cfg = self.config
        return {
            "token": token,
            "status_fd": status_fd,
            "workdir": workdir,
            "mode": "stdio" if stdio else "assert",
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
            "max_processes": self._process_limit(),
            "max_open_files": cfg.max_open_files,
            "seccomp_bpf": self._seccomp_bpf,
            "remote_calls_path": _REMOTE_CALLS,
        }

    def _supervise(
        self,
        proc: subprocess.Popen[bytes],
        status_r: int,
        token: str,
        budget_s: float,
        output_cap: int,
        stop_fd: int | None = None,
        extend_per_request_s: float = 0.0,
    ) -> tuple[RunOutcome, dict[str, Any]]:
        cfg = self.config
        assert proc.stdout is not None and proc.stderr is not None
        watch = _Watch(
            token=token,
            status_r=status_r,
            out_fd=proc.stdout.fileno(),
            err_fd=proc.stderr.fileno(),
            output_cap=output_cap,
            program_budget_s=budget_s,
            deadline=time.monotonic() + cfg.startup_timeout_s,
            status_cap=cfg.max_workspace_bytes * 4 // 3 + (1 << 20),
            stop_fd=stop_fd,
            extend_per_request_s=extend_per_request_s,
        )
        _watch_until_done(proc, watch)
        usage = _kill_group(proc)
        return _conclude(proc, watch, usage)


@dataclass
class _Watch:
    """What the supervisor has seen of one child so far, and until when it keeps watching."""

    token: str
    status_r: int
    # Kept as numbers: the pipes are closed by the time the outcome is read.
    out_fd: int
    err_fd: int
    output_cap: int
    program_budget_s: float  # from the runner's "start": the time limit plus the kill margin
    deadline: float  # the set-up deadline, until the program starts
    status_cap: int = 1 << 20  # status messages are small, except a bash job's report with its workspace
    stop_fd: int | None = None  # readable (closed) once an assert test's judge is done: its program may go
    extend_per_request_s: float = 0.0  # a judge's budget grows by this much per request it reports
    setup_s: float = 0.0  # and by the time its set-up took
    status_buf: bytearray = field(default_factory=bytearray)
    messages: list[dict[str, Any]] = field(default_factory=list)
    started_at: float | None = None
    ended_at: float | None = None
    verdict: str | None = None  # "timeout" or "output_limit" when the supervisor cut the run short
    output: dict[int, bytearray] = field(init=False)

    def __post_init__(self) -> None:
        self.output = {self.out_fd: bytearray(), self.err_fd: bytearray()}

    def feed(self, fd: int, chunk: bytes) -> None:
        if fd == self.status_r:
            self._feed_status(chunk)
            return
        self.output[fd] += chunk
        if sum(len(b) for b in self.output.values()) > self.output_cap:
            self.verdict = "output_limit"

    def _feed_status(self, chunk: bytes) -> None:
        self.status_buf += chunk
        if b"\n" not in chunk:  # a long message still arriving: split only once it is complete
            if len(self.status_buf) > self.status_cap:
                self.verdict = "output_limit"
            return
        *lines, rest = self.status_buf.split(b"\n")
        self.status_buf = bytearray(rest)
        for line in lines:
            message = _parse_status(line, self.token)
            if message is None:
                continue
            # After "start" a program shares the runner's interpreter and could write anything: a set-up
            # failure it reports is not the sandbox's (never a 500), and only the first of each kind counts.
            if message["kind"] == "setup_error" and self.started_at is not None:
                continue
            if message["kind"] == "progress":
                self._extend(message.get("requests"), message.get("setup_s"))
                continue
            if any(m["kind"] == message["kind"] for m in self.messages):
                continue
            self.messages.append(message)
            if message["kind"] == "start" and self.started_at is None:
                self.started_at = time.monotonic()
                self.deadline = self.started_at + self.program_budget_s

    def _extend(self, requests: Any, setup_s: Any) -> None:
        """A judge's progress: its set-up (importing the modules it trusts) and the requests it has made so far
        extend its budget. Only a judge's job asks for this; a judge runs no program code."""
        if not self.extend_per_request_s or self.started_at is None or not isinstance(requests, int):
            return
        if isinstance(setup_s, (int, float)):
            self.setup_s = min(max(float(setup_s), 0.0), _MAX_JUDGE_SETUP_S)
        extra = min(requests * self.extend_per_request_s, remote_calls.MAX_ROUND_TRIP_ALLOWANCE_S)
        self.deadline = self.started_at + self.program_budget_s + self.setup_s + extra


def _watch_until_done(proc: subprocess.Popen[bytes], watch: _Watch) -> None:
    """Read the child's pipes until they close, a deadline passes or the output cap is exceeded."""
    selector = selectors.DefaultSelector()
    for fd in (*watch.output, watch.status_r):
        selector.register(fd, selectors.EVENT_READ)
    if watch.stop_fd is not None:
        selector.register(watch.stop_fd, selectors.EVENT_READ)
    try:
        while set(selector.get_map()) - {watch.stop_fd} and watch.verdict is None:
            now = time.monotonic()
            if now >= watch.deadline:
                watch.verdict = "timeout"
                break
            if watch.ended_at is None and _has_exited(proc):
                watch.ended_at = now
                # Descendants that escaped the group may hold the pipes open: drain briefly only.
                watch.deadline = min(watch.deadline, now + _EXIT_DRAIN_S)
            for key, _ in selector.select(timeout=min(watch.deadline - now, 0.25)):
                if key.fd == watch.stop_fd:
                    # The judge is done: the program has the drain time to end on its own, then it is stopped.
                    selector.unregister(key.fd)
                    watch.deadline = min(watch.deadline, time.monotonic() + _EXIT_DRAIN_S)
                    continue
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                watch.feed(key.fd, chunk)
                if watch.verdict is not None:
                    break
    finally:
        selector.close()


def _conclude(proc: subprocess.Popen[bytes], watch: _Watch, usage: Any = None) -> tuple[RunOutcome, dict[str, Any]]:
    """Turn what was seen into an outcome; a sandbox that never started the program is a SandboxError."""
    ended = watch.ended_at if watch.ended_at is not None else time.monotonic()
    stdout, stderr = bytes(watch.output[watch.out_fd]), bytes(watch.output[watch.err_fd])
    kinds = {m["kind"]: m for m in watch.messages}
    if "setup_error" in kinds:
        raise SandboxError(f"sandbox set-up failed: {kinds['setup_error'].get('error')}")
    if watch.started_at is None:
        what = "did not start in time" if watch.verdict == "timeout" else f"exited with code {proc.returncode}"
        raise SandboxError(f"sandbox {what}; stderr: {stderr[-1000:].decode(errors='replace')}")
    start = kinds["start"]
    layers = dict(start["layers"]) if isinstance(start.get("layers"), dict) else {}
    layers["notes"] = start["notes"] if isinstance(start.get("notes"), list) else []
    # Measured here, from the runner's "start" to the child's end: a program cannot report its own time.
    verdict, runtime = watch.verdict, ended - watch.started_at
    if verdict is None:
        if "done" in kinds:
            verdict = "ok"
        elif "error" in kinds:
            verdict = f"error:{kinds['error'].get('error')}"
        else:
            verdict = _describe_exit(proc.returncode)
    report = kinds.get("done") or kinds.get("error") or {}
    cpu = None
    if usage is not None and isinstance(start.get("cpu"), (int, float)):
        cpu = max(0.0, usage.ru_utime + usage.ru_stime - float(start["cpu"]))
    return RunOutcome(verdict, runtime, stdout, stderr, report, cpu), layers


def _verdict(outcome: RunOutcome, request: TestRequest, test: Any) -> str:
    """A test's status from its run: "passed", "failed", "timeout", "memory_limit" or what ended it."""
    status = outcome.status
    if request.stdio and status == "exited:0":  # os._exit(0) after printing is a normal stdio exit
        status = "ok"
    if status == "ok" and outcome.runtime > request.max_execution_time:
        status = "timeout"
    if status == "ok":
        if request.stdio and not outputs_match(outcome.stdout.decode(errors="replace"), test["output"]):
            return "failed"
        return "passed"
    if status in ("error:AssertionError", "failed"):
        return "failed"
    if status == "error:MemoryError":
        return "memory_limit"
    return status


def _describe_process_limit(cfg: SandboxConfig, layers: dict[str, Any], process_limit: Any) -> dict[str, Any]:
    """What RLIMIT_NPROC does here, for /health."""
    uid = layers.get("uid")
    if uid == "per-slot":
        return {"binds": True, "limit": cfg.max_processes, "scope": "each slot's own uid"}
    if uid == "nobody":
        return {"binds": True, "limit": process_limit(), "scope": "uid nobody, shared by all slots"}
    share = cfg.max_processes * cfg.max_concurrency
    described = {"binds": True, "limit": f"tasks of uid {os.getuid()} + {share}", "scope": "the service's uid"}
    if _exempt_from_nproc():
        rest = "the pid namespace ends a job's processes" if layers.get("pidns") else "only the guard"
        described.update(binds=False, scope=f"jobs keep root's CAP_SYS_RESOURCE/ADMIN, which ignore it; {rest}")
    return described


def _calibrate(executor: CodeExecutor) -> float:
    """The program process's CPU time per judge request (reading, decoding, encoding, writing), measured on a
    program that does nothing: an assert test is charged its program's CPU time less this much per request the
    judge made, so a test that calls the program 20,000 times costs about what the calls cost in-process. The
    judge counts the requests, so a program cannot add to the allowance."""
    test = f"for i in range({_CALIBRATION_CALLS}):\n    assert same(i) == i"
    try:
        outcome = executor._run_judged("def same(x):\n    return x\n", test, 10.0)
    except SandboxError as e:  # the probe ran: a failure here only costs the allowance
        logger.warning("code sandbox: request cost not calibrated (%s); round trips are charged", e)
        return 0.0
    requests = outcome.report.get("requests")
    if outcome.status == "ok" and isinstance(requests, int) and requests > 0 and outcome.runtime > 0:
        return min(outcome.runtime / requests, _MAX_REQUEST_CPU_S)
    return 0.0


def _judged_jobs(
    cfg: SandboxConfig, program: str, limit: float, judge_cgroup: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The job fields of an assert test's program ("serve") and judge, but for their pipes."""
    # The program is charged its CPU time; the judge stops waiting for it after the limit plus a round-trip
    # allowance per request (`remote_calls.Link`), and this wall-clock budget only backs that up.
    budget = remote_calls.WALL_FACTOR * limit + cfg.kill_margin_s + remote_calls.MAX_ROUND_TRIP_ALLOWANCE_S
    serve = {"mode": "serve", "wall_budget_s": budget}
    # The judge stays out of the slot's cgroup: a program that fills its process or memory budget (a fork bomb)
    # must not keep its judge from starting, which would fail the service instead of the test. It has a cgroup
    # of its own beside the slot's (the same memory and one CPU), and its rlimits (its CPU time at twice the
    # test's limit), so what it decodes cannot take the machine either. Its own wall clock is the test's limit,
    # extended by the round-trip allowance of the requests it reports ("progress"), so a test that sleeps in
    # the judge is cut as it was in-process.
    judge = {
        "mode": "judge",
        "cgroup_procs": judge_cgroup,
        "program_source": program,
        "judge_limit": limit,
        "cpu_seconds": math.ceil(2 * limit) + 2,
        "wall_budget_s": remote_calls.WALL_FACTOR * limit + cfg.kill_margin_s,
        "extend_per_request_s": remote_calls.ROUND_TRIP_ALLOWANCE_S,
    }
    return serve, judge


def _bash_job(cfg: SandboxConfig, request: ExecuteRequest, workdir: str, bash: str | None, shared_memory: bool) -> dict:
    """The job fields of a bash command."""
    extra = {
        "mode": "bash",
        "workdir": workdir,
        "bash": bash,
        "command": request.code,
        "command_timeout": request.timeout,
        "workspace": base64.b64encode(request.workspace).decode(),
        "shell_state": request.shell_state,
        "workspace_bytes": cfg.max_workspace_bytes,
        "workspace_entries": cfg.max_workspace_entries,
    }
    if not shared_memory:
        # No cgroup to hold the job's processes to the limit together: each gets its share.
        extra["memory_bytes"] = (cfg.memory_limit_mb << 20) // cfg.max_processes
    return extra


def _bash_reply(
    outcome: RunOutcome, request: ExecuteRequest, cfg: SandboxConfig, workspace_path: str
) -> dict[str, Any]:
    """A bash command's reply: its exit code, output, workspace and shell state, or what cut it short."""
    stdout, stderr = outcome.stdout.decode(errors="replace"), outcome.stderr.decode(errors="replace")
    report = outcome.report
    if outcome.status == "ok" and report.get("exit_code") is None:
        raise BadRequestError(str(report.get("error", "the workspace could not be unpacked")))
    if outcome.status == "ok":
        return {
            "output": stdout,
            "error": stderr,
            "success": report["exit_code"] == 0,
            "status": "timeout" if report["timed_out"] else "ok",
            "runtime": report["runtime"],
            "exit_code": report["exit_code"],
            "workspace": report["workspace"],
            "shell_state": report["shell_state"],
            "workspace_path": workspace_path,
            "notes": report["notes"],
        }
    problem = {
        "output_limit": f"output exceeded {cfg.max_output_bytes} bytes, so the command was stopped",
        "timeout": "the command and the packing of its workspace overran their time",
    }.get(outcome.status, f"the command ended abnormally ({outcome.status})")
    return {
        "output": stdout,
        "error": stderr,
        "success": False,
        "status": outcome.status,
        "runtime": outcome.runtime,
        "exit_code": None,
        "workspace": None,  # the workspace is as before the command
        "shell_state": request.shell_state,
        "workspace_path": workspace_path,
        "notes": [problem + "; its changes to the workspace are lost"],
    }


def _combine(program: RunOutcome, judge: RunOutcome, request_cpu_s: float = 0.0) -> RunOutcome:
    """One assert test's outcome from its two processes. The judge's verdict stands, except where the program
    process was cut (its output, memory or time) or crashed before answering; the runtime is the program
    process's CPU time (so the pipe round trips are not charged to it), or where the kernel's count is lost
    (the process had to be killed) the time the judge waited for it."""
    output = (program.stdout, program.stderr + judge.stderr)
    waited, requests = judge.report.get("program_seconds"), judge.report.get("requests")
    runtime = float(waited) if isinstance(waited, (int, float)) else judge.runtime
    if program.cpu is not None:
        runtime = max(0.0, program.cpu - request_cpu_s * (requests if isinstance(requests, int) else 0))
    if judge.status == "error:ProgramTimeout":
        return RunOutcome("timeout", runtime, *output, judge.report)
    if program.status == "output_limit" or (program.status == "timeout" and judge.status != "ok"):
        return RunOutcome(program.status, runtime, *output, judge.report)
    if judge.status == "error:ProgramEnded" and program.status != "ok":
        return RunOutcome(program.status, runtime, *output, judge.report)
    if judge.status.startswith("error:") and judge.status not in ("error:AssertionError", "error:ProgramEnded"):
        # The test itself raised (a NameError for a name the program lacks, a TypeError for a value that is not
        # plain data): an error, as in-process; the judge's own protocol faults are a failed test.
        protocol = judge.status in ("error:ProtocolError", "error:RemoteError")
        return RunOutcome("failed" if protocol else judge.status, runtime, *output, judge.report)
    return RunOutcome(judge.status, runtime, *output, judge.report)


def _slot_cgroups(cfg: SandboxConfig, tag: str) -> tuple[slot_cgroups.SlotCgroups | None, dict[str, Any]]:
    """The slots' cgroups where the kernel allows them, and what /health says of them (or of their absence)."""
    limits = SlotLimits(cfg.memory_limit_mb << 20, cfg.max_processes)
    made, why = (None, "kernel_isolation is off")
    if cfg.kernel_isolation:
        # One per slot for its jobs, then one per slot for its judges (slot `max_concurrency + slot`).
        made, why = slot_cgroups.create(2 * cfg.max_concurrency, limits, tag)
    if made is not None:
        return made, made.describe(limits)
    share = cfg.memory_limit_mb // cfg.max_processes
    instead = f"rlimits per process: a bash job's {cfg.max_processes} processes get {share} MiB each"
    return None, {"per_slot": False, "why": why, "instead": instead}


def _why_weak(cfg: SandboxConfig, failures: list[str]) -> str:
    if not cfg.kernel_isolation:
        return "kernel_isolation is off (--no_kernel_isolation)"
    if os.geteuid() != 0:
        return f"the service runs as uid {os.geteuid()}, not root"
    detail = " ".join("; ".join(failures).split())  # one line: probe errors may quote a multi-line stderr
    return "the kernel refused them" + (f" ({detail[:400]})" if detail else "")


def _exempt_from_nproc() -> bool:
    """Whether this process (and so a job that keeps its uid) has CAP_SYS_RESOURCE or CAP_SYS_ADMIN, which
    the kernel lets fork past RLIMIT_NPROC."""
    with open("/proc/self/status", "rb") as f:
        fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
    return bool(int(fields[b"CapEff"], 16) & (1 << 24 | 1 << 21))


def _tasks_of_uid(uid: int) -> int:
    """Threads of every process whose real uid is `uid`: what RLIMIT_NPROC compares with its limit."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                status = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = dict(line.split(b":", 1) for line in status.splitlines() if b":" in line)
        with contextlib.suppress(KeyError, ValueError, IndexError):
            if int(fields[b"Uid"].split()[0]) == uid:
                total += int(fields[b"Threads"])
    return total


def _write_job(job: dict[str, Any]) -> int:
    """The job in an anonymous memory file: no path on any filesystem, so no other job can list or read it (the
    judge's holds the test). The runner reads and closes it before the program runs."""
    fd = os.memfd_create("oi-code-job", os.MFD_CLOEXEC)
    data = memoryview(json.dumps(job).encode())
    while data:
        data = data[os.write(fd, data) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _compile_runner(work_root: str) -> str:
    """The runner compiled once, into the work root: every job starts it, and compiling its source each time
    cost about 10 ms of CPU per process (two per assert test). Tracebacks still name `code_server/sandbox.py`."""
    path = os.path.join(work_root, "runner.pyc")
    py_compile.compile(_RUNNER, cfile=path, dfile=_RUNNER, doraise=True)
    os.chmod(path, 0o444)
    return path


def _spawn_runner(
    runner: str, job_fd: int, workdir: str, stdin_file: IO[bytes] | None, pass_fds: tuple[int, ...]
) -> subprocess.Popen[bytes]:
    # A minimal environment: nothing of the server's (credentials, proxies) reaches the program, and one
    # thread per numeric library keeps a test from taking over the machine.
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
    return subprocess.Popen(
        [sys.executable, "-I", "-X", "utf8", runner, f"fd:{job_fd}"],
        stdin=stdin_file if stdin_file is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(job_fd, *pass_fds),
        cwd=workdir,
        env=env,
        # Its own process group, so one killpg also reaches whatever the program started.
        start_new_session=True,
    )


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


def _kill_group(proc: subprocess.Popen[bytes]) -> Any:
    """Kill what is left of the child's group and reap it; returns the kernel's resource usage of the child and
    the descendants it reaped (None if it was reaped already)."""
    usage = None
    if proc.returncode is None:  # once reaped, the group id may belong to someone else
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None and not stream.closed:
            stream.close()
    return usage


def _force_remove(func: Any, path: str, exc_info: Any) -> None:
    # Without root a program may chmod its own files read-only; restore access and retry once.
    with contextlib.suppress(OSError):
        os.chmod(os.path.dirname(path), 0o700)
        os.chmod(path, 0o700)
        func(path)
