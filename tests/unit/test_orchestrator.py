"""The real TrainingLoop, driven in-process through fakes (tests/helpers/fakes.py) on a virtual clock.

Each scenario runs a whole loop in well under a second: admission under the staleness bound,
eval routing, the weight-sync cadence, held-back completions and evictions, resume with
re-queued prompts, and the "nothing lost, nothing trained twice" ledger.
"""

from __future__ import annotations

import itertools
import random

import pytest
from helpers import fakes

from open_instruct import checkpoints
from open_instruct.orchestrator import StopRequest
from open_instruct.replay_buffer import ReplayBuffer
from open_instruct.staleness import MaxAge


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


def test_a_run_without_an_eval_mix_has_no_eval_rounds_whatever_the_schedule_says():
    cfg = fakes.config("--dataset_mixer_list", "owner/train-only", "1.0", "--local_eval_every", "1", "--eval_on_step_0")
    assert cfg.eval_data is None  # what grpo_fast loads for it: no eval prompts
    run = fakes.build(cfg, eval_rows=())
    summary = run.loop.run()
    assert summary["steps_trained"] == 4 and not run.log.evals
    assert not [r for _, r in run.engines.submitted if r.is_eval]
    assert not [key for h in run.log.history for key in h if key.startswith("eval/")]
    assert summary["first_eval_reward"] is None and summary["last_eval_reward"] is None


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
def test_weights_are_synced_every_n_steps_and_after_the_last(every, steps, expected):
    run = fakes.build(fakes.config("--weight_sync_every_steps", str(every), steps=steps))
    run.loop.run()
    assert run.sync.synced == expected
    synced = [h["training_step"] for h in run.log.history if "weight_sync/version" in h]
    assert synced == [v - 1 for v in expected]


def test_in_flight_syncs_show_up_as_samples_spanning_versions_and_staleness():
    # Samples take longer than a step: once the pipeline is full, each one sees a sync mid-generation.
    run = fakes.build(
        fakes.config("--async_steps", "2", steps=8),
        script=lambda r, j: fakes.Script(length=40, latency_s=5.0, reward=float(j % 2)),
        step_s=1.0,
    )
    run.loop.run()
    history = run.log.history
    assert all(h["staleness/multi_version_frac"] == 0 for h in history[:3])  # finished before the first sync
    late = history[3:]
    assert all(h["staleness/multi_version_frac"] == 1.0 for h in late)
    # Per token, a sample updated in flight is fresher than its oldest token says.
    assert all(0 < h["staleness/token_lag_avg"] < h["staleness/version_lag_max"] <= 3 for h in late)


def fates(run: fakes.Run) -> dict[str, list[str]]:
    """Every admitted training prompt by fate: trained, requeued, dropped, filtered, or untrained at the end."""
    return {**run.log.fates, "untrained": list(run.log.untrained)}


def assert_every_admitted_prompt_has_exactly_one_fate(*runs: fakes.Run) -> dict[str, list[str]]:
    """admitted = trained + requeued + dropped + filtered + failed + untrained, prompt id by prompt id."""
    merged: dict[str, list[str]] = {}
    for run in runs:
        for fate, ids in run.log.fates.items():
            merged.setdefault(fate, []).extend(ids)
    merged["untrained"] = list(runs[-1].log.untrained)
    admitted = [pid for run in runs for pid in run.engines.admitted_ids]
    resolved = [pid for ids in merged.values() for pid in ids]
    assert sorted(set(admitted)) == sorted(resolved), "a prompt was lost or has two fates"
    return merged


def test_a_full_buffer_holds_completions_back_and_offers_them_again():
    run = fakes.build(fakes.config("--async_steps", "2", steps=6, prompts=2, samples=2))
    # Room for exactly one batch: groups beyond it are held back by the loop until a take frees room.
    run.loop.buffer = ReplayBuffer(samples_per_prompt=2, max_samples=4, max_age=MaxAge(2))
    run.loop.run()
    history = run.log.history
    assert history[-1]["buffer/rejected_full_total"] > 0
    trained = run.learners.trained_ids
    assert len(trained) == len(set(trained)) == 12
    assert_every_admitted_prompt_has_exactly_one_fate(run)


