"""The driver's fault bookkeeping as pure logic: partial samples kept from progress reports and interrupts,
resubmission with the missing indices only, and the hang verdicts (probe unanswered, no progress)."""

from __future__ import annotations

from open_instruct.generation.faults import HangWatch, PartialSamples
from open_instruct.generation.ledger import DeliveryLedger
from open_instruct.messages import Completion, PromptRequest, SampleProgress, SamplingSettings, VersionSpan


def request(num_samples: int = 3, **changes) -> PromptRequest:
    fields = {
        "prompt_id": "train:0:5",
        "prompt_token_ids": (1, 2, 3, 4),
        "ground_truths": ("7",),
        "verifier_names": ("gsm8k",),
        "sampling": SamplingSettings(max_tokens=100),
        "num_samples": num_samples,
        "seed": 3,
        "admitted_version": 2,
    }
    return PromptRequest(**{**fields, **changes})


def progress(start: int, tokens: tuple[int, ...], version: int = 2, index: int = 1) -> SampleProgress:
    end = start + len(tokens)
    return SampleProgress("train:0:5", index, 0, start, tokens, (-0.5,) * len(tokens), (VersionSpan(version, 0, end),))


def test_progress_reports_accumulate_and_a_report_that_does_not_extend_is_ignored():
    kept = PartialSamples()
    kept.report(progress(0, (10, 11, 12)))
    kept.report(progress(3, (13, 14), version=3))
    kept.report(progress(0, (99, 98)))  # a duplicate's first report (resubmitted elsewhere): not ours
    (partial,) = kept.of_prompt("train:0:5")
    assert partial.token_ids == (10, 11, 12, 13, 14) and partial.logprobs == (-0.5,) * 5
    assert partial.version_spans == (VersionSpan(3, 0, 5),)  # each report carries the whole response's spans
    kept.delivered("train:0:5", 1)
    assert not kept.of_prompt("train:0:5") and len(kept) == 0


def test_attach_sends_only_the_missing_samples_with_what_is_kept_and_counts_the_savings():
    kept = PartialSamples()
    kept.report(progress(0, tuple(range(20, 30)), index=2))
    resubmitted = kept.attach(request(), (0, 2))
    assert resubmitted.sample_indices == (0, 2) and resubmitted.samples_to_generate() == (0, 2)
    assert resubmitted.partial_of(2).token_ids == tuple(range(20, 30)) and resubmitted.partial_of(0) is None
    assert kept.metrics() == {
        "engines/continued_samples_total": 1.0,
        "engines/continued_tokens_saved_total": 10.0,
        "engines/reprefilled_tokens_total": 14.0,  # the prompt and the kept tokens, prefilled once
        "engines/partial_samples_kept": 1.0,
    }


def test_an_interrupted_sample_keeps_the_longer_of_its_report_and_its_aborted_tokens():
    kept = PartialSamples()
    kept.report(progress(0, (10, 11, 12, 13)))

    def aborted(tokens: tuple[int, ...]) -> Completion:
        spans = (VersionSpan(2, 0, len(tokens)),)
        return Completion("train:0:5", 1, (1, 2), tokens, (-0.1,) * len(tokens), "abort", spans, 2, 0)

    kept.interrupted(aborted(()))  # cut while waiting for a weight sync: nothing newer than the report
    assert kept.of_prompt("train:0:5")[0].token_ids == (10, 11, 12, 13)
    kept.interrupted(aborted((10, 11, 12, 13, 14, 15)))
    assert kept.of_prompt("train:0:5")[0].token_ids == (10, 11, 12, 13, 14, 15)


def test_the_ledger_of_a_resumed_group_expects_only_its_missing_samples():
    ledger = DeliveryLedger()
    ledger.admit(request(num_samples=4, sample_indices=(1, 3)))
    assert ledger.in_flight() == ["train:0:5"]
    for j in (1, 3):
        ledger.deliver(Completion("train:0:5", j, (1,), (5,), (-1.0,), "stop", (), 2, 0))
    assert ledger.in_flight() == []
    ledger.check_complete()


def test_an_unanswered_probe_is_a_hang_after_the_timeout():
    watch = HangWatch(timeout_s=30, probe_every_s=5)
    assert watch.probe_due(0, now=0.0)
    watch.probe_sent(0, "probe-1", now=0.0)
    assert not watch.probe_due(0, now=10.0)  # one probe at a time
    assert watch.hung(now=29.0) == {}
    assert "no answer for 31 s" in watch.hung(now=31.0)[0]


