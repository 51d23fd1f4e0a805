"""Record the mason.py launch line of every open-instruct script that launches grpo_fast.py through it.

What: each script of an open-instruct checkout that names open_instruct/grpo_fast.py runs in bash with
stand-ins for `beaker` (whoami answers a fixed user), `uv` and `python` that only record their argv, so
every variable, `$(...)` and `$RANDOM` (seeded) is expanded exactly as bash would. A script that reads an
image name from its first argument (as scripts/train/build_image_and_launch.sh passes it) gets one. Every
mason.py call is written to tests/data/open_instruct_mason_launches.json (mason's argv after `mason.py`).

Run: `.venv/bin/python scripts/record_mason_launches.py /path/to/open-instruct e6c3044` (seconds; any
machine with bash and git, nothing is launched).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "data" / "open_instruct_mason_launches.json"
USER = "testuser"
IMAGE = f"{USER}/open-instruct-integration-test-main-cuda12"  # what build_image_and_launch.sh passes as $1
LAUNCHER = "scripts/train/build_image_and_launch.sh"
STUB = f"""#!{sys.executable}
import json, os, sys
name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
if name == "beaker":
    sys.exit(0 if args[:2] == ["account", "whoami"] and print(json.dumps([{{"name": "{USER}"}}])) is None else 1)
if name == "uv":
    if not args or args[0] != "run":
        sys.exit(0)
    args = args[1:]
    while args and args[0].startswith("-"):  # uv's own flags (--no-sync, --frozen, ...)
        args = args[1:]
if args and os.path.basename(args[0]).startswith("python"):
    args = args[1:]
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps(args) + "\\n")
"""


def git_show(checkout: str, commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "-C", checkout, "show", f"{commit}:{path}"], capture_output=True, text=True, check=True
    ).stdout


def calls_of(body: str, script: str) -> list[list[str]]:
    """Every argv the script hands to python or uv run, with the script run as bash would run it."""
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        (tmp / "bin").mkdir()
        for name in ("beaker", "uv", "python", "python3"):
            (tmp / "bin" / name).write_text(STUB)
            (tmp / "bin" / name).chmod(0o755)
        (tmp / "work" / script).parent.mkdir(parents=True)
        (tmp / "work" / script).write_text(body)
        record = tmp / "calls.jsonl"
        env = {"PATH": f"{tmp / 'bin'}:/usr/bin:/bin", "HOME": str(tmp), "RECORD": str(record)}
        takes_image = "$1" in body or "${1" in body
        subprocess.run(
            ["bash", "-c", 'RANDOM=1; . "$0" "$@"', script, *([IMAGE] if takes_image else [])],
            cwd=tmp / "work",
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def main(checkout: str, commit: str) -> None:
    listed = subprocess.run(
        ["git", "-C", checkout, "grep", "-l", "open_instruct/grpo_fast.py", commit, "--", "scripts"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    launches = []
    for script in sorted(line.split(":", 1)[1] for line in listed.splitlines()):
        body = git_show(checkout, commit, script)
        for argv in calls_of(body, script):
            if argv and argv[0].endswith("mason.py"):
                launches.append({"script": script, "argv": argv[1:], "via_launcher": f"{LAUNCHER} {script}" in body})
    OUT.write_text(
        json.dumps(
            {
                "source": f"allenai/open-instruct at {commit}: the mason.py line of every script that names "
                "open_instruct/grpo_fast.py, variables expanded as bash would (scripts/record_mason_launches.py)",
                "beaker_user": USER,
                "image_argument": IMAGE,
                "launches": launches,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"{len(launches)} mason.py launches -> {OUT.relative_to(REPO)}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