def straggler_script(stragglers: set[str], slow_s: float = 30.0):
    """Prompts whose row index is in `stragglers` take `slow_s`; the rest finish in half a second."""

    def script(request, j):
        index = request.prompt_id.split(":")[2].split("@")[0]
        return fakes.Script(length=40, latency_s=slow_s if index in stragglers else 0.5, reward=float(j % 2))

    return script


@pytest.mark.parametrize("action", ["requeue", "drop"])
def test_groups_over_the_bound_never_train_are_replaced_and_their_samples_aborted(action):
    flags = ("--async_steps", "3", "--max_off_policy_steps", "1", "--off_policy_action", action)
    run = fakes.build(
        fakes.config(*flags, steps=8, prompts=1), train_rows=fakes.rows(6), script=straggler_script({"0", "4"})
    )
    run.loop.run()
    history = run.log.history
    assert [len(groups) for groups in run.learners.trained] == [1] * 8  # replaced: every batch is full
    assert all(h["staleness/version_lag_max"] <= 1 for h in history)  # the bound holds on every step
    got = assert_every_admitted_prompt_has_exactly_one_fate(run)
    late = {"fake:train:0@0", "fake:train:4@0"}
    assert late & set(got[{"requeue": "requeued", "drop": "dropped"}[action]]) == late
    assert not late & set(got["trained"])
    # The stragglers were aborted in the engine once the bound made them useless, not run to the end.
    assert run.engines.aborts and history[-1]["offpolicy/aborted_samples_total"] >= 2
    assert history[-1]["offpolicy/aborted_tokens_total"] > 0
    if action == "requeue":  # admitted again, fresh, under a new id (and still too slow: requeued again)
        assert "fake:train:0@0+1" in run.engines.admitted_ids
        assert history[-1]["offpolicy/requeued_prompts_total"] >= 2
    else:
        assert not any("+" in pid for pid in run.engines.admitted_ids)
        assert history[-1]["offpolicy/dropped_prompts_total"] >= 2
    # Refills are admitted on top of the lookahead, never beyond it plus what was dropped.
    refills = history[-1]["batch/refilled_prompts_total"]
    assert (8 - 1 + 3 + 1) < run.loop.feeder.state.admitted <= (8 - 1 + 3 + 1) + refills


def test_a_run_whose_every_sample_failed_ends_with_the_cause_and_a_partly_failed_one_trains():
    from open_instruct.errors import UserError
    from open_instruct.orchestrator import NothingGenerated

    def failing(request, j):
        return fakes.Script(length=0, finish_reason="error")

    # --max_error_fraction 1: no share limit, so the window full of failures is what ends the run. Its size
    # here: the 3 steps' 12 samples, all the run has left to train.
    run = fakes.build(fakes.config("--max_error_fraction", "1", steps=3, prompts=2), script=failing)
    cause = (
        r"^step 0: all of the last 12 finished training samples failed .*; most common: "
        r"'scripted engine failure' \(12 samples\)$"
    )
    with pytest.raises(NothingGenerated, match=cause):
        run.loop.run()
    assert issubclass(NothingGenerated, UserError) and run.learners.trained == []

    def unscored(request, j):  # finish_reason "stop", but no verifier could score it
        return fakes.Script(reward=0.0, reward_error="ZeroDivisionError: division by zero")

    run = fakes.build(fakes.config("--max_error_fraction", "1", steps=3, prompts=2), script=unscored)
    with pytest.raises(NothingGenerated, match=r"\"verifier 'gsm8k': ZeroDivisionError: division by zero\" \(12 "):
        run.loop.run()

    def first_sample_fails(request, j):
        return fakes.Script(length=0, finish_reason="error") if j == 0 else fakes.Script(reward=float(j % 2))

    run = fakes.build(fakes.config(steps=3, prompts=2), script=first_sample_fails)
    assert run.loop.run()["status"] == "completed" and len(run.learners.trained) == 3


