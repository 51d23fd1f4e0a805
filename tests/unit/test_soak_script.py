"""scripts/soak.py: its pure parts (RSS parsing, roles, the slope fit, the growth check) in-process. One
short soak end to end against the real stack is in tests/nightly/test_soak_run.py (the nightly tier).

Run: `.venv/bin/pytest tests/unit/test_soak_script.py` (under 2 s).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scripts import soak

REPO = Path(__file__).resolve().parents[2]

STATUS = """Name:\tpython
State:\tS (sleeping)
VmPeak:\t 2097152 kB
VmSize:\t 2000000 kB
VmHWM:\t  600000 kB
VmRSS:\t  524288 kB
RssAnon:\t  400000 kB
Threads:\t12
"""


def test_rss_is_read_from_the_vmrss_line_and_absent_for_kernel_threads():
    assert soak.parse_rss_mib(STATUS) == 512.0
    assert soak.parse_rss_mib("Name:\tkthreadd\nState:\tS (sleeping)\nThreads:\t1\n") is None


@pytest.mark.parametrize(
    ("cmdline", "role"),
    [
        ("ray::LearnerActor.train_step\0\0\0", "ray::LearnerActor"),  # the method Ray shows while it runs
        ("ray::LearnerActor\0", "ray::LearnerActor"),
        ("VLLM::EngineCore\0", "VLLM::EngineCore"),
        ("/home/user/.venv/bin/python\0/home/user/open_instruct/grpo_fast.py\0--output_dir\0/tmp/x\0", "grpo_fast.py"),
        ("/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server\0--port=0\0", "gcs_server"),
        ("", "?"),
    ],
)
def test_role_names_are_short_and_stable_across_samples(cmdline, role):
    assert soak.role_of(cmdline) == role


def test_session_pids_finds_this_process_in_its_own_session():
    assert os.getpid() in soak.session_pids(os.getsid(0))


def test_slope_fit_is_exact_on_a_line_and_refuses_too_few_points():
    assert soak.fit_slope([1, 2, 3, 4], [10, 12, 14, 16]) == pytest.approx(2.0)
    assert soak.fit_slope([1, 2, 3, 4], [10, 12, 14, 16], scale=1000) == pytest.approx(2000.0)
    assert soak.fit_slope([1, 2, 3], [5, 5, 5]) == 0.0
    assert soak.fit_slope([1, 2], [1, 2]) is None
    assert soak.fit_slope([3, 3, 3], [1, 2, 3]) is None  # no spread in x


def test_rss_slopes_leave_out_start_up_shutdown_and_warm_up():
    start_up = [{"t": t, "step": 0, "total_mib": 100.0 * t, "roles": {"driver": 100.0 * t}} for t in range(5)]
    # Warm-up (the first 20% of the running samples) grows fast; the steady part grows 1 MiB per step.
    running = [
        {"t": 5 + i, "step": 1 + 10 * i, "total_mib": (500.0 if i < 2 else 1000.0) + 10 * i, "roles": {"a": 7.0}}
        for i in range(10)
    ]
    shutdown = [{"t": 20, "step": 100, "total_mib": 1.0, "roles": {}}]
    report = soak.rss_slopes(start_up + running + shutdown, last_step=100, warmup_frac=0.2)
    assert report["samples_used"] == 8
    assert report["total_mib_per_1k_steps"] == pytest.approx(1000.0)
    assert report["total_mib_per_hour"] == pytest.approx(10 * 3600)
    assert report["per_role_mib_per_1k_steps"] == {"a": pytest.approx(0.0)}


def test_bounded_jitter_passes_and_steady_growth_fails():
    jitter = [{"queue/result_depth": [9, 3, 16, 0][i % 4], "buffer/size_samples": 0} for i in range(100)]
    growing = [{"queue/result_depth": i, "buffer/size_samples": 0} for i in range(100)]
    slack = {"queue/result_depth": 16, "buffer/size_samples": 16, "queue/prompt_depth": 4}
    report = soak.gauge_growth(jitter, slack)
    assert set(report) == {"queue/result_depth", "buffer/size_samples"}  # gauges a run never logged are left out
    assert report["queue/result_depth"] == {"second_tenth_max": 16, "last_tenth_max": 16, "grew": False}
    grew = soak.gauge_growth(growing, slack)["queue/result_depth"]
    assert grew == {"second_tenth_max": 19, "last_tenth_max": 99, "grew": True}
    # Queues fill from empty during the first tenth: that is start-up, not growth (a real 20-step run).
    depths = [0, 2, 16, 18, 19, 19, 19, 18, 19, 3, 16, 16, 2, 16, 7, 16, 19, 6, 16, 19]
    assert not soak.gauge_growth([{"queue/result_depth": d} for d in depths], slack)["queue/result_depth"]["grew"]


def test_metrics_tail_reads_only_complete_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = soak.MetricsTail(path)
    assert tail.poll(0.0) == 0  # not written yet
    path.write_text('{"training_step": 0}\n{"training_st')
    assert tail.poll(1.0) == 1
    with open(path, "a") as f:
        f.write('ep": 1}\n')
    assert tail.poll(2.0) == 2
    assert tail.step_seen_at == {0: 1.0, 1: 2.0}
