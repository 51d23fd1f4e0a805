"""The real TrainingLoop, driven in-process through fakes (tests/fakes.py) on a virtual clock.

Each scenario runs a whole loop in well under a second: admission under the staleness bound,
eval routing, the weight-sync cadence, held-back completions and evictions, resume with
re-queued prompts, and the "nothing lost, nothing trained twice" ledger.
"""

from __future__ import annotations

import random

import fakes
import pytest

from open_instruct.orchestrator import StopRequest
from open_instruct.replay_buffer import MaxAge, ReplayBuffer


@pytest.mark.parametrize("async_steps", [0, 1, 3])
def test_admission_never_runs_more_than_async_steps_ahead(async_steps):
    cfg = fakes.config("--async_steps", str(async_steps), steps=6, prompts=2)
    run = fakes.build(cfg)
    versions_at_submit = []
    submit = run.engines.submit

    def watched_submit(requests):
        submit(requests)
        admitted = len(run.engines.admitted_ids)
        versions_at_submit.append((admitted, run.learners.version))

    run.engines.submit = watched_submit
    summary = run.loop.run()
    assert summary["status"] == "completed" and summary["steps_trained"] == 6
    for admitted, version in versions_at_submit:
        assert admitted <= (version + async_steps + 1) * 2
    # The bound is reached, not just respected: the last step saw (5 + async_steps + 1) batches admitted.
    assert summary["prompts_admitted"] == min(6 + async_steps, 5 + async_steps + 1) * 2
    # Every request carries the learner version it was admitted under (it salts the prefix cache).
    for _, request in run.engines.submitted:
        assert request.admitted_version <= run.learners.version


def test_each_step_trains_a_fixed_size_batch_of_complete_groups_in_sample_order():
    run = fakes.build(fakes.config("--async_steps", "2", steps=5, prompts=3, samples=4))
    run.loop.run()
    assert len(run.learners.trained) == 5
    for groups in run.learners.trained:
        assert len(groups) == 3
        for group in groups:
            assert [c.sample_index for c in group.completions] == [0, 1, 2, 3]
            assert {c.prompt_id for c in group.completions} == {group.prompt_id}
    assert [h["policy/version"] for h in run.log.history] == [1, 2, 3, 4, 5]
    assert [h["episode"] for h in run.log.history] == [12, 24, 36, 48, 60]


def test_eval_completions_go_to_the_eval_round_and_the_final_policy_is_evaluated():
    def script(request, j):
        return fakes.Script(reward=10.0 if request.is_eval else float(j % 2), latency_s=3.0 if request.is_eval else 1.0)

    cfg = fakes.config("--num_evals", "2", "--eval_on_step_0", steps=6)
    run = fakes.build(cfg, eval_rows=fakes.rows(3, "test"), script=script)
    run.loop.run()
    trained = set(run.learners.trained_ids)
    assert not any(pid.startswith("eval") for pid in trained)
    assert len(run.log.evals) == 3  # step 0, then every 3 steps (the last one waits for its round)
    assert [e["eval/started_at_step"] for e in run.log.evals] == [0.0, 2.0, 5.0]
    assert all(e["eval/verifiable_reward"] == 10.0 and e["eval/samples"] == 3.0 for e in run.log.evals)
    assert "eval/verifiable_reward" in run.log.history[-1]
    eval_requests = [r for _, r in run.engines.submitted if r.is_eval]
    assert len(eval_requests) == 9 and all(r.num_samples == 1 and r.sampling.temperature == 0.0 for r in eval_requests)
    # Training rewards never include eval samples (eval reward is 10, training 0 or 1).
    assert all(h["objective/verifiable_reward"] <= 1.0 for h in run.log.history)


@pytest.mark.parametrize(("every", "steps", "expected"), [(1, 4, [1, 2, 3, 4]), (3, 7, [3, 6, 7]), (5, 3, [3])])
def test_weights_are_pushed_every_n_steps_and_after_the_last(every, steps, expected):
    run = fakes.build(fakes.config("--weight_sync_every_steps", str(every), steps=steps))
    run.loop.run()
    assert run.sync.pushed == expected
    synced = [h["training_step"] for h in run.log.history if "weight_sync/version" in h]
    assert synced == [v - 1 for v in expected]


def test_in_flight_pushes_show_up_as_samples_spanning_versions_and_staleness():
    # Samples take longer than a step: once the pipeline is full, each one sees a push mid-generation.
    run = fakes.build(
        fakes.config("--async_steps", "2", steps=8),
        script=lambda r, j: fakes.Script(length=40, latency_s=5.0, reward=float(j % 2)),
        step_s=1.0,
    )
    run.loop.run()
    history = run.log.history
    assert all(h["staleness/multi_version_frac"] == 0 for h in history[:3])  # finished before the first push
    late = history[3:]
    assert all(h["staleness/multi_version_frac"] == 1.0 for h in late)
    # Per token, a sample updated in flight is fresher than its oldest token says.
    assert all(0 < h["staleness/token_lag_avg"] < h["staleness/version_lag_max"] <= 3 for h in late)