def test_a_first_batch_of_instant_refusals_is_set_aside_and_the_run_trains_on():
    """With a long lookahead the prompts an engine refuses at once complete first and can fill a batch alone:
    it trains nothing, its prompts get the fate "failed" and are replaced, and the run goes on."""
    refused: list[str] = []

    def first_prompts_refused(request, j):
        if request.prompt_id in refused or len(refused) < 4:  # the first 4 prompts the engines see
            if request.prompt_id not in refused:
                refused.append(request.prompt_id)
            return fakes.Script(length=0, finish_reason="error", latency_s=0.0)
        return fakes.Script(latency_s=2.0, reward=float(j % 2))

    run = fakes.build(fakes.config("--async_steps", "4", steps=6, prompts=4), script=first_prompts_refused)
    summary = run.loop.run()
    assert summary["status"] == "completed" and len(run.learners.trained) == 6
    fates = assert_every_admitted_prompt_has_exactly_one_fate(run)
    assert sorted(fates["failed"]) == sorted(refused) and summary["prompts_failed"] == 4
    assert run.log.history[-1]["batch/failed_prompts_total"] == 4
    assert not set(refused) & set(run.learners.trained_ids)


def prompt_index(request) -> int:
    return int(request.prompt_id.split(":")[2].split("@")[0])


def four_in_five_fail(request, j):
    """Sample 0 of each prompt is fine; 1 and 2 fail in the engine, 3 and 4 in the verifier (which names the
    prompt: those messages differ only in a number)."""
    if j in (1, 2):
        return fakes.Script(length=0, finish_reason="error")
    if j in (3, 4):
        return fakes.Script(reward=0.0, reward_error=f"ValueError: no answer in row {prompt_index(request)}")
    return fakes.Script(reward=1.0)


def test_a_run_where_most_samples_fail_stops_with_the_share_and_the_common_errors_instead_of_completing():
    from open_instruct.errors import UserError
    from open_instruct.orchestrator import TooManyErrors

    run = fakes.build(fakes.config(steps=20, prompts=4, samples=5), script=four_in_five_fail)
    # The window: the 9 batches of 4 x 5 samples that --async_steps 8 admits at once.
    cause = (
        r"^step 0: 144 of the last 180 finished training samples failed \(80\.0%, more than --max_error_fraction "
        r"0\.5\); most common: 'scripted engine failure' \(72 samples\); \"verifier 'gsm8k': ValueError: no "
        r"answer in row \d+\" \(72 samples\)$"
    )
    with pytest.raises(TooManyErrors, match=cause):
        run.loop.run()
    assert issubclass(TooManyErrors, UserError)  # one line from grpo_fast.py, exit 2
    assert run.learners.trained == [] and run.log.history == []


def test_a_run_broken_mid_way_stops_after_logging_the_rising_error_share():
    from open_instruct.orchestrator import TooManyErrors

    def broken_from_version_3(request, j):
        return four_in_five_fail(request, j) if request.admitted_version >= 3 else fakes.Script(reward=float(j % 2))

    cfg = fakes.config("--async_steps", "1", steps=40, prompts=4, samples=5)
    run = fakes.build(cfg, script=broken_from_version_3)
    with pytest.raises(TooManyErrors, match=r"^step \d+: \d+ of the last 64 finished training samples failed"):
        run.loop.run()
    shares = [h["val/error_frac"] for h in run.log.history]
    assert shares[:3] == [0.0] * 3 and 0.0 < shares[-1] <= 0.5 and shares == sorted(shares)
    assert 3 < len(run.learners.trained) < 40


@pytest.mark.parametrize("flags", [(), ("--active_sampling",)])
def test_a_run_whose_every_verifier_call_failed_stops_instead_of_completing(flags):
    """A verifier failure leaves the sample a stand-in reward of 0 and finish_reason "stop": before, a short run
    trained on them and ended "completed"; with --active_sampling the groups (all 0) were filtered unseen."""
    from open_instruct.orchestrator import TooManyErrors

    def unscored(request, j):
        return fakes.Script(reward=0.0, reward_error="ZeroDivisionError: division by zero")

    run = fakes.build(fakes.config(*flags, steps=5, prompts=2), script=unscored)
    cause = r"^step 0: 20 of the last 20 finished .* \"verifier 'gsm8k': ZeroDivisionError: division by zero\""
    with pytest.raises(TooManyErrors, match=cause):
        run.loop.run()
    assert run.learners.trained == []


