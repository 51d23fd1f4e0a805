"""The three tiers (every test under tests/integration is `slow`; under tests/nightly, `slow` and `nightly`),
shared fixtures (the embedded tiny model, built once per machine, cached) and the order test files start in.

tests/unit holds pure code and the training loop on in-process fakes; tests/integration the tests that start
the real stack (vLLM engines, Ray, DeepSpeed), each of the design's contracts once; tests/nightly the
real-stack runs CI leaves out to stay within 25 minutes (every benchmark in smoke mode, the launch scripts
end to end, the rarer faults, variants of what CI checks on another path), which scripts/nightly.sh runs by
name. A test's folder is its tier: `-m slow` selects tests/integration and `-m "not slow"` tests/unit, and no
test file marks itself (tests/unit/test_structure.py checks both). This file stays at tests/ so that pytest
puts tests/ on sys.path: `from helpers.x import ...` works from any folder.
"""

import os
from pathlib import Path

import pytest

# The suite runs the CPU stack by design; on a developer machine that also has GPUs the trainer's start-up check
# (open_instruct/stack_check.py) would stop every run it starts. tests/unit/test_stack_check.py clears it.
os.environ.setdefault("OPEN_INSTRUCT_SKIP_STACK_CHECK", "1")

INTEGRATION = Path(__file__).resolve().parent / "integration"
NIGHTLY = Path(__file__).resolve().parent / "nightly"

# The longest files (real runs, fault injection), longest first by their totals measured on 2026-12-07 (at
# e1390db, a fresh-clone `.ci/run` on an idle machine; each took 20 s or more): scripts/test.sh runs two files at
# a time and hands them out in collection order, so starting these first keeps both workers busy to the end
# instead of leaving one long file alone at the tail. Only the order depends on this list;
# tests/unit/test_structure.py checks that every name is a file of tests/integration.
LONGEST_FIRST = (
    "test_weight_sync.py",
    "test_training_loop.py",
    "test_learner.py",
    "test_staleness_bound.py",
    "test_streaming_generation.py",
    "test_lora_learner.py",
    "test_bad_input.py",
    "test_lora.py",
    "test_engine_faults.py",
    "test_sequence_parallel_training.py",
    "test_cpu_scripts.py",
    "test_benchmarks.py",
    "test_extension_training.py",
    "test_learner_saves.py",
    "test_agent_engine.py",
    "test_stack_integration.py",
    "test_node_launch.py",
    "test_driver_sigkill.py",
    "test_mason_dataset_cache.py",
)


def is_integration(path: Path) -> bool:
    """Whether the test file at `path` is in the integration tier (under tests/integration)."""
    return Path(path).resolve().is_relative_to(INTEGRATION)


def is_nightly(path: Path) -> bool:
    """Whether the test file at `path` is in the nightly tier (under tests/nightly)."""
    return Path(path).resolve().is_relative_to(NIGHTLY)


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_integration(item.path) or is_nightly(item.path):
            item.add_marker(pytest.mark.slow)
        if is_nightly(item.path):
            item.add_marker(pytest.mark.nightly)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept


@pytest.fixture(scope="session")
def model_path() -> str:
    from open_instruct.data.embedded_default import ensure_embedded_model

    return str(ensure_embedded_model())


@pytest.fixture(scope="session")
def tokenizer(model_path):
    """The embedded model's tokenizer (a unit test module may define its own `tokenizer`)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


@pytest.fixture(scope="session")
def groups(tokenizer):
    """(groups, tokenizer) for the learner tests: four prompts x four samples, right answers rewarded and wrong
    ones not (so advantages are non-zero). Nothing may change them: tests compare runs trained on them."""
    from helpers.batches import rewarded_groups

    return rewarded_groups(tokenizer, 4), tokenizer
