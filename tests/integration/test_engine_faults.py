"""Engine faults on the real stack. A generation engine killed mid-run (SIGKILL of its process) is replaced
within the --max_engine_restarts budget, its unfinished samples go back to the queue (continuing from the
tokens they had reported), the replacement starts in the background once the old processes are gone, gets the
current weights at the next weight sync and serves, and the run finishes with every admitted prompt accounted
for exactly once. An engine that dies during a
weight sync, and one that stalls without dying (--engine_hang_timeout_s), are replaced too."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
STEPS = 5


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def is_engine_core(process) -> bool:
    try:
        return "EngineCore" in " ".join(process.cmdline()) or process.name().startswith("VLLM::Engine")
    except psutil.NoSuchProcess:
        return False


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_killed_engine_is_replaced_and_the_run_finishes_with_nothing_lost(tmp_path):
    from helpers.processes import session_pids, start_grpo_session
    from helpers.runs import COMMON

    out, admitted = tmp_path / "run", tmp_path / "admitted.jsonl"
    args = list(COMMON)
    args[args.index("--total_episodes") + 1] = str(STEPS * 32)
    args += ["--vllm_num_engines", "2", "--num_learners_per_node", "1", "--save_admitted_prompts", str(admitted)]
    args += ["--partial_report_tokens", "4"]  # the killed engine's running samples continue elsewhere
    log_path, held, release = tmp_path / "run.log", tmp_path / "held", tmp_path / "release"
    held.mkdir()
    # Samples admitted at version 2 stop after a few tokens (reported) until `release` exists: the engine
    # killed is one that holds some, so it always dies with samples running (never a matter of timing).
    hold = {"HOLD_FROM_VERSION": "2", "HOLD_MARK_DIR": str(held), "HOLD_RELEASE_FILE": str(release)}
    script = REPO / "tests" / "helpers" / "grpo_holding.py"
    proc = start_grpo_session(args, out, log_path, script=script, env=hold)
    deadline = time.monotonic() + 600
    while not any(held.iterdir()) and proc.poll() is None:  # a handshake: the engine marks its first hold
        assert time.monotonic() < deadline, log_path.read_text()[-3000:]
        time.sleep(0.1)
    victim = int(next(held.iterdir()).name)
    engines = [p for p in session_pids(proc.pid) if "HoldingEngine" in Path(f"/proc/{p}/cmdline").read_text()]
    assert len(engines) == 2 and victim in engines, (victim, engines)
    # vLLM's EngineCore, by the title vLLM gives it (the actor's other children, reward workers, may come and go)
    engine_core = [c.pid for c in psutil.Process(victim).children(recursive=True) if is_engine_core(c)]
    os.kill(victim, signal.SIGKILL)
    # The survivor holds its samples too, so no step ends before the release: the replacement, built in the
    # background meanwhile, is ready first (a handshake on the log), and joins at the weight sync that follows.
    while "'s replacement is ready" not in log_path.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, log_path.read_text()[-3000:]
        time.sleep(0.1)
    # It started only once the old engine's processes were gone.
    assert engine_core and not any(running(p) for p in [victim, *engine_core])
    release.touch()
    assert proc.wait(timeout=900) == 0, log_path.read_text()[-4000:]
    log = log_path.read_text()
    reaped = re.search(r"old processes gone: exited \[([\d, ]*)\], killed \[([\d, ]*)\]", log)
    assert reaped, log[-4000:]
    gone = {int(p) for p in re.findall(r"\d+", reaped.group(1) + " " + reaped.group(2))}
    assert {victim, *engine_core} <= gone

    replaced = re.search(r"engine (\d) replaced \(.*\); it joined at weight version (\d+)", log)
    assert replaced, log[-4000:]
    engine, joined_at = int(replaced.group(1)), int(replaced.group(2))
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["training_step"] for m in metrics] == list(range(STEPS))
    assert metrics[-1]["engines/restarts_total"] == 1
    # Samples it had running continued from their reported tokens instead of starting over.
    assert 1 <= metrics[-1]["engines/continued_samples_total"] <= metrics[-1]["engines/resubmitted_samples_total"]
    assert metrics[-1]["engines/continued_tokens_saved_total"] >= 4 * metrics[-1]["engines/continued_samples_total"]
    assert joined_at >= 1  # killed after a step: it got the trained weights, not the initial ones
    # The replacement served until the end: it took every weight sync after it joined. Whether it also took
    # prompts is a race with the survivor, which may have drained the queue by then (seen in CI: it joined at
    # version 5 and the last prompts were already running elsewhere), so it is not asserted.
    pattern = rf"engine {engine} stopped \(\w+\): (\d+) samples were in flight; it completed (\d+) samples, at weight"
    stopped = re.search(pattern + r" version (\d+)", log)
    assert stopped, log[-3000:]
    assert int(stopped.group(3)) == metrics[-1]["policy/version"] >= joined_at

    # Nothing lost, nothing twice: every admitted prompt id has exactly one fate.
    ids = [json.loads(line)["prompt_id"] for line in admitted.read_text().splitlines()]
    assert len(ids) == len(set(ids))
    fates = []
    for step in read_jsonl(out / "trained_prompts.jsonl"):
        for fate in ("prompt_ids", "requeued", "dropped", "filtered"):
            fates.extend(step.get(fate, []))
    fates += json.loads((out / "untrained_prompts.json").read_text())
    assert sorted(fates) == sorted(ids)


def test_an_engine_that_dies_during_a_weight_sync_is_replaced_and_the_sync_completes(tmp_path):
    """Engine 1 exits as version 2 starts to arrive, and engine 0 asks for it only after the learner's
    broadcast failed: engine 0's receive fails at once (the learner closed its end) instead of waiting for the
    group timeout (600 s, which is what CI once saw), the engine is replaced, the sync runs again, and the
    run trains to the end."""
    from helpers.fault_actors import DiesInWeightSyncActor
    from helpers.runs import COMMON

    from open_instruct.config.core import parse_config
    from open_instruct.grpo_fast import run

    args = list(COMMON)
    args[args.index("--total_episodes") + 1] = str(4 * 32)
    cfg = parse_config([*args, "--vllm_num_engines", "2", "--output_dir", str(tmp_path / "out")])
    marker = tmp_path / "engine_1_died"
    started = time.monotonic()
    summary = run(cfg, engine_class=DiesInWeightSyncActor, engine_args=((1, 2, str(marker)),))
    assert marker.exists() and summary["status"] == "completed"
    metrics = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [m["training_step"] for m in metrics] == list(range(4))
    assert metrics[-1]["engines/restarts_total"] == 1
    assert time.monotonic() - started < 600  # no party waited for the transfer group's 600 s timeout


def test_an_engine_that_stalls_is_found_by_the_hang_timeout_and_replaced(tmp_path):
    """Engine 1 keeps answering calls but its samples stop producing tokens: within --engine_hang_timeout_s it
    is killed and replaced like a dead one, its samples go back to the queue, and the run trains to the end."""
    from helpers.fault_actors import StallsActor
    from helpers.runs import COMMON

    from open_instruct.config.core import parse_config
    from open_instruct.grpo_fast import run

    args = list(COMMON)
    args[args.index("--total_episodes") + 1] = str(8 * 32)  # long enough that the stalled groups starve it
    out = tmp_path / "out"
    # 60 s: three times what a healthy engine under this suite's load was seen to need (with 20 s, a run that
    # shared the 2 cores with three other heavy jobs took a starved healthy engine for hung too).
    cfg = parse_config([*args, "--vllm_num_engines", "2", "--engine_hang_timeout_s", "60", "--output_dir", str(out)])
    marker = tmp_path / "engine_1_stalled"
    summary = run(cfg, engine_class=StallsActor, engine_args=((1, 16, str(marker)),))
    assert marker.exists() and summary["status"] == "completed"
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["training_step"] for m in metrics] == list(range(8))
    assert metrics[-1]["engines/hung_total"] == 1 and metrics[-1]["engines/restarts_total"] == 1
    assert metrics[-1]["engines/resubmitted_samples_total"] >= 1  # the stalled samples were generated elsewhere