def test_occasional_failures_below_the_limit_train_the_rest_and_log_their_share():
    def one_in_five_fails(request, j):
        return fakes.Script(length=0, finish_reason="error") if j == 0 else fakes.Script(reward=float(j % 2))

    run = fakes.build(fakes.config(steps=20, prompts=4, samples=5), script=one_in_five_fails)
    assert run.loop.run()["status"] == "completed" and len(run.learners.trained) == 20
    assert [h["val/error_frac"] for h in run.log.history] == pytest.approx([0.2] * 20)


def test_eval_samples_are_never_aborted_by_the_training_staleness_bound():
    def script(request, j):  # eval samples outlive several steps; training ones are quick
        return fakes.Script(latency_s=9.0 if request.is_eval else 0.5, reward=10.0 if request.is_eval else float(j % 2))

    flags = ("--async_steps", "2", "--max_off_policy_steps", "1", "--off_policy_action", "requeue", "--num_evals", "2")
    flags += ("--eval_on_step_0",)
    run = fakes.build(fakes.config(*flags, steps=8), eval_rows=fakes.rows(3, "test"), script=script)
    run.loop.run()
    assert run.engines.aborts  # the bound was enforced on every step after the first ones
    assert run.log.evals and all(e["eval/verifiable_reward"] == 10.0 for e in run.log.evals)  # no aborted eval


def test_downweight_trains_late_groups_at_a_lower_weight_without_aborting():
    flags = ("--async_steps", "3", "--max_off_policy_steps", "1", "--off_policy_action", "downweight")
    run = fakes.build(
        fakes.config(*flags, steps=8, prompts=1), train_rows=fakes.rows(6), script=straggler_script({"0"}, slow_s=6.0)
    )
    run.loop.run()
    got = assert_every_admitted_prompt_has_exactly_one_fate(run)
    assert "fake:train:0@0" in got["trained"] and not run.engines.aborts
    [late] = [g for groups in run.learners.trained for g in groups if g.prompt_id == "fake:train:0@0"]
    assert late.age > 1 and late.weights[0] == pytest.approx(0.5 ** (late.age - 1))
    assert run.log.history[-1]["buffer/downweighted_total"] >= 1


def test_mask_trains_late_groups_whole_on_their_young_tokens_without_aborting_or_replacing():
    flags = ("--async_steps", "1", "--max_off_policy_steps", "1", "--off_policy_action", "mask")
    run = fakes.build(
        fakes.config(*flags, steps=8, prompts=1), train_rows=fakes.rows(6), script=straggler_script({"0"}, slow_s=6.0)
    )
    run.loop.run()
    got = assert_every_admitted_prompt_has_exactly_one_fate(run)
    assert "fake:train:0@0" in got["trained"] and not run.engines.aborts
    assert not got.get("requeued") and not got.get("dropped")  # no prompt is lost or replaced for its age
    [late] = [g for groups in run.learners.trained for g in groups if g.prompt_id == "fake:train:0@0"]
    assert late.age > 1 and late.weights == (1.0,) * len(late.completions)
    assert late.trained_from_version == late.min_version + late.age - 1  # the learner's version minus the bound
    history = run.log.history
    assert history[-1]["buffer/dropped_stale_total"] == 0 and history[-1]["buffer/context_only_tokens_total"] > 0
    assert all(h["buffer/full_weight_token_age_max"] <= 1 for h in history)  # no trained token is older than K
    summary = run.log.summary
    assert summary["full_weight_token_age_max"] <= 1 and summary["context_only_token_fraction"] > 0
    window = (summary["max_off_policy_steps"], summary["off_policy_action"], summary["async_steps_final"])
    assert window == (1, "mask", 1) and summary["staleness_policy"] == "K=1, mask"


