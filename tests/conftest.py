"""Shared fixtures (the embedded tiny model, built once per machine, cached) and the order test files start in."""

from pathlib import Path

import pytest

# The longest files (real runs, fault injection, benchmarks in smoke mode), longest first: scripts/test.sh
# runs two files at a time and hands them out in collection order, so starting these first keeps both
# workers busy to the end instead of leaving one long file alone at the tail. Only the order depends on
# this list; tests/test_structure.py checks that every name is a test file.
LONGEST_FIRST = (
    "test_training_loop.py",
    "test_engine_faults.py",
    "test_benchmarks.py",
    "test_weight_sync.py",
    "test_learner.py",
    "test_launch_scripts_e2e.py",
    "test_gpu_path.py",
    "test_scripts.py",
    "test_bad_input.py",
    "test_streaming_generation.py",
    "test_staleness_bound.py",
    "test_agent_training.py",
    "test_sequence_parallel.py",
    "test_ray_node_setup.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))  # stable: file order kept


@pytest.fixture(scope="session")
def model_path() -> str:
    from open_instruct.data.embedded_default import ensure_embedded_model

    return str(ensure_embedded_model())
