"""The docs stay true: the configuration page is the code's, the site builds strictly (broken links and
pages missing from the nav fail it), and the README stays a short front page whose links resolve."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _config_docs():
    spec = importlib.util.spec_from_file_location("config_docs", REPO / "scripts" / "config_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_page_is_generated_from_the_flags():
    page = (REPO / "docs" / "configuration.md").read_text()
    assert page == _config_docs().render(), "docs/configuration.md is stale: run python scripts/config_docs.py"


def test_the_configuration_page_lists_every_flag_with_its_kind():
    from open_instruct.config.core import flag_names

    page = (REPO / "docs" / "configuration.md").read_text()
    rows = re.findall(
        r"^\| `--(\w+)` \| .*? \| (works|Beaker only|no effect \(as in open-instruct\)|not supported yet) \|",
        page,
        re.M,
    )
    assert sorted(name for name, _ in rows) == sorted(flag_names())
    kinds = dict(rows)
    assert kinds["learning_rate"] == "works" and kinds["oe_eval_tasks"] == "Beaker only"


def test_the_site_builds_strictly(tmp_path):
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")]
    built = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    assert (tmp_path / "site" / "configuration" / "index.html").exists()


def test_every_page_is_in_the_nav():
    config = (REPO / "mkdocs.yml").read_text()
    listed = set(re.findall(r"[:-]\s*(\S+\.md)\s*$", config, re.M))  # "- Title: page.md" or "- page.md"
    docs = REPO / "docs"
    assert listed == {p.relative_to(docs).as_posix() for p in docs.rglob("*.md")}


def test_the_readme_is_a_short_front_page_whose_links_resolve():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert targets and all((REPO / t).exists() for t in targets if "://" not in t), targets


# Other programs' options the docs quote (pip, apt, pytest-xdist, accelerate, mkdocs): not ours to check.
FOREIGN_FLAGS = {"--extra-index-url", "--no-build-isolation", "--yes", "--dist", "--num_processes", "--strict"}
# sbatch/srun (and pyxis) and docker options that docs/clusters.md quotes.
FOREIGN_FLAGS |= {"--nodes", "--ntasks-per-node", "--gpus-per-node", "--exclusive", "--kill-on-bad-exit"}
FOREIGN_FLAGS |= {"--container-image", "--ipc", "--privileged", "--shm-size", "--ulimit"}
# docker buildx / buildah (and git) options that docs/image.md quotes.
FOREIGN_FLAGS |= {"--build-arg", "--layers", "--mount", "--secret", "--skip-unused-stages", "--volume", "--device"}
FOREIGN_FLAGS |= {"--show-current"}
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def our_flags() -> set[str]:
    """grpo_fast's flags and every other command line of this repository (benchmarks, scripts, mason)."""
    from open_instruct.config.core import build_parser

    spec = importlib.util.spec_from_file_location("mason", REPO / "mason.py")
    mason = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mason)
    flags = {option for action in build_parser()._actions for option in action.option_strings}
    flags |= {option for action in mason._build_parser()._actions for option in action.option_strings}
    sources = [*REPO.glob("*.py"), *(REPO / "open_instruct").rglob("*.py"), *(REPO / "scripts").rglob("*.py")]
    sources += [*(REPO / "code_server").glob("*.py")]
    for source in sources:
        flags |= set(re.findall(r"""["'](--[A-Za-z][\w-]*)["']""", source.read_text()))
    for script in (REPO / "scripts").rglob("*.sh"):
        flags |= set(re.findall(r"(--[A-Za-z][\w-]*)\)", script.read_text()))  # a case pattern: --dry_run)
    return flags


def test_every_flag_the_docs_name_exists():
    known = our_flags() | FOREIGN_FLAGS
    unknown = []
    for doc in DOCS:
        for flag, star in re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)(\*?)", doc.read_text()):
            exists = any(k.startswith(flag) for k in known) if star else flag in known
            if not exists:
                unknown.append(f"{doc.relative_to(REPO)}: {flag}{star}")
    assert not unknown, "flags the docs name that no command line here has:\n" + "\n".join(sorted(set(unknown)))


def test_every_file_path_the_docs_name_exists():
    """Paths into this repository's folders; a path introduced as open-instruct's is in its tree, not ours."""
    missing = []
    pattern = r"(?<![\w/.-])((?:open_instruct|scripts|tests|docs|configs|code_server)/[\w./-]*\w)(\*?)"
    for doc in DOCS:
        text = doc.read_text()
        for match in re.finditer(pattern, text):
            path, star = match.groups()
            if "open-instruct's" in text[max(0, match.start() - 20) : match.start()]:
                continue
            found = any(REPO.glob(path + "*")) if star else (REPO / path).exists() or (REPO / "docs" / path).exists()
            if not found:
                missing.append(f"{doc.relative_to(REPO)}: {path}{star}")
    assert not missing, "paths the docs name that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_the_extending_pages_examples_run_as_written(tmp_path):
    """Each ```python block of docs/extending.md is complete: it runs on its own, in a fresh interpreter."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "extending.md").read_text(), re.DOTALL)
    assert len(blocks) == 3
    for number, block in enumerate(blocks):
        result = subprocess.run(
            [sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
        )
        assert result.returncode == 0, f"example {number + 1} of docs/extending.md failed:\n{result.stderr[-3000:]}"