def test_active_sampling_trains_full_batches_of_groups_with_reward_spread():
    def script(request, j):  # every third prompt is always right (no spread: nothing to learn)
        solved = int(request.prompt_id.split(":")[2].split("@")[0]) % 3 == 0
        return fakes.Script(reward=10.0 if solved else float(j % 2))

    run = fakes.build(fakes.config("--async_steps", "2", "--active_sampling", steps=6, prompts=3), script=script)
    run.loop.run()
    assert [len(groups) for groups in run.learners.trained] == [3] * 6
    for groups in run.learners.trained:
        for g in groups:
            assert max(c.reward for c in g.completions) > min(c.reward for c in g.completions)
    got = assert_every_admitted_prompt_has_exactly_one_fate(run)
    assert got["filtered"] and all(int(pid.split(":")[2].split("@")[0]) % 3 == 0 for pid in got["filtered"])
    last = run.log.history[-1]
    assert last["batch/filtered_zero_std_prompts_total"] == len(got["filtered"]) == last["batch/refilled_prompts_total"]


def test_active_sampling_that_finds_no_reward_spread_in_a_whole_pass_ends_the_run_with_the_reason(caplog):
    from open_instruct.errors import UserError
    from open_instruct.orchestrator import NoRewardSpread

    # 12 rows, 2 per step: a pass (12 groups) is longer than the 4 steps' worth (8) that triggers the warning.
    def script(request, j):  # every answer right; groups finish one at a time
        return fakes.Script(reward=1.0, latency_s=1.0 + 0.1 * int(request.prompt_id.split(":")[2].split("@")[0]))

    run = fakes.build(fakes.config("--active_sampling", steps=4, prompts=2), train_rows=fakes.rows(12), script=script)
    with pytest.raises(NoRewardSpread, match=r"^--active_sampling: 1[2-9] groups in a row had zero reward spread"):
        run.loop.run()
    assert issubclass(NoRewardSpread, UserError)  # one line from grpo_fast.py, no traceback
    assert run.learners.trained == [] and run.loop.buffer.zero_std_streak >= 12 == run.loop.spread_watch.patience
    assert "the last 8 groups had zero reward spread" in caplog.text  # said before the run gives up
    filtered = run.loop.outcomes.totals()["filtered"]
    assert filtered == run.loop.buffer.zero_std_streak  # each counted, and replaced by a refill
    assert run.loop.feeder.state.refills == filtered


def test_without_active_sampling_zero_spread_groups_count_toward_the_step():
    run = fakes.build(
        fakes.config("--async_steps", "2", steps=4, prompts=2), script=lambda r, j: fakes.Script(reward=1.0)
    )
    run.loop.run()
    # open-instruct's behaviour: the groups are taken (the learner group's filter shrinks the batch).
    assert [len(groups) for groups in run.learners.trained] == [2] * 4
    assert "filtered" not in run.log.fates


def test_solved_prompts_are_not_admitted_again_in_later_epochs(tmp_path):
    def script(request, j):  # rows 0 and 1 are always solved; the rest half right
        solved = request.prompt_id.split(":")[2].split("@")[0] in {"0", "1"}
        return fakes.Script(reward=10.0 if solved else float(j % 2) * 10.0)

    flags = ("--async_steps", "0", "--no_resampling_pass_rate", "0.9")
    run = fakes.build(fakes.config(*flags, steps=6, prompts=2), train_rows=fakes.rows(4), script=script)
    run.loop.run()
    admitted = run.engines.admitted_ids
    assert {"fake:train:0@0", "fake:train:1@0"} <= set(admitted)  # epoch 0: everything once
    later = [pid for pid in admitted if not pid.endswith("@0")]
    assert later and not any(pid.split("@")[0] in {"fake:train:0", "fake:train:1"} for pid in later)
    assert run.loop.feeder.state.solved == {"fake:train:0", "fake:train:1"}
    assert run.log.history[-1]["data/solved_prompts"] == 2.0


