"""The package maps list exactly the modules, and the README points at every map (keeps docs and code from
drifting)."""

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = [
    REPO / "open_instruct",
    *sorted(p.parent for p in (REPO / "open_instruct").glob("*/__init__.py")),
    REPO / "code_server",
    REPO / "benchmarks",
]


def test_every_module_is_on_its_packages_map_and_nothing_stale_is():
    """Each package's __init__.py docstring names each of its modules (`name` or name.py), and every name.py it
    names exists there."""
    for package in PACKAGES:
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        words = set(re.findall(r"[\w.]+", doc))
        modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
        missing = sorted(m for m in modules if m not in words and m.removesuffix(".py") not in words)
        named = {w for w in words if w.endswith(".py") and "." not in w[:-3] and w != "__init__.py"}
        # A name may be another package's (grpo_fast.py) or the root's (mason.py): stale only if it is nowhere.
        elsewhere = {p.name for p in REPO.glob("*.py")} | {p.name for p in (REPO / "open_instruct").glob("*.py")}
        stale = sorted(named - modules - elsewhere)
        where = (package / "__init__.py").relative_to(REPO)
        assert not missing and not stale, f"{where}: modules missing from its map {missing}, stale {stale}"


def test_the_readme_layout_points_at_every_package_map():
    readme = (REPO / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("```")[1]
    assert len(layout.strip().splitlines()) <= 14, "the layout is a pointer to the maps, not a second copy"
    for package in PACKAGES[1:]:
        assert f"{package.name}/" in layout, f"the README's layout does not name {package.name}/"
    for top in ("configs/", "scripts/", "tests/", "docs/", "mason.py"):
        assert top in layout


def test_readme_names_exactly_the_two_setup_and_run_commands():
    readme = (REPO / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick.strip().splitlines()]
    assert commands == ["bash scripts/cpu_demo.sh", "bash scripts/test.sh"]
    assert "bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()
