"""Per-step rollout metrics (pure): token-weighted staleness, group latency, the async_steps advice, and the
share of failed samples that --max_error_fraction limits."""

from __future__ import annotations

import pytest

from open_instruct.config.core import parse_config
from open_instruct.config.derived import MIN_ERROR_WINDOW, error_window
from open_instruct.messages import Completion, VersionSpan
from open_instruct.metrics import (
    ErrorWindow,
    async_steps_needed,
    common_errors,
    rollout_metrics,
    sample_error,
    too_many_errors,
)


def completion(
    prompt_id: str,
    length: int,
    spans: tuple[VersionSpan, ...],
    queued_at: float,
    finished_at: float,
    admitted_version: int = 0,
) -> Completion:
    return Completion(
        prompt_id=prompt_id,
        sample_index=0,
        prompt_token_ids=(1, 2),
        response_token_ids=tuple(range(length)),
        behaviour_logprobs=(0.0,) * length,
        finish_reason="stop",
        version_spans=spans,
        admitted_version=admitted_version,
        engine_id=0,
        queued_at=queued_at,
        finished_at=finished_at,
    )


def test_token_lag_weights_each_token_by_the_version_that_generated_it():
    # A straggler: 10 tokens by version 0, 30 by version 2; a short sample: 10 tokens by version 2.
    straggler = completion("a", 40, (VersionSpan(0, 0, 10), VersionSpan(2, 10, 40)), queued_at=100.0, finished_at=160.0)
    short = completion("b", 10, (VersionSpan(2, 0, 10),), queued_at=130.0, finished_at=140.0)
    m = rollout_metrics([straggler, short], learner_version=3)
    assert m["staleness/version_lag_avg"] == pytest.approx((3 + 1) / 2)  # by each sample's oldest token
    assert m["staleness/version_lag_max"] == 3
    assert m["staleness/token_lag_avg"] == pytest.approx((10 * 3 + 30 * 1 + 10 * 1) / 50)
    assert m["staleness/multi_version_frac"] == pytest.approx(0.5)
    assert m["staleness/versions_spanned_max"] == 2 and straggler.versions_spanned == 2
    assert (m["val/sequence_lengths_min"], m["val/sequence_lengths_max"]) == (10, 40)


def test_tokens_without_spans_count_at_their_admission_version():
    c = completion("a", 8, (), queued_at=1.0, finished_at=2.0, admitted_version=1)
    assert rollout_metrics([c], learner_version=4)["staleness/token_lag_avg"] == pytest.approx(3)


def test_group_latency_runs_from_admission_to_the_last_sample():
    group = [completion("a", 5, (), queued_at=10.0, finished_at=t) for t in (12.0, 19.0, 15.0)]
    other = [completion("b", 5, (), queued_at=11.0, finished_at=14.0)]
    m = rollout_metrics(group + other, learner_version=1)
    assert m["time/group_latency_s_avg"] == pytest.approx((9 + 3) / 2)
    assert m["time/group_latency_s_max"] == pytest.approx(9)


def test_empty_batch_has_zero_metrics():
    m = rollout_metrics([], learner_version=0)
    assert m["staleness/token_lag_avg"] == 0 and m["time/group_latency_s_avg"] == 0
    assert m["staleness/versions_spanned_max"] == 0 and m["val/sequence_lengths_max"] == 0


@pytest.mark.parametrize(
    ("latency", "step", "needed"),
    [
        (50.0, 100.0, 1),  # a group is done within a step, yet synchronous still waits for it
        (100.0, 100.0, 1),
        (150.0, 100.0, 2),
        (388.0, 160.0, 3),  # the long-reasoning 16k tail on the simulated cluster (simulator projection)
        (0.0, 100.0, 0),
        (10.0, 0.0, 0),
    ],
)
def test_async_steps_needed_is_littles_law(latency, step, needed):
    assert async_steps_needed(latency, step) == needed


def advisor(async_steps: int | str):
    from open_instruct.pacing import Lookahead, Pacing
    from open_instruct.staleness import OffPolicyWindow

    lookahead = Lookahead.adaptive(8) if async_steps == "auto" else Lookahead.fixed(async_steps)
    return Pacing(lookahead, OffPolicyWindow.fixed(8))


def test_a_starving_learner_gets_the_advice_once(caplog):
    pacing = advisor(async_steps=1)
    with caplog.at_level("WARNING", logger="open_instruct.pacing"):
        pacing.advise(5, needed=3, wait_frac=0.4)
        pacing.advise(5, needed=3, wait_frac=0.4)
    (record,) = caplog.records
    assert "waited 40% of step 5" in record.message and "at least --async_steps 3" in record.message


