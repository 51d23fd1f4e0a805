"""tests/MODULES.md, the map from each module to its tests, stays true: every module of the code has a row, every
test file is named in a row, and every module and file the map names exists. The test folders are flat and
behaviour-named; the map is how a module's tests are found from its name.

The code is `open_instruct/`, `benchmarks/`, `scripts/`, `code_server/` and `mason.py`; a package's
`__init__.py` that defines no function or class (a map of its package, re-exports) has no row. A row names its
test files in backticks, relative to tests/; a row with none says "no tests" in its note. The second table
maps what is not a Python module (shell scripts, the image, docs) by its path from the repository's root.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
MAP = TESTS / "MODULES.md"
SOURCES = ("open_instruct", "benchmarks", "scripts", "code_server")
TIERS = ("unit", "integration", "nightly")
BACKTICKED = re.compile(r"`([^`]+)`")


def code_modules() -> set[str]:
    """Dotted names of every module of the code, `mason` included; a package's `__init__` only when it holds code."""
    names = {"mason"}
    for source in SOURCES:
        for path in (REPO / source).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                tree = ast.parse(path.read_text())
                if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in tree.body):
                    continue
                parts = parts[:-1]
            names.add(".".join(parts))
    return names


def tier_files() -> set[str]:
    """Every test file of the three tiers, as the map writes it (`unit/test_x.py`)."""
    return {f"{tier}/{path.name}" for tier in TIERS for path in (TESTS / tier).glob("test_*.py")}


def tables() -> dict[str, list[tuple[str, list[str], str]]]:
    """The map's tables by their heading: (subject, test files, note) per row."""
    found: dict[str, list[tuple[str, list[str], str]]] = {}
    heading = None
    for line in MAP.read_text().splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
            found[heading] = []
        elif heading and line.startswith("|") and not line.startswith(("|---", "| module ", "| file ")):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            assert len(cells) == 3, f"tests/MODULES.md: a row needs 3 cells (subject | tests | note): {line}"
            subject, files, note = cells
            subject_match = BACKTICKED.fullmatch(subject)
            assert subject_match, f"tests/MODULES.md: a row's first cell is one backticked name: {line}"
            name = subject_match.group(1)
            named = BACKTICKED.findall(files)
            rest = BACKTICKED.sub("", files).replace(",", "").strip()
            assert not rest, (
                f"tests/MODULES.md: the tests of `{name}` are backticked paths only; move `{rest}` to the note"
            )
            found[heading].append((name, named, note))
    return found


def rows() -> list[tuple[str, list[str], str]]:
    return tables()["Modules"]


def other_rows() -> list[tuple[str, list[str], str]]:
    return tables()["Other files"]


def test_every_module_has_a_row():
    mapped = {name for name, _, _ in rows()}
    missing = sorted(code_modules() - mapped)
    assert not missing, "\n".join(f"add a row for `{m}` to tests/MODULES.md (its test files)" for m in missing)


def test_every_test_file_is_named_in_a_row():
    named = {f for _, files, _ in rows() + other_rows() for f in files}
    missing = sorted(tier_files() - named)
    assert not missing, "\n".join(
        f"name tests/{f} in tests/MODULES.md, in the row of the module it tests" for f in missing
    )


def test_every_file_the_map_names_exists():
    gone = sorted({f for _, files, _ in rows() + other_rows() for f in files} - tier_files())
    assert not gone, "\n".join(
        f"tests/MODULES.md names tests/{f}, which is no test file: fix or remove it" for f in gone
    )


def test_every_row_names_an_existing_module_or_file():
    modules = code_modules()
    stale = [
        f"tests/MODULES.md has a row for `{name}`, which is no module: fix or remove it"
        for name, _, _ in rows()
        if name not in modules
    ]
    stale += [
        f"tests/MODULES.md has a row for `{name}`, which does not exist: fix or remove it"
        for name, _, _ in other_rows()
        if not (REPO / name).exists()
    ]
    assert not stale, "\n".join(stale)


def test_each_subject_has_one_row_and_a_row_without_tests_says_so():
    subjects = [name for name, _, _ in rows() + other_rows()]
    twice = sorted({name for name in subjects if subjects.count(name) > 1})
    assert not twice, "\n".join(f"merge the rows of `{name}` in tests/MODULES.md into one" for name in twice)
    silent = [name for name, files, note in rows() if not files and not note.startswith("no tests")]
    assert not silent, "\n".join(
        f"name the tests of `{n}` in tests/MODULES.md, or say 'no tests' and why" for n in silent
    )


def test_a_unit_file_named_for_a_module_is_in_that_modules_row():
    """tests/unit/test_packing.py is found under `open_instruct.packing`: the name a reader tries first is right.
    A name that several modules or packages end with (`config`, `generation`) names none of them."""
    modules = code_modules()
    packages = {".".join(p.parent.relative_to(REPO).parts) for s in SOURCES for p in (REPO / s).rglob("__init__.py")}
    by_last: dict[str, list[str]] = {}
    for name in modules | packages:
        by_last.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    files_of = {name: files for name, files, _ in rows()}
    wrong = []
    for path in sorted((TESTS / "unit").glob("test_*.py")):
        named_for = by_last.get(path.stem.removeprefix("test_"), [])
        if (
            len(named_for) == 1
            and named_for[0] in modules
            and f"unit/{path.name}" not in files_of.get(named_for[0], [])
        ):
            wrong.append(
                f"tests/MODULES.md: list unit/{path.name} in the row of `{named_for[0]}`, the module it is named for"
            )
    assert not wrong, "\n".join(wrong)


def test_the_map_reads_what_it_should():
    """The checks above are only as good as the parser: a module's tests are found from its name."""
    files_of = {name: files for name, files, _ in rows()}
    assert files_of["open_instruct.learner.logprobs"] == ["unit/test_logprobs.py"]
    assert "nightly/test_benchmarks_quick.py" in files_of["benchmarks.lora"]
    assert "integration/test_mason_dataset_cache.py" in files_of["mason"]
    assert "open_instruct.rewards" in code_modules()  # an __init__ with code has a row
    assert "open_instruct.learner" not in code_modules() and "code_server" not in code_modules()  # maps do not
    assert ("scripts/slurm.sh", ["integration/test_node_launch.py"]) in [(n, f) for n, f, _ in other_rows()]
