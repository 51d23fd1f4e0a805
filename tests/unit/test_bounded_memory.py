"""Memory stays bounded over a long run: nothing the driver or an engine keeps grows with the step count.

The real `TrainingLoop` runs a few thousand steps on the in-process fakes (tests/helpers/fakes.py) with the
production run log (`RunLog`), through stale drops, requeues, zero-spread filtering, solved prompts and
evaluation rounds. Every container is measured over an early window of steps and over the last steps,
and may differ by at most what can be in flight at once (the replay buffer's cap); the pickled driver
state (what a checkpoint saves) and the run log's in-memory state likewise. The pieces the loop's fakes
do not exercise are driven directly: the delivery ledger, the engine pool, a generation actor on a fake
vLLM, the reward pool's worker processes and the queue capacities.

The fakes keep their own instrumentation (every request submitted, every sync); that is test
bookkeeping, not the system under test, so `_trim_fakes` clears it as the run goes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pickle
import random
from pathlib import Path

import pytest
from helpers import fakes
from helpers.fake_vllm import fake_generation_actor

from open_instruct import tracking
from open_instruct.generation.channels import ChannelTimeout, LocalChannel
from open_instruct.generation.ledger import DeliveryLedger
from open_instruct.messages import Completion, PromptStarted, SamplingSettings
from open_instruct.orchestrator import buffer_config
from open_instruct.prompt_feeder import PromptFeeder
from open_instruct.replay_buffer import ReplayBuffer
from open_instruct.tracking import RunLog

EARLY = range(200, 300)  # steps measured once the pipeline and the length windows have filled
STEPS = 2000


def _script(request, j: int) -> fakes.Script:
    """Heavy-tailed latencies (stale groups), some rows always right (zero spread, then solved), evals."""
    if request.is_eval:
        return fakes.Script(length=3, latency_s=0.5, reward=1.0)
    rng = random.Random(f"{request.prompt_id}/{j}")
    always_right = request.prompt_id.split("@")[0].endswith("0")
    reward = 10.0 if always_right else float(j % 2)  # 10: the largest reward, so a pass rate of 1
    return fakes.Script(length=rng.randint(1, 40), latency_s=rng.lognormvariate(0, 1.2), reward=reward)


def _trim_fakes(run: fakes.Run) -> None:
    e = run.engines
    e.submitted.clear()
    e.aborts.clear()
    run.learners.trained.clear()
    run.sync.synced.clear()
    # Spans of running samples only read the version they started under and the syncs after it.
    oldest = min((item[4] for item in e._running), default=e.clock.now)
    e.versions = [v for v in e.versions if v[0] <= oldest][-1:] + [v for v in e.versions if v[0] > oldest]


def _tracked(ledger: DeliveryLedger) -> int:
    return len(ledger.expected) + len(ledger.delivered) + len(ledger.engine_of) + len(getattr(ledger, "reassigned", ()))


def driver_sizes(loop, log) -> dict[str, int]:
    buf, feeder = loop.buffer, loop.feeder
    log_state = {k: v for k, v in vars(log).items() if k not in ("bar", "wandb", "cfg")}
    return {
        "loop.untrained": len(loop.untrained),
        "loop.held_back": len(loop.held_back),
        "outcomes.step_ids": sum(map(len, loop.outcomes.step_ids.values())),
        "buffer.groups": len(buf._by_prompt) + len(buf._open) + len(buf._complete),
        "buffer.dropped": len(buf._dropped),
        "feeder.requeued": len(feeder.state.requeued),
        "feeder.solved_and_excluded": len(feeder.state.solved) + len(feeder.state.excluded),
        "feeder.overrides": len(feeder.ground_truth_overrides),
        "ledger.prompts": _tracked(loop.engines.ledger),
        "eval_round.samples": len(loop.eval_round.completions) if loop.eval_round is not None else 0,
        "log.window": len(log.window.records),
        "log.bytes": len(pickle.dumps(log_state)),
        "driver_state.bytes": len(pickle.dumps(loop.driver_state())),
    }


@pytest.mark.parametrize("action", ["requeue", "drop"])
def test_a_long_run_keeps_every_driver_container_bounded(tmp_path, monkeypatch, action):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    plotted = []  # the plot reads the whole history back from metrics.jsonl (drawing it is not the point here)
    monkeypatch.setattr(tracking, "plot_run", lambda history, path: plotted.append(sum(1 for _ in history)))
    cfg = fakes.config(
        "--async_steps",
        "2",
        "--max_off_policy_steps",
        "2",
        "--off_policy_action",
        action,
        "--active_sampling",
        "--no_resampling_pass_rate",
        "0.99",
        "--local_eval_every",
        "100",
        "--output_dir",
        str(tmp_path),
        steps=STEPS,
        prompts=4,
        samples=4,
    )
    early: dict[str, int] = {}
    late: dict[str, int] = {}
    windows: list[int] = []

    def measure(step: int) -> None:
        _trim_fakes(run)
        window = early if step in EARLY else late if step >= STEPS - len(EARLY) else None
        if window is not None:
            for key, size in driver_sizes(run.loop, run.log).items():
                window[key] = max(window.get(key, 0), size)
            buf = run.loop.buffer
            windows.append(max(map(len, (buf._generated_lengths, buf._trained_lengths, buf._dropped_lengths))))

    run = fakes.build(cfg, eval_rows=fakes.rows(4, "test"), script=_script, step_s=1.0, on_step=measure)
    run.log = run.loop.log = RunLog(cfg)
    # Windows of a few hundred samples instead of 10k: full early, and not sorted at 10k every step.
    run.loop.buffer = ReplayBuffer(**buffer_config(run.loop.cfg, run.loop.pacing), length_window=256)
    summary = run.loop.run()

    assert summary["steps_trained"] == STEPS and len(run.log.evals) == STEPS // 100
    assert summary["prompts_requeued" if action == "requeue" else "prompts_dropped"] > 0  # the bound did bite
    assert summary["prompts_filtered"] > 0 and run.loop.feeder.state.solved  # zero spread, solved rows
    in_flight = cfg.replay_buffer_max_samples  # samples admitted and untrained at once, at most
    grown = {
        key: (early[key], late[key])
        for key in early
        if late[key] > (early[key] * 1.1 + 4096 if key.endswith(".bytes") else early[key] + in_flight)
    }
    assert not grown, f"grew from the early steps to the last ones (early, late): {grown}"
    assert late["ledger.prompts"] <= 4 * in_flight  # only prompts still owed samples
    assert max(windows) == 256
    assert len(run.log.history) == STEPS and run.log.history[-1]["training_step"] == STEPS - 1
    assert plotted == [STEPS]


def test_run_log_records_live_in_their_files_and_read_back_as_a_list(tmp_path):
    cfg = fakes.config("--output_dir", str(tmp_path))
    log = RunLog(cfg)
    log.start(num_steps=6)
    for step in range(4):
        log.step(step, {"objective/verifiable_reward": float(step), "bad": float("nan")}, [f"p{step}"])
    log.eval_round(3, {"eval/verifiable_reward": 0.5}, [])
    assert len(log.history) == 4 and [h["training_step"] for h in log.history] == [0, 1, 2, 3]
    assert log.history[0]["objective/verifiable_reward"] == 0.0 and log.history[-1]["bad"] == "nan"
    assert [h["training_step"] for h in log.history[1:3]] == [1, 2] and log.evals[-1]["eval/verifiable_reward"] == 0.5
    with pytest.raises(IndexError):
        log.history[4]
    # A resumed run sees its own steps only, as before; the file keeps the earlier ones.
    resumed = RunLog(cfg)
    resumed.start(num_steps=6, start_step=2)
    resumed.step(2, {"objective/verifiable_reward": 9.0}, [])
    assert [h["training_step"] for h in resumed.history] == [2] and len(resumed.evals) == 0
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3


def test_the_ledger_forgets_complete_prompts_but_still_recognises_resubmitted_duplicates():
    ledger = DeliveryLedger()
    feeder = _feeder()
    sizes = []
    for version in range(2000):
        for request in feeder.admit(version):
            ledger.admit(request)
            ledger.started(request.prompt_id, engine_id=version % 2)
            for j in range(2):
                ledger.deliver(_completion(request.prompt_id, j))
        sizes.append(len(ledger.expected) + len(ledger.delivered) + len(ledger.engine_of))
    assert max(sizes) == 0
    assert ledger.counts() == {
        "admitted_prompts": 16000,
        "expected_samples": 32000,
        "delivered_samples": 32000,
        "error_samples": 0,
    }
    ledger.check_complete()
    # As Resubmission.resubmit does after a failure: the prompt leaves its engine, its missing sample is
    # generated again elsewhere, and the dead engine's copy may still arrive.
    [request] = feeder.admit(2000, max_count=1)
    ledger.admit(request)
    ledger.started(request.prompt_id, engine_id=0)
    ledger.deliver(_completion(request.prompt_id, 0))
    ledger.reassign(request.prompt_id)
    assert ledger.in_flight() == [request.prompt_id] and ledger.deliver(_completion(request.prompt_id, 1))
    assert ledger.has(request.prompt_id, 1) and ledger.in_flight() == []  # kept: a late copy is recognised
    assert ledger.reassigned == {request.prompt_id}


def _feeder() -> PromptFeeder:
    """Eight prompts of two samples per learner version."""
    sampling = SamplingSettings.from_config(fakes.config())
    return PromptFeeder(
        fakes.rows(64), prompts_per_step=8, samples_per_prompt=2, async_steps=0, sampling=sampling, seed=1
    )


def _completion(prompt_id: str, j: int) -> Completion:
    return Completion(
        prompt_id=prompt_id,
        sample_index=j,
        prompt_token_ids=(1, 2),
        response_token_ids=(3,),
        behaviour_logprobs=(-1.0,),
        finish_reason="stop",
        version_spans=(),
        admitted_version=0,
        engine_id=0,
    )


def test_the_engine_pool_keeps_only_prompts_in_flight(monkeypatch):
    from open_instruct.generation import pool as engine_pool

    monkeypatch.setattr(engine_pool, "RayChannel", LocalChannel)  # the channels in-process; no actors
    pool = engine_pool.EnginePool([], prompt_capacity=64)
    feeder = _feeder()

    def sizes() -> dict[str, int]:
        return {
            "requests": len(pool.resubmission),
            "partials": len(pool.partials),
            "carried": len(pool._carried),
            "ledger": _tracked(pool.ledger),
            "prompt queue": pool.prompts.depth(),
            "result queue": pool.results.depth(),
        }

    measured = []
    for version in range(1500):
        pool.submit(feeder.admit(version))
        for request in pool.prompts.get_all():  # a fake engine: announce, then both samples
            pool.results.put(PromptStarted(request.prompt_id, engine_id=0))
            for j in request.samples_to_generate():
                pool.results.put(_completion(request.prompt_id, j))
        assert len(pool.poll()) == 16
        if version in (100, 1499):
            measured.append(sizes())
    assert measured[0] == measured[1] == dict.fromkeys(measured[0], 0)
    assert pool.ledger.counts()["admitted_prompts"] == 12000


# ----------------------------------------------------------------------------- an engine on a fake vLLM


def _engine_sizes(actor) -> dict[str, int]:
    state = actor.state
    sizes = {"generating": state.generating, "first_version": state.first_version, "progress": state.progress}
    return {name: len(held) for name, held in sizes.items()}


def _requests(batch: int):
    """Eight prompts of two samples, with ids no other batch has."""
    return [dataclasses.replace(r, prompt_id=f"{r.prompt_id}#{batch}") for r in _feeder().admit(0)]


def test_a_streaming_engine_keeps_only_running_samples(monkeypatch):
    actor = fake_generation_actor(monkeypatch)

    async def drive() -> list[dict[str, int]]:
        prompts, results = LocalChannel(name="prompts"), LocalChannel(name="results")
        loop = asyncio.create_task(actor.run(prompts, results))
        measured = []
        for batch in range(60):
            for request in _requests(batch):
                await prompts.put_async(request)
            done = 0
            while done < 16:
                message = await results.get_async(timeout=10)
                done += isinstance(message, Completion)
            while actor.state.running:  # the last sample's task ends just after its delivery
                await asyncio.sleep(0.001)
            measured.append(_engine_sizes(actor))
        await actor.stop("finish")
        await loop
        return measured

    measured = asyncio.run(drive())
    assert measured[0] == measured[-1] == dict.fromkeys(measured[0], 0)


def test_a_batch_mode_engine_keeps_nothing_per_sample(monkeypatch):
    actor = fake_generation_actor(monkeypatch)
    measured = []
    for batch in range(30):
        completions = asyncio.run(actor.generate(_requests(batch)))
        assert len(completions) == 16
        measured.append(_engine_sizes(actor))
    assert measured[-1] == measured[0]


# ----------------------------------------------------------------------------- reward pool and queues


def _children() -> int:
    """This process's child processes, zombies included (an unreaped one is a leak too)."""
    me, count = str(os.getpid()), 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        count += fields[1] == me
    return count