@pytest.mark.parametrize(
    ("async_steps", "step", "needed", "wait_frac"),
    [
        (1, 5, 1, 0.9),  # the lookahead is enough: waiting has another cause
        (1, 5, 3, 0.1),  # barely waits
        (1, 2, 3, 0.9),  # the pipeline is still filling
        (0, 5, 3, 0.9),  # synchronous on purpose
        ("auto", 5, 3, 0.9),  # the lookahead follows the need by itself
    ],
)
def test_no_advice_when_it_would_not_help(caplog, async_steps, step, needed, wait_frac):
    with caplog.at_level("WARNING", logger="open_instruct.pacing"):
        advisor(async_steps).advise(step, needed=needed, wait_frac=wait_frac)
    assert not caplog.records


# ----------------------------------------------------------------------------- failed samples


def outcome(reason: str = "stop", error: str | None = None, reward_errors: tuple[str, ...] = (), is_eval=False):
    return Completion(
        "p", 0, (1,), (2,), (0.0,), reason, (), 0, 0, error=error, reward_errors=reward_errors, is_eval=is_eval
    )


def test_a_sample_failed_when_the_engine_or_a_verifier_could_not_do_its_part():
    assert sample_error(outcome("error", "ValueError: prompt too long")) == "ValueError: prompt too long"
    assert sample_error(outcome("error")) == "no message"
    # The verifier's message without the sample it names, so that one failure on many samples is one message.
    assert sample_error(outcome(reward_errors=("sample p:3/1: verifier 'math': timed out after 10 s",))) == (
        "verifier 'math': timed out after 10 s"
    )
    assert sample_error(outcome()) is None
    assert sample_error(outcome("length")) is None
    assert sample_error(outcome("abort", "aborted")) is None  # cut on purpose while it was generating


@pytest.mark.parametrize(
    ("errors", "samples", "limit", "minimum", "stops"),
    [
        (33, 64, 0.5, 64, True),  # more than half
        (32, 64, 0.5, 64, False),  # exactly half is not more
        (63, 63, 0.5, 64, False),  # too few samples to judge yet
        (1, 64, 0.0, 64, True),  # 0: any failure
        (64, 64, 1.0, 64, False),  # 1: no limit
        (1, 1, 0.5, 0, True),  # a minimum of 0 still needs a sample
        (0, 0, 0.5, 0, False),
    ],
)
def test_too_many_errors_is_more_than_the_share_of_at_least_the_minimum(errors, samples, limit, minimum, stops):
    assert too_many_errors(errors, samples, limit, minimum) is stops


def test_common_errors_groups_messages_that_differ_only_in_numbers_most_common_first():
    messages = ["prompt of 5000 tokens > 4096"] * 2 + ["ZeroDivisionError"] * 3 + ["prompt of 7000 tokens > 4096"]
    assert common_errors(messages) == ("'prompt of 5000 tokens > 4096' (3 samples); 'ZeroDivisionError' (3 samples)")
    five = [f"error {c}" for c in "abcde"]
    assert common_errors(five, top=2) == "'error a' (1 sample); 'error b' (1 sample); 3 other messages"


def test_the_error_window_judges_its_latest_samples_once_full():
    window = ErrorWindow(size=4, max_fraction=0.5)
    window.add([outcome("error", "boom")] * 3)
    assert window.cause(step=0) is None and window.share == 1.0  # 3 samples: too few to judge
    window.add([outcome(is_eval=True, reason="error", error="eval boom")])  # eval samples are not judged here
    assert window.cause(step=0) is None
    window.add([outcome()])
    assert window.share == 0.75
    assert window.cause(step=2) == (
        "step 2: 3 of the last 4 finished training samples failed (75.0%, more than --max_error_fraction 0.5); "
        "most common: 'boom' (3 samples)"
    )
    window.add([outcome(), outcome("abort", "aborted")])  # the oldest two failures leave the window
    assert (window.errors, window.share, window.cause(step=3)) == (1, 0.25, None)


def test_the_error_window_holds_what_the_lookahead_admits_at_once_within_the_run():
    def window(*flags: str, steps_left: int = 1000) -> int:
        batch = ["--num_unique_prompts_rollout", "8", "--num_samples_per_prompt_rollout", "4"]
        return error_window(parse_config([*flags, *batch]), steps_left)

    assert window("--async_steps", "8") == 9 * 32  # every sample of the 9 batches admitted at once
    assert window("--async_steps", "0") == MIN_ERROR_WINDOW  # one step of 32: too few to judge
    assert window("--async_steps", "auto", "--max_off_policy_steps", "3") == 4 * 32  # its widest lookahead
    assert window("--async_steps", "8", steps_left=5) == 5 * 32  # a short run is judged before it ends
    assert window("--async_steps", "8", steps_left=0) == 1
