"""The README's layout tree lists exactly the package's modules (keeps docs and code from drifting)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_readme_layout_lists_every_module_and_nothing_else():
    readme = (REPO / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("```")[1]
    listed, folder = set(), ""
    for line in layout.splitlines():
        match = re.match(r"^(\s*)(\S+\.py|\S+/)\s", line + " ")
        if not match:
            continue
        indent, name = len(match.group(1)), match.group(2)
        if name.endswith("/"):
            folder = name if indent == 2 else ""
            continue
        listed.add(f"open_instruct/{folder}{name}" if indent >= 2 else name)
    actual = {str(p.relative_to(REPO)) for p in (REPO / "open_instruct").rglob("*.py")}
    actual |= {p.name for p in REPO.glob("*.py")}
    assert listed == actual, f"missing from README: {actual - listed}; stale in README: {listed - actual}"


def test_readme_names_exactly_the_two_setup_and_run_commands():
    readme = (REPO / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick.strip().splitlines()]
    assert commands == ["bash scripts/cpu_demo.sh", "bash scripts/test.sh"]
    assert "bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()