def test_the_reward_pool_keeps_its_workers_threads_and_queue_fixed():
    from helpers import reward_fixtures

    from open_instruct.rewards import RewardSettings
    from open_instruct.rewards.scoring import RewardScorer

    assert reward_fixtures.fixed_score  # registers the test verifiers in this process and its workers

    def sizes(scorer) -> dict[str, int]:
        pool = scorer._dispatch
        return {
            "children": _children(),
            "threads": len(pool._threads),
            "queued": pool._work_queue.qsize(),
            "idle workers": scorer._idle.qsize(),
            "error names": len(scorer.error_counts),
        }

    async def batch(scorer, names: list[str]) -> None:
        await asyncio.gather(*(scorer.score(f"s{i}", "p", ["1"], [name], "stop", 1) for i, name in enumerate(names)))

    with RewardScorer(RewardSettings(verifier_timeout_s=20.0), max_workers=2) as scorer:
        asyncio.run(batch(scorer, ["test_fixed"] * 20))
        early = sizes(scorer)
        for _ in range(15):
            asyncio.run(batch(scorer, ["test_fixed"] * 20 + ["test_raise", "nope"]))
        asyncio.run(batch(scorer, ["test_crash", "test_fixed"]))  # the crashed worker is replaced, once
        late = sizes(scorer)
    assert early["queued"] == late["queued"] == 0 and late["idle workers"] == 2 and late["threads"] <= 2
    assert late["children"] == early["children"] and late["error names"] == 3  # test_raise, nope, test_crash


