"""--single_gpu_mode on CPU: the vLLM engine process starts on the engine's cores, the actor's thread leaves them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from open_instruct.generation.engine_setup import engine_process_on


def test_a_process_started_inside_runs_on_the_engine_cores_and_the_starting_thread_moves_off_them():
    node = os.sched_getaffinity(0)
    if len(node) < 2:
        pytest.skip("needs two cores to split")
    engine = (min(node),)
    seen: dict = {}

    def start_engine() -> None:  # on its own thread, as the actor's event loop is
        with engine_process_on(engine):
            child = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
            seen["child"] = subprocess.run(child, capture_output=True, text=True, check=True).stdout.strip()
        seen["after"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=start_engine)
    thread.start()
    thread.join()
    assert seen["child"] == str(list(engine))
    assert seen["after"] == node - set(engine)
    assert os.sched_getaffinity(0) == node  # only the starting thread moved


def test_without_engine_cores_nothing_moves():
    node = os.sched_getaffinity(0)
    with engine_process_on(()):
        assert os.sched_getaffinity(0) == node
    assert os.sched_getaffinity(0) == node
