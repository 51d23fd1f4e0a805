"""The README's layout tree lists exactly the package's modules (keeps docs and code from drifting)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_readme_layout_lists_every_module_and_nothing_else():
    """Folders sit at indent 0 (`open_instruct/`) or 2 (`  rewards/`); files at 0, 2 or 4 under them."""
    readme = (REPO / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("```")[1]
    listed, top, sub = set(), "", ""
    for line in layout.splitlines():
        match = re.match(r"^(\s*)(\S+\.py|\S+/)\s", line + " ")
        if not match:
            continue
        indent, name = len(match.group(1)), match.group(2)
        if name.endswith("/"):
            if indent == 0:
                top, sub = name, ""
            elif indent == 2:
                sub = name
            continue
        listed.add(name if indent == 0 else top + (sub if indent >= 4 else "") + name)
    actual = {
        str(p.relative_to(REPO)) for folder in ("open_instruct", "code_server") for p in (REPO / folder).rglob("*.py")
    }
    actual |= {p.name for p in REPO.glob("*.py")}
    assert listed == actual, f"missing from README: {actual - listed}; stale in README: {listed - actual}"


def test_readme_names_exactly_the_two_setup_and_run_commands():
    readme = (REPO / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick.strip().splitlines()]
    assert commands == ["bash scripts/cpu_demo.sh", "bash scripts/test.sh"]
    assert "bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()
