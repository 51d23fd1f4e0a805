"""Per-step rollout metrics (pure): token-weighted staleness, group latency, the async_steps advice."""

from __future__ import annotations

import pytest

from open_instruct.messages import Completion, VersionSpan
from open_instruct.metrics import async_steps_needed, rollout_metrics


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


@pytest.mark.parametrize(
    ("latency", "step", "needed"),
    [
        (50.0, 100.0, 1),  # a group is done within a step, yet synchronous still waits for it
        (100.0, 100.0, 1),
        (150.0, 100.0, 2),
        (388.0, 160.0, 3),  # the seed's 16k tail on the simulated cluster (simulator projection)
        (0.0, 100.0, 0),
        (10.0, 0.0, 0),
    ],
)
def test_async_steps_needed_is_littles_law(latency, step, needed):
    assert async_steps_needed(latency, step) == needed


def advisor(async_steps: int | str):
    from open_instruct.scheduling import Lookahead, OffPolicyWindow, Pacing

    lookahead = Lookahead.adaptive(8) if async_steps == "auto" else Lookahead.fixed(async_steps)
    return Pacing(lookahead, OffPolicyWindow.fixed(8))


def test_a_starving_learner_gets_the_advice_once(caplog):
    pacing = advisor(async_steps=1)
    with caplog.at_level("WARNING", logger="open_instruct.scheduling"):
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
    with caplog.at_level("WARNING", logger="open_instruct.scheduling"):
        advisor(async_steps).advise(step, needed=needed, wait_frac=wait_frac)
    assert not caplog.records