def test_a_mix_smaller_than_the_lookahead_runs_on_into_later_epochs_and_counts_them():
    # 3 prompts, 2 per step, 4 steps ahead: open-instruct goes on into the next pass, so must we.
    run = fakes.build(fakes.config("--async_steps", "4", steps=6, prompts=2), train_rows=fakes.rows(3))
    assert run.loop.run()["status"] == "completed"
    trained = run.learners.trained_ids
    assert len(trained) == len(set(trained)) == 6 * 2  # every group trained once, under its own epoch id
    epochs = [h["data/epoch"] for h in run.log.history]
    assert epochs == sorted(epochs) and epochs[-1] >= 3  # 12 trained + the lookahead's over 3 rows a pass
    assert {pid.split("@")[0] for pid in trained} == {f"fake:train:{i}" for i in range(3)}


def test_auto_lookahead_converges_on_the_need_and_holds():
    # Groups take 4.5 s from admission; a step is 1 s of training plus the sync: about 4 steps of need.
    run = fakes.build(
        fakes.config("--async_steps", "auto", "--max_off_policy_steps", "6", steps=40, prompts=2),
        script=lambda r, j: fakes.Script(latency_s=4.5, reward=float(j % 2)),
        step_s=1.0,
    )
    run.loop.run()
    lookahead = [h["scheduling/async_steps"] for h in run.log.history]
    assert lookahead[0] <= 2 and max(lookahead) <= 6
    settled = lookahead[15:]
    assert len(set(settled)) == 1 and settled[0] >= 4  # converged, and no oscillation
    assert all(abs(b - a) <= 1 for a, b in itertools.pairwise(lookahead))  # changes smoothly
    waits = [h["time/learner_wait_s"] for h in run.log.history[20:]]
    assert max(waits) < 0.01  # the learner is fed once the lookahead covers the latency


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
    assert second.learners.version == 8 and second.sync.synced[0] == 3  # engines start from the checkpoint
    saved_groups = checkpoints.latest_state(str(tmp_path / "state"))[1].buffer.groups
    in_buffer = {g.prompt_id for g in saved_groups if g.seq is not None}
    requeued = [r for _, r in second.engines.submitted[: len(untrained_at_stop - in_buffer)]]
    # Same ids (and seeds) as before the stop; complete groups come back in the buffer instead.
    assert {r.prompt_id for r in requeued} | in_buffer == untrained_at_stop
    first_requests = {r.prompt_id: r for _, r in first.engines.submitted}
    assert all(r.seed == first_requests[r.prompt_id].seed for r in requeued)
    trained = first.learners.trained_ids + second.learners.trained_ids
    assert len(trained) == len(set(trained)) == 16  # none twice
    assert_every_admitted_prompt_has_exactly_one_fate(first, second)  # none lost
    assert [h["training_step"] for h in second.log.history] == [3, 4, 5, 6, 7]


def test_a_resumed_buffers_samples_count_in_the_error_window_as_in_one_run(tmp_path):
    flags = ("--async_steps", "2", "--checkpoint_state_freq", "100", "--checkpoint_state_dir", str(tmp_path / "state"))
    cfg = fakes.config(*flags, steps=8, prompts=2)

    def sample_0_fails(request, j):
        latency_s = random.Random(request.prompt_id).choice([0.5, 6.0])
        if j == 0:
            return fakes.Script(length=0, finish_reason="error", latency_s=latency_s)
        return fakes.Script(latency_s=latency_s, reward=float(j % 2))

    stop = StopRequest()
    first = fakes.build(cfg, script=sample_0_fails, on_step=lambda step: setattr(stop, "reason", "SIGTERM"), stop=stop)
    first.loop.run()
    restored = [c for g in checkpoints.latest_state(str(tmp_path / "state"))[1].buffer.groups for c in g.completions]
    assert restored and any(c.finish_reason == "error" for c in restored)

    second = fakes.build(cfg, script=sample_0_fails)
    assert len(second.loop.errors.window) == len(restored)
    assert second.loop.errors.errors == sum(c.finish_reason == "error" for c in restored)


