"""The docs stay true: the configuration page is the code's, the site builds strictly (broken links and
pages missing from the nav fail it), and the README stays a short front page whose links resolve."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import mason
from scripts import config_docs

REPO = Path(__file__).resolve().parents[2]


def test_the_configuration_page_is_generated_from_the_flags():
    page = (REPO / "docs" / "configuration.md").read_text()
    assert page == config_docs.render(), "docs/configuration.md is stale: run python scripts/config_docs.py"


def _page_kinds() -> list[tuple[str, str]]:
    """(flag, kind) of every row of the configuration page's flag tables."""
    page = (REPO / "docs" / "configuration.md").read_text()
    kind = r"works|Beaker only|no effect \(as in open-instruct\)|not supported yet"
    return re.findall(rf"^\| `--(\w+)` \| .*? \| ({kind}) \|", page, re.M)


def test_the_configuration_page_lists_every_flag_with_its_kind():
    from open_instruct.config.core import flag_names

    rows = _page_kinds()
    assert sorted(name for name, _ in rows) == sorted(flag_names())
    kinds = dict(rows)
    assert kinds["learning_rate"] == "works" and kinds["oe_eval_tasks"] == "Beaker only"


def _another_value(group, flag) -> list[str]:
    """A command line giving `flag` a value other than its default, of its type."""
    import typing

    default = flag.default_factory() if callable(flag.default_factory) else flag.default
    hint = typing.get_type_hints(group)[flag.name]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    if typing.get_origin(hint) is typing.Literal:
        return [f"--{flag.name}", next(str(choice) for choice in typing.get_args(hint) if choice != default)]
    if hint is bool:
        return [f"--{flag.name}", str(not default)]
    if typing.get_origin(hint) is list:
        return [f"--{flag.name}", "lm_head"]
    if hint in (int, float):
        return [f"--{flag.name}", str((default or 0) + 1)]
    return [f"--{flag.name}", "other"]


def test_the_pages_kinds_are_what_the_checks_do():
    """A flag the page marks `not supported yet` is refused with a value other than its default, whatever group
    holds it, and one marked `no effect` is accepted and named in the start-up warnings. A refusal at parse time
    comes from the same mark (the page once said `works` for --lora_modules_to_save, which a check of its own
    refused, and for the bitsandbytes companions of the refused --load_in_4bit, which do nothing)."""
    from dataclasses import fields

    from open_instruct.config.core import GROUPS, ConfigError, parse_config, unsupported_features

    kinds = dict(_page_kinds())
    for group in GROUPS:
        for flag in fields(group):
            kind = kinds[flag.name]
            if kind not in ("not supported yet", "no effect (as in open-instruct)"):
                continue
            argv = _another_value(group, flag)
            try:
                cfg = parse_config(argv)
            except ConfigError as error:
                refused, warned = [str(error)], []
            else:
                refused, warned = unsupported_features(cfg), cfg.compat.ignored()
            if kind == "not supported yet":
                named = [line for line in refused if f"--{flag.name} " in line and "not supported yet" in line]
                assert named, (argv, refused)
            else:
                assert not refused and any(line.startswith(f"--{flag.name} ") for line in warned), (argv, refused)
    with pytest.raises(ConfigError) as error:  # with its feature on, refused as the flags are parsed
        parse_config(["--use_peft", "--lora_r", "8", "--lora_alpha", "16", "--lora_modules_to_save", "lm_head"])
    named = re.findall(r"--(\w+) [^:]*: not supported yet", str(error.value))
    assert named == ["lora_modules_to_save"] and kinds["lora_modules_to_save"] == "not supported yet", error.value


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

    flags = {option for action in build_parser()._actions for option in action.option_strings}
    flags |= {option for action in mason._build_parser()._actions for option in action.option_strings}
    sources = [*REPO.glob("*.py"), *(REPO / "open_instruct").rglob("*.py"), *(REPO / "scripts").rglob("*.py")]
    sources += [*(REPO / "benchmarks").glob("*.py")]
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
    pattern = r"(?<![\w/.-])((?:benchmarks|open_instruct|scripts|tests|docs|configs|code_server)/[\w./-]*\w)(\*?)"
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


def test_every_module_a_command_runs_exists():
    """`python -m <module>` in the docs, the scripts and the Dockerfile names a module of this checkout, so a
    moved module leaves no stale command behind (other programs' modules, pip or pytest, are not ours)."""
    texts = [*DOCS, *sorted((REPO / "scripts").rglob("*.sh")), REPO / "Dockerfile"]
    missing = []
    for path in texts:
        for module in re.findall(r"\s-m\s+([A-Za-z_][\w.]*)", path.read_text()):
            parts = module.rstrip(".").split(".")  # `benchmarks.<name>` names the package
            if parts[0] not in ("open_instruct", "benchmarks", "code_server", "scripts"):
                continue
            where = REPO.joinpath(*parts)
            if not (where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()):
                missing.append(f"{path.relative_to(REPO)}: -m {module}")
    assert not missing, "modules the commands run that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_the_extending_pages_examples_run_as_written(tmp_path):
    """Each ```python block of docs/extending.md is complete: it runs on its own, in a fresh interpreter."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "extending.md").read_text(), re.DOTALL)
    assert len(blocks) == 3
    for number, block in enumerate(blocks):
        result = subprocess.run(
            [sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
        )
        assert result.returncode == 0, f"example {number + 1} of docs/extending.md failed:\n{result.stderr[-3000:]}"