def test_a_full_buffer_holds_completions_back_and_offers_them_again():
    run = fakes.build(fakes.config("--async_steps", "2", steps=6, prompts=2, samples=2))
    # Room for exactly one batch: groups beyond it are held back by the loop until a take frees room.
    run.loop.buffer = ReplayBuffer(samples_per_prompt=2, max_samples=4, seed=1)
    run.loop.run()
    history = run.log.history
    assert history[-1]["buffer/rejected_full_total"] > 0
    trained = run.learners.trained_ids
    assert len(trained) == len(set(trained)) == 12
    assert set(trained) | set(run.log.untrained) == set(run.engines.admitted_ids)


def test_stale_groups_are_evicted_counted_and_never_trained():
    # Every 4th prompt is a straggler: it completes long after its admission, older than max_age 0.
    def script(request, j):
        straggler = request.prompt_id.split(":")[1].split("@")[0] in {"0", "4", "8"}
        return fakes.Script(latency_s=30.0 if straggler else 0.5, reward=float(j % 2))

    run = fakes.build(fakes.config("--async_steps", "3", steps=5, prompts=1), train_rows=fakes.rows(12), script=script)
    run.loop.buffer = ReplayBuffer(samples_per_prompt=2, max_samples=10, age_policy=MaxAge(0, "drop"), seed=1)
    run.loop.run()
    assert run.log.history[-1]["buffer/evicted_total"] >= 1
    assert all(h["staleness/version_lag_max"] == 0 for h in run.log.history)
    trained = set(run.learners.trained_ids)
    assert not trained & {"fake:train:0@0"}
    assert trained | set(run.log.untrained) == set(run.engines.admitted_ids)


def test_resume_requeues_untrained_prompts_and_trains_none_twice(tmp_path):
    flags = ("--async_steps", "2", "--checkpoint_state_freq", "100", "--checkpoint_state_dir", str(tmp_path / "state"))
    cfg = fakes.config(*flags, steps=8, prompts=2)

    def slow_tail(request, j):  # some prompts outlive a step, so they are in flight at the stop
        return fakes.Script(latency_s=random.Random(request.prompt_id).choice([0.5, 0.5, 6.0]), reward=float(j % 2))

    stop = StopRequest()

    def stop_after_step_2(step: int) -> None:
        if step == 2:
            stop.reason = "SIGTERM"

    first = fakes.build(cfg, script=slow_tail, on_step=stop_after_step_2, stop=stop)
    summary = first.loop.run()
    assert summary["status"] == "stopped by SIGTERM" and summary["steps_trained"] == 3
    assert (tmp_path / "state" / "latest").read_text() == "step_3"
    untrained_at_stop = set(first.log.untrained)
    assert untrained_at_stop and first.engines.stopped == "abort"

    second = fakes.build(cfg, script=slow_tail)
    summary = second.loop.run()
    assert summary["status"] == "completed" and second.loop.step == 8
    assert second.learners.version == 8 and second.sync.pushed[0] == 3  # engines start from the checkpoint
    requeued = [r for _, r in second.engines.submitted[: len(untrained_at_stop)]]
    assert {r.prompt_id for r in requeued} == untrained_at_stop  # same ids (and seeds) as before the stop
    first_requests = {r.prompt_id: r for _, r in first.engines.submitted}
    assert all(r.seed == first_requests[r.prompt_id].seed for r in requeued)
    trained = first.learners.trained_ids + second.learners.trained_ids
    assert len(trained) == len(set(trained)) == 16  # none twice
    admitted = set(first.engines.admitted_ids) | set(second.engines.admitted_ids)
    assert set(trained) | set(second.log.untrained) == admitted  # none lost
    assert [h["training_step"] for h in second.log.history] == [3, 4, 5, 6, 7]


def test_heavy_tails_lose_nothing_and_train_nothing_twice():
    def heavy(request, j):
        rng = random.Random(f"{request.prompt_id}/{j}")
        return fakes.Script(length=rng.randint(1, 50), latency_s=rng.lognormvariate(0, 1.5), reward=float(j % 2))

    run = fakes.build(fakes.config("--async_steps", "2", steps=20, prompts=4, samples=4), script=heavy, step_s=0.7)
    summary = run.loop.run()
    trained = run.learners.trained_ids
    assert len(trained) == len(set(trained)) == 80
    assert set(trained) | set(run.log.untrained) == set(run.engines.admitted_ids)
    assert summary["prompts_admitted"] == len(run.engines.admitted_ids) == (19 + 2 + 1) * 4
    counts = run.engines.ledger.counts()
    assert counts["admitted_prompts"] == 88 and counts["delivered_samples"] <= counts["expected_samples"]
    assert all(h["time/learner_wait_s"] >= 0 and h["time/step_s"] > 0 for h in run.log.history)