def test_samples_running_at_a_stop_continue_after_the_resume_from_their_tokens(tmp_path):
    """SIGTERM with long samples running: the state keeps the delivered samples of open groups and the
    tokens, logprobs and spans of the running ones; the resumed run generates only the rest of each."""
    state_dir = str(tmp_path / "state")
    flags = ("--async_steps", "2", "--max_off_policy_steps", "20", "--checkpoint_state_freq", "100")
    # Seed 1's prompt order runs a straggler at the stop that the resumed run's four steps still train.
    cfg = fakes.config(*flags, "--checkpoint_state_dir", state_dir, "--seed", "1", steps=6, prompts=2, samples=2)

    def one_long_sample(request, j):  # sample 1 of every third prompt is a long straggler
        long = j == 1 and int(request.prompt_id.split(":")[-1].split("@")[0]) % 3 == 0
        return fakes.Script(length=40 if long else 4, latency_s=20.0 if long else 0.5, reward=float(j % 2))

    stop = StopRequest()

    def stop_after_step_2(step: int) -> None:
        if step == 2:
            stop.reason = "SIGTERM"

    first = fakes.build(cfg, script=one_long_sample, on_step=stop_after_step_2, stop=stop)
    first.loop.run()
    state = checkpoints.latest_state(state_dir)[1]
    continued = {r.prompt_id: r for r in state.requeue if r.partials}
    assert continued, "no sample was running at the stop"
    for request in continued.values():
        assert request.sample_indices == (1,)  # sample 0 was delivered: kept in the buffer, not generated again
        (partial,) = request.partials
        assert 0 < len(partial.token_ids) < 40 and len(partial.logprobs) == len(partial.token_ids)
        assert partial.version_spans and partial.version_spans[-1].end == len(partial.token_ids)
    open_groups = {g.prompt_id: g for g in state.buffer.groups if g.seq is None}
    assert set(continued) <= set(open_groups)

    second = fakes.build(cfg, script=one_long_sample)
    second.loop.run()
    resumed = [r for _, r in second.engines.submitted if r.prompt_id in continued]
    assert [r.partials for r in resumed] == [continued[r.prompt_id].partials for r in resumed]
    trained = {(c.prompt_id, c.sample_index): c for b in second.learners.trained for g in b for c in g.completions}
    for prompt_id, request in continued.items():
        if (prompt_id, 1) not in trained:
            continue  # still untrained when the resumed run ended
        completion, kept = trained[(prompt_id, 1)], request.partials[0]
        assert completion.continued_tokens == len(kept.token_ids) and len(completion.response_token_ids) == 40
        assert completion.response_token_ids[: len(kept.token_ids)] == kept.token_ids
        assert completion.version_spans[: len(kept.version_spans)] == kept.version_spans  # both parts' spans
        assert trained[(prompt_id, 0)] == open_groups[prompt_id].completions[0]  # delivered before the stop
    trained_continued = [pid for pid in continued if (pid, 1) in trained]
    assert trained_continued
    assert second.log.history[-1]["engines/continued_samples_total"] == len(continued)


def test_a_stop_while_the_batch_cannot_complete_saves_at_once_with_the_running_samples(tmp_path):
    """SIGTERM while the loop waits for a batch whose samples will not finish for hours (held, or very long):
    the loop does not wait for them; they are cut, kept in the state, and the step is not taken."""
    state_dir = str(tmp_path / "state")
    flags = ("--async_steps", "1", "--checkpoint_state_freq", "100", "--checkpoint_state_dir", state_dir)
    cfg = fakes.config(*flags, steps=6, prompts=2, samples=2)
    stop, endless_since = StopRequest(), []

    def endless_from_version_2(request, j):
        if request.admitted_version < 2:
            return fakes.Script(length=4, latency_s=0.5, reward=float(j % 2))
        endless_since.append(run.clock.now)
        return fakes.Script(length=36_000, latency_s=36_000.0, reward=float(j % 2))  # a token a second

    run = fakes.build(cfg, script=endless_from_version_2, stop=stop)
    poll = run.engines.poll

    def poll_then_signal(timeout_s: float = 0.0):
        completions = poll(timeout_s)
        if endless_since and run.clock.now >= endless_since[0] + 10:  # SIGTERM 10 s into the endless samples
            stop.reason = "SIGTERM"
        return completions

    run.engines.poll = poll_then_signal
    summary = run.loop.run()
    # Batches 0-2 were admitted before version 2 (one step ahead); batch 3 cannot complete.
    assert summary["status"] == "stopped by SIGTERM" and summary["steps_trained"] == 3
    assert run.clock.now < endless_since[0] + 60  # nobody waited for the ten-hour samples
    _, state = checkpoints.latest_state(state_dir)
    assert state.next_step == 3 and state.version == 3
    cut = [r for r in state.requeue if r.admitted_version >= 2]
    assert cut and all(len(r.partials) == len(r.sample_indices) == 2 for r in cut)
    assert all(5 <= len(p.token_ids) < 60 for r in cut for p in r.partials)  # what ran before the stop
    assert_every_admitted_prompt_has_exactly_one_fate(run)


