"""Process bookkeeping for tests that start daemons in their own session (Ray, the code service)."""

import os
import socket
from pathlib import Path

# scripts/soak.py runs standalone, so the session bookkeeping lives there and the tests borrow it: the live
# processes of a session, the bash (or trainer) a test started and everything it spawned.
from scripts.soak import session_pids

REPO = Path(__file__).resolve().parents[2]


def start_grpo_session(args: list[str], out: Path, log_path: Path, script: Path | None = None, env=None):
    """grpo_fast.py (or `script`, a wrapper of it) in its own session (so its actors can be found and killed),
    output to `log_path`; `env`: variables on top of this process's."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    script = script or repo / "open_instruct" / "grpo_fast.py"
    environment = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [sys.executable, str(script), "--output_dir", str(out), *args],
            cwd=repo,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=environment,
        )


def kill_actor_when(proc, ready, actor_class: str, log_path: Path, timeout_s: float = 600) -> list[int]:
    """Once `ready()` (or the run ended), SIGKILL the first Ray actor process of `actor_class` in the run's
    session; returns the pids of that class found."""
    import os
    import signal
    import time

    deadline = time.monotonic() + timeout_s
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    actors = [p for p in session_pids(proc.pid) if actor_class in Path(f"/proc/{p}/cmdline").read_text()]
    assert actors, log_path.read_text()[-3000:]
    os.kill(actors[0], signal.SIGKILL)
    return actors


def free_port() -> int:
    """A TCP port nothing on this machine listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pids_mentioning(text: str) -> list[int]:
    """Processes whose command line mentions `text` (a test's unique temp dir), in case one left its session."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if text.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids
