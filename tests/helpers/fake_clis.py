"""Stand-ins for the `beaker` and `docker` CLIs that mason.py and scripts/train/build_image_and_launch.sh call:
each records its argv and answers what those read, as the environment tells it.

Environment of a call: CLI_LOG (a file: one JSON line [name, *argv] per call), FAKE_BEAKER_USER (whoami's
name, default alice), FAKE_BEAKER_SECRETS (the workspace's secret names, space-separated),
FAKE_IMAGE_DESCRIPTION (an existing image's description; unset: no such image), FAKE_BEAKER_EXPERIMENT (a
file: `experiment create` writes {"argv", "spec"} there) and FAKE_BEAKER_EXIT (its exit status, default 0).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

FAKE_CLI = f"""#!{sys.executable}
import json, os, sys
name, argv = os.path.basename(sys.argv[0]), sys.argv[1:]
if os.environ.get("CLI_LOG"):
    with open(os.environ["CLI_LOG"], "a") as log:
        log.write(json.dumps([name, *argv]) + "\\n")
if name != "beaker":
    sys.exit(0)
if argv[:2] == ["account", "whoami"]:
    print(json.dumps([{{"name": os.environ.get("FAKE_BEAKER_USER", "alice")}}]))
elif argv[:2] == ["secret", "list"]:
    print(json.dumps([{{"name": n}} for n in os.environ.get("FAKE_BEAKER_SECRETS", "").split()]))
elif argv[:2] == ["image", "get"]:
    description = os.environ.get("FAKE_IMAGE_DESCRIPTION")
    if description is None:
        sys.exit("image not found")
    print(json.dumps([{{"description": description}}]))
elif argv[:2] == ["image", "rename"]:
    sys.exit("image not found")
elif argv[:2] == ["experiment", "create"]:
    with open(os.environ["FAKE_BEAKER_EXPERIMENT"], "w") as out:
        json.dump({{"argv": argv, "spec": open(argv[2]).read()}}, out)
    sys.exit(int(os.environ.get("FAKE_BEAKER_EXIT", "0")))
"""


def install(directory: Path, names: tuple[str, ...] = ("beaker",)) -> Path:
    """The stand-ins named in `names`, in `directory` (put it first on PATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_text(FAKE_CLI)
        (directory / name).chmod(0o755)
    return directory


def calls(log: Path) -> list[list[str]]:
    """Every recorded call, [name, *argv], in order."""
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