def test_heavy_tails_lose_nothing_and_train_nothing_twice():
    def heavy(request, j):
        rng = random.Random(f"{request.prompt_id}/{j}")
        return fakes.Script(length=rng.randint(1, 50), latency_s=rng.lognormvariate(0, 1.5), reward=float(j % 2))

    run = fakes.build(fakes.config("--async_steps", "2", steps=20, prompts=4, samples=4), script=heavy, step_s=0.7)
    summary = run.loop.run()
    trained = run.learners.trained_ids
    assert len(trained) == len(set(trained)) == 80
    got = assert_every_admitted_prompt_has_exactly_one_fate(run)
    refills = len(got.get("requeued", []))
    assert summary["prompts_admitted"] == len(run.engines.admitted_ids) == (19 + 2 + 1) * 4 + refills
    # the default action (mask) bounds every token trained at full weight; a group may be older than that
    assert all(h["buffer/full_weight_token_age_max"] <= 2 for h in run.log.history)
    counts = run.engines.ledger.counts()
    assert counts["delivered_samples"] <= counts["expected_samples"]
    assert all(h["time/learner_wait_s"] >= 0 and h["time/step_s"] > 0 for h in run.log.history)


def window_run(health=None):
    # Groups take 4.5 s from admission; a step is 1 s of training plus the sync: about 4 steps of lookahead
    # keep the learner fed, if the window lets generation run that far ahead.
    flags = ("--async_steps", "auto", "--max_off_policy_steps", "auto", "--off_policy_window_max", "6")
    run = fakes.build(
        fakes.config(*flags, steps=40, prompts=2),
        script=lambda r, j: fakes.Script(latency_s=4.5, reward=float(j % 2)),
        step_s=1.0,
        health=health,
    )
    summary = run.loop.run()
    return run, summary, [h["offpolicy/window"] for h in run.log.history]


def test_a_self_tuning_window_widens_until_the_learner_is_fed_when_health_allows():
    run, summary, window = window_run()
    assert window[0] <= 2 and all(b - a in (0, 1) for a, b in itertools.pairwise(window))
    assert window[-1] >= 4 and summary["off_policy_window_final"] == window[-1]
    assert summary["max_off_policy_steps"] == "auto"
    lookahead = [h["scheduling/async_steps"] for h in run.log.history]
    assert all(a <= k for a, k in zip(lookahead, window))  # the lookahead never runs past the window
    assert max(h["time/learner_wait_s"] for h in run.log.history[-10:]) < 0.01


def test_a_self_tuning_window_stops_where_the_policy_moves_too_fast_for_the_lag():
    # The ess deficit grows with the square of the lag: 0.98 at lag 1, 0.92 at 2, 0.82 at 3 (past the 0.9 limit).
    run, _, window = window_run(health=lambda lag: {"offpolicy/ess_frac": 1 - 0.02 * lag**2})
    assert max(window) == window[-1] == 2  # from 2 the prediction for 3 is 1 - 0.08 * (3/2)^2 = 0.82: it stays
    assert min(h["offpolicy/ess_frac"] for h in run.log.history) >= 0.9  # never past the limit
    assert max(h["time/learner_wait_s"] for h in run.log.history[-10:]) > 0  # the price: the learner waits
