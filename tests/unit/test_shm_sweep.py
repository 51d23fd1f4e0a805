"""The sweep of shared-memory files left by killed engines (`open_instruct.weights.shm_sweep`): the decision on its
own, then with files in a temp dir standing in for /dev/shm and a fake /proc, then one real child process
that maps a file (kept) next to an unmapped old one (removed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from open_instruct.weights import shm_sweep

NOW = 1_000_000.0


def test_the_decision_takes_only_unheld_files_older_than_the_margin():
    files = {"/shm/psm_old": NOW - 600, "/shm/psm_held": NOW - 600, "/shm/psm_new": NOW - 5}
    assert shm_sweep.orphaned(files, {"/shm/psm_held"}, NOW, margin_s=60) == ["/shm/psm_old"]
    assert shm_sweep.orphaned(files, set(), NOW, margin_s=60) == ["/shm/psm_held", "/shm/psm_old"]
    assert shm_sweep.orphaned(files, None, NOW, margin_s=60) == []  # process table unreadable: keep all


def shm_file(directory, name: str, age_s: float, mode: int = 0o600) -> str:
    path = directory / name
    path.write_bytes(b"\0" * 64)
    path.chmod(mode)
    os.utime(path, (NOW - age_s, NOW - age_s))
    return str(path)


def fake_proc(root, processes: dict[str, tuple[list[str], list[str]]], starts: dict[str, int] | None = None):
    """/proc with one directory per pid: `maps` lines naming `mapped`, `fd/N` links to `open_files`, and
    `stat` with its start time (`starts`, default 900; this process, `self`, started at 500)."""
    starts = starts or {}
    for pid, (mapped, open_files) in processes.items():
        (root / pid / "fd").mkdir(parents=True)
        lines = [
            "7f00-7f01 r-xp 00000000 08:01 42                         /usr/lib/libc.so.6",
            "7f02-7f03 rw-p 0 0:0 0",
        ]
        lines += [f"7f10-7f20 rw-s 00000000 00:1a 1234                       {path}" for path in mapped]
        (root / pid / "maps").write_text("\n".join(lines) + "\n")
        for i, path in enumerate(open_files):
            (root / pid / "fd" / str(i)).symlink_to(path)
    (root / "self").mkdir()  # not a pid: ignored
    for pid in [*processes, "self"]:
        started = 500 if pid == "self" else starts.get(pid, 900)
        (root / pid / "stat").write_text(f"{pid} (python (x) y) S 1 " + " ".join(["0"] * 17) + f" {started} 0 0\n")
    return root


def test_a_sweep_keeps_mapped_open_young_foreign_and_unrelated_files(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    shm = shm.resolve()
    orphan = shm_file(shm, "psm_orphan", age_s=600)
    mapped = shm_file(shm, "psm_mapped", age_s=600)
    held_open = shm_file(shm, "psm_open", age_s=600)
    deleted_mapping = shm_file(shm, "psm_gone", age_s=600)  # maps says "(deleted)": another inode, same name
    young = shm_file(shm, "psm_young", age_s=5)  # being created: not mapped yet
    shared = shm_file(shm, "psm_shared", age_s=600, mode=0o644)  # others may open it: not ours to judge
    ours = shm_file(shm, "ow_weights-1-v1", age_s=600)  # not a psm_ file
    proc = fake_proc(
        tmp_path / "proc",
        {"100": ([mapped, f"{deleted_mapping} (deleted)"], []), "200": ([], [held_open, "/dev/null"])},
    )
    removed = shm_sweep.sweep(str(shm), str(proc), margin_s=60, now=NOW)
    assert sorted(removed) == sorted([orphan, deleted_mapping]), removed
    remaining = {str(p) for p in shm.iterdir()}
    assert remaining == {mapped, held_open, young, shared, ours}


def test_a_process_of_ours_started_after_us_that_cannot_be_read_stops_the_sweep(tmp_path, monkeypatch):
    """Pid 100 (started after us: it could be one of our engines) is unreadable: nothing is removed. Pid 1,
    unreadable too but older than us (a container's init), does not count."""
    shm = tmp_path / "shm"
    shm.mkdir()
    orphan = shm_file(shm.resolve(), "psm_orphan", age_s=600)
    real_paths_of = shm_sweep._paths_of

    def unreadable(process: str, prefix: str):
        if os.path.basename(process) in ("1", "100"):
            raise PermissionError(13, "Permission denied")
        return real_paths_of(process, prefix)

    monkeypatch.setattr(shm_sweep, "_paths_of", unreadable)
    proc = fake_proc(tmp_path / "proc", {"1": ([], []), "100": ([], [])}, starts={"1": 10})
    assert shm_sweep.sweep(str(shm), str(proc), margin_s=60, now=NOW) == []
    assert os.path.exists(orphan)
    proc = fake_proc(tmp_path / "proc_init_only", {"1": ([], [])}, starts={"1": 10})
    assert shm_sweep.sweep(str(shm), str(proc), margin_s=60, now=NOW) == [orphan]


CHILD = """
import mmap, sys
with open(sys.argv[1], "r+b") as f:
    m = mmap.mmap(f.fileno(), 0)
print("mapped", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def test_a_file_mapped_by_a_live_process_is_kept_and_an_unmapped_old_one_removed(tmp_path):
    """Real /proc: the child maps its file (and closed the descriptor); both files are older than the margin."""
    now = time.time()
    mapped, unmapped = tmp_path / "psm_child", tmp_path / "psm_left"
    for path in (mapped, unmapped):
        path.write_bytes(b"\0" * 4096)
        path.chmod(0o600)
        os.utime(path, (now - 600, now - 600))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(mapped)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "mapped"  # handshake: the mapping exists now
        removed = shm_sweep.sweep(str(tmp_path), margin_s=60)
        assert removed == [str(unmapped.resolve())]
        assert mapped.exists() and not unmapped.exists()
    finally:
        child.stdin.close()
        child.wait(timeout=60)
