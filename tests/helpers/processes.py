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


# Ray's worker ports end here (its --max-worker-port default); the OS's ephemeral range starts above ours.
_ABOVE_RAY_WORKERS = 20000


def free_port() -> int:
    """A TCP port nothing on this machine listens on right now, for a daemon that binds it itself later. Drawn
    below the OS's ephemeral range: a port the OS picked (for a bind to port 0, or an outgoing connection of
    any process: Ray's, vLLM's, another test's) could be picked again before the daemon binds it, and the
    daemon would fail to start with EADDRINUSE."""
    import random

    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    draw = random.SystemRandom()
    for _ in range(200):
        port = draw.randrange(_ABOVE_RAY_WORKERS, ephemeral_low)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in [{_ABOVE_RAY_WORKERS}, {ephemeral_low}) after 200 draws")


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
