"""The service's limits and switches, shared by the request parser, the executor and the CLI."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SandboxConfig:
    max_concurrency: int = field(default_factory=lambda: 2 * (os.cpu_count() or 1))
    memory_limit_mb: int = 2048  # RLIMIT_AS: address space, so it over-counts compared with RSS
    max_output_bytes: int = 1 << 20  # stdout+stderr captured per test; beyond it the test fails
    max_file_size_mb: int = 16  # RLIMIT_FSIZE
    workdir_size_mb: int = 64  # tmpfs size of the work dir (kernel layers only)
    # RLIMIT_NPROC per sandbox uid. Without a uid of its own a slot shares the service's uid, so the limit
    # becomes that uid's current task count plus this many per slot (see `CodeExecutor.process_limit`).
    max_processes: int = 16
    max_open_files: int = 256
    max_execution_time_cap: float = 60.0
    startup_timeout_s: float = 10.0  # interpreter + sandbox set-up; beyond it the service is failing
    kill_margin_s: float = 0.5
    kernel_isolation: bool = True  # namespaces + uid drop, when running as root
    python_guard: bool = True
    # Without every kernel layer (not root, or kernel_isolation off) only the Python guard stands between a
    # program and the host, so the service refuses to start unless this says the weak mode is wanted
    # (`--allow_weak_sandbox`, or CODE_SANDBOX_ALLOW_WEAK=1 for the CLI).
    allow_weak_sandbox: bool = False
    sandbox_uid_base: int = 990_000
    max_request_bytes: int = 64 << 20  # a larger Content-Length is answered 413 without reading the body
    max_tests: int = 4096
    # Limits on what a body may decode to, so a malformed or hostile one is a 400, never a dropped connection
    # or an exhausted server: JSON (and pickled tests) nested deeper than `max_json_depth`, and 'tests' whose
    # decompressed pickle, or the text its shared references expand to, exceeds `max_tests_bytes`.
    max_json_depth: int = 64
    max_tests_bytes: int = 64 << 20
    # Socket timeout on each connection: a client that stops sending (mid-headers or mid-body) or leaves a
    # kept-alive connection idle is cut after this long, freeing its thread; the whole body must also arrive
    # within it.
    request_timeout_s: float = 30.0
    work_root: str | None = None  # default: a fresh directory under the system temp dir
    # `/execute` with language "bash" (the generic_sandbox environment): the sample's workspace travels with
    # each request and reply as a tar.gz archive of at most this many bytes, and packing it may take this long
    # after the command's own time limit.
    max_workspace_bytes: int = 16 << 20
    # Files, directories and links in a workspace: a command that makes more keeps none of its changes, so no
    # archive of 100k tiny files reaches the trainer, whose unpacking would cost seconds per step.
    max_workspace_entries: int = 10_000
    workspace_pack_s: float = 5.0