def test_the_rubric_book_keeps_a_bounded_number_of_retired_rubrics():
    from open_instruct.rewards.evolving_rubrics import RETIRED_KEPT, RubricBook
    from open_instruct.rewards.rubric import parse_rubric_truth

    truth = parse_rubric_truth(json.dumps({"query": "q", "rubrics": [{"description": "Own.", "weight": 1.0}]}))
    book = RubricBook(max_active=3)
    for step in range(1000):  # two new rubrics per step, as a busy query gets
        book.add(truth, [{"description": f"new {step}.{k}", "weight": 1.0, "title": ""} for k in range(2)])
    entry = book.entry(truth)
    assert len(entry.active) == 3 and len(entry.retired) == RETIRED_KEPT
    assert entry.retired[-1]["description"] == "new 998.0"  # the newest retired are the ones kept
    assert book.totals()["evolving_rubrics/total_retired"] == 2000 - 3


def test_queue_capacities_follow_the_lookahead_not_the_run_length():
    short, long = fakes.config(steps=10, prompts=4, samples=4), fakes.config(steps=100_000, prompts=4, samples=4)
    assert short.prompt_queue_capacity == long.prompt_queue_capacity
    assert short.replay_buffer_max_samples == long.replay_buffer_max_samples
    channel = LocalChannel(maxsize=3)
    for i in range(3):
        channel.put(i)
    with pytest.raises(ChannelTimeout):
        channel.put(3)  # a full channel refuses: the producer waits, memory does not grow
    assert channel.depth() == 3