def test_no_progress_with_samples_running_is_a_hang_on_the_engines_own_clock():
    watch = HangWatch(timeout_s=30, probe_every_s=5)
    clock = 0.0

    def answer(pulse, active, engine_clock) -> dict:
        nonlocal clock
        clock += 10.0
        assert watch.probe_due(0, clock)
        watch.probe_sent(0, "probe", clock)
        watch.answered(0, pulse, active, engine_clock)
        return watch.hung(clock)

    assert answer((10, 1, 0), 4, engine_clock=100.0) == {}
    assert answer((10, 1, 0), 4, engine_clock=120.0) == {}  # 20 s without a token: not yet
    assert "no token for 31 s" in answer((10, 1, 0), 4, engine_clock=131.0)[0]


def test_idle_engines_paused_ones_and_a_busy_driver_are_not_hangs():
    watch = HangWatch(timeout_s=30, probe_every_s=5)
    watch.probe_due(0, 0.0)
    watch.probe_sent(0, "p", 0.0)
    watch.answered(0, (10, 1, 0), 0, engine_clock=100.0)
    watch.probe_sent(0, "p", 1.0)
    watch.answered(0, (10, 1, 0), 0, engine_clock=500.0)  # nothing to do for 400 s: idle, not hung
    assert watch.hung(now=2.0) == {}
    watch.probe_sent(0, "p", 2.0)
    watch.answered(0, (10, 1, 1), 3, engine_clock=900.0)  # a weight sync paused it: the pulse moved
    # The driver trained for 10 minutes between probes; the engine's own clock says it made progress.
    watch.probe_sent(0, "p", 3.0)
    watch.answered(0, (50, 2, 1), 3, engine_clock=1500.0)
    assert watch.hung(now=603.0) == {}
    assert HangWatch(timeout_s=0).hung(now=1e9) == {} and not HangWatch(timeout_s=0).probe_due(0, 1e9)


def test_an_engine_paused_for_a_weight_sync_is_not_hung_however_long_the_pause():
    """The engine clock is its uptime outside pauses: a sync that holds running samples for minutes on a
    loaded machine is not a stall (a starved run once took a healthy, paused engine for hung)."""
    from open_instruct.messages import EngineStats

    def stats(uptime_s: float, paused_s: float, tokens: int) -> EngineStats:
        return EngineStats(0, 8, 4, 0, 0.0, 0, 0, 0, uptime_s, 0.0, 0.0, paused_s, 1, 0, token_outputs=tokens)

    watch = HangWatch(timeout_s=30, probe_every_s=5)
    watch.probe_due(0, 0.0)
    for clock, uptime, paused in ((0.0, 100.0, 0.0), (1.0, 190.0, 89.0), (2.0, 260.0, 159.0)):
        watch.probe_sent(0, "p", clock)
        watch.answered_stats(0, stats(uptime, paused, tokens=500))  # paused at 101 s, still paused
    assert watch.hung(now=3.0) == {}
    watch.probe_sent(0, "p", 3.0)
    watch.answered_stats(0, stats(300.0, 159.0, tokens=500))  # resumed at 260 s; 40 s running without a token
    assert "no token for 41 s" in watch.hung(now=4.0)[0]


def test_a_failed_engines_prompts_and_the_one_it_pulled_unannounced_go_back_but_not_a_living_engines():
    """Engine 0 dies: the prompt it announced goes back at once; of the prompts started nowhere and not
    queued, the one engine 1 announces within the settle stays with engine 1, the other is resubmitted."""
    from open_instruct.generation.channels import LocalChannel
    from open_instruct.generation.faults import Resubmission

    prompts, ledger = LocalChannel(), DeliveryLedger()
    resubmission = Resubmission(prompts, ledger, PartialSamples(), settle_s=0.0)
    ids = ["announced_on_0", "queued", "pulled_by_0", "pulled_by_1"]
    for prompt_id in ids:
        ledger.admit(request(prompt_id=prompt_id))
        resubmission.admitted(request(prompt_id=prompt_id))
    prompts.put(request(prompt_id="queued"))
    ledger.started("announced_on_0", 0)
    resubmission.resubmit(ledger.in_flight(0))
    resubmission.look_for_unannounced()
    assert [r.prompt_id for r in prompts.get_all()] == ["queued", "announced_on_0"]  # order kept
    ledger.started("pulled_by_1", 1)  # its announcement arrives during the settle
    assert resubmission.decision_due()
    resubmission.resubmit_unannounced()
    assert [r.prompt_id for r in prompts.get_all()] == ["pulled_by_0"]
    assert resubmission.samples == 2 * 3 and not resubmission.decision_due()
    assert ledger.reassigned == {"announced_on_0", "pulled_by_0"}
