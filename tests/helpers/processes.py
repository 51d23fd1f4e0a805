"""Process bookkeeping for tests that start daemons in their own session (Ray, the code service)."""

from pathlib import Path


def session_pids(sid: int) -> list[int]:
    """Live processes of session `sid`: the bash a test started and everything it spawned."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if fields[0] != "Z" and int(fields[3]) == sid:  # state ppid pgrp session; zombies are already dead
            pids.append(int(entry.name))
    return pids
