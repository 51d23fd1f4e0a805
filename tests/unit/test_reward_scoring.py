"""Tests for the asynchronous reward pool (`open_instruct.rewards.scoring`).

Real worker processes run real verifiers; failure modes use the test verifiers registered in
`helpers/reward_fixtures.py` (an importable module, so the worker processes can load them by reference).
"""

import asyncio
import os

import pytest
from helpers import reward_fixtures

from open_instruct.config.rewards import RewardConfig
from open_instruct.rewards import RewardSettings
from open_instruct.rewards.scoring import RewardScorer, has_think_answer_format

assert reward_fixtures.fixed_score  # registers the test verifiers in this process

TIMEOUT_S = 2.0
HUNG_TIMEOUT_S = 8.0


@pytest.fixture(scope="module")
def scorer():
    scorer = RewardScorer(RewardSettings(verifier_timeout_s=TIMEOUT_S), max_workers=2)
    # Both workers finish starting up before timing-sensitive tests run.
    warm = asyncio.run(score_many(scorer, [("w1", "5", "5", "gsm8k"), ("w2", "5", "5", "gsm8k")]))
    assert [o.reward for o in warm] == [10.0, 10.0]
    yield scorer
    scorer.close()


async def score_many(scorer, calls, finish_reason="stop"):
    return await asyncio.gather(
        *(scorer.score(sid, pred, gts, names, finish_reason, 10) for sid, pred, gts, names in calls)
    )


def score_one(scorer, prediction, ground_truths, verifier_names, finish_reason="stop", sample_id="s"):
    return asyncio.run(score_many(scorer, [(sample_id, prediction, ground_truths, verifier_names)], finish_reason))[0]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_real_verifiers(scorer):
    outcome = score_one(scorer, "<think>6*3</think><answer>18</answer>", ["18"], ["gsm8k"])
    assert outcome.reward == 10.0
    assert outcome.per_verifier == {"gsm8k": 1.0}
    assert outcome.errors == []
    # A plain-string name is paired with the ground truth as given; lookup is case-insensitive.
    outcome = score_one(scorer, "\\boxed{\\frac{5}{6}}", "\\frac{5}{6}", "MATH")
    assert (outcome.reward, outcome.per_verifier) == (10.0, {"math": 1.0})
    # Pairs: verifier i scores ground truth i.
    outcome = score_one(scorer, "The answer is 4, \\boxed{4}", ["4", "5"], ["gsm8k", "math"])
    assert outcome.per_verifier == {"gsm8k": 1.0, "math": 0.0}
    assert outcome.reward == 10.0


def test_math_equivalence_in_worker_processes(scorer):
    pairs = [
        ("0.50", "\\frac{1}{2}"),
        ("\\frac{2}{4}", "\\frac{1}{2}"),
        ("1,000", "1000"),
        ("2\\sqrt{2}", "\\sqrt{8}"),
    ]
    calls = [(f"m{i}", f"\\boxed{{{p}}}", [g], ["math"]) for i, (p, g) in enumerate(pairs)]
    calls.append(("wrong", "\\boxed{0.6}", ["\\frac{1}{2}"], ["math"]))
    outcomes = asyncio.run(score_many(scorer, calls))
    assert [o.reward for o in outcomes] == [10.0] * len(pairs) + [0.0]


def test_raising_verifier_is_a_counted_zero(scorer):
    before = scorer.error_counts["test_raise"]
    outcome = score_one(scorer, "pred", [None, "1"], ["test_raise", "test_fixed"], sample_id="row-7")
    assert outcome.per_verifier == {"test_raise": 0.0, "test_fixed": 1.0}
    assert outcome.reward == 10.0  # the healthy pair still counts
    assert len(outcome.errors) == 1
    assert "row-7" in outcome.errors[0] and "test_raise" in outcome.errors[0]
    assert "RuntimeError: boom" in outcome.errors[0]
    assert scorer.error_counts["test_raise"] == before + 1


def test_hung_verifier_times_out_without_blocking_others(tmp_path):
    """The hung call holds one worker for the whole timeout; the other serves every quick call meanwhile.
    The timeout is long (HUNG_TIMEOUT_S) so that "meanwhile" holds on a loaded machine too."""
    pid_file = tmp_path / "pid"
    scorer = RewardScorer(RewardSettings(verifier_timeout_s=HUNG_TIMEOUT_S), max_workers=2)

    async def scenario():
        hung = asyncio.ensure_future(
            scorer.score("hung", "x", [{"seconds": 600, "pid_file": str(pid_file)}], ["test_sleep"], "stop", 1)
        )
        while not pid_file.exists():  # the hung call now occupies one worker (a handshake, not a guess)
            assert not hung.done(), hung.result()
            await asyncio.sleep(0.01)
        quick = await score_many(scorer, [(f"q{i}", "7", "7", "gsm8k") for i in range(4)])
        hung_while_quick_done = not hung.done()
        return await hung, quick, hung_while_quick_done

    try:
        hung, quick, hung_while_quick_done = asyncio.run(scenario())
        assert [o.reward for o in quick] == [10.0] * 4
        assert hung_while_quick_done  # served by the other worker while the first one hung
        assert hung.reward == 0.0 and hung.per_verifier == {"test_sleep": 0.0}
        assert "timed out" in hung.errors[0] and "hung" in hung.errors[0]
        assert scorer.error_counts["test_sleep"] == 1
        assert not alive(int(pid_file.read_text()))  # the hung process was killed, not leaked
        # The replaced worker serves new calls.
        calls = [("a1", "x", ["1"], ["test_fixed"]), ("a2", "x", ["0.5"], ["test_fixed"])]
        again = asyncio.run(score_many(scorer, calls))
        assert [o.reward for o in again] == [10.0, 5.0]
    finally:
        scorer.close()


def test_crashing_worker_is_replaced(scorer):
    before = scorer.error_counts["test_crash"]
    outcome = score_one(scorer, "x", [None], ["test_crash"])
    assert outcome.reward == 0.0
    assert "died" in outcome.errors[0]
    assert scorer.error_counts["test_crash"] == before + 1
    outcomes = asyncio.run(score_many(scorer, [("c1", "3", "3", "gsm8k"), ("c2", "3", "3", "gsm8k")]))
    assert [o.reward for o in outcomes] == [10.0, 10.0]


def test_invalid_scores_are_errors(scorer):
    for bad in ("nan", "2.0", "-0.5"):
        outcome = score_one(scorer, "x", [bad], ["test_bad_score"])
        assert outcome.reward == 0.0
        assert "score" in outcome.errors[0]


def test_unknown_verifier_and_pairing_errors(scorer):
    before = scorer.error_counts["no_such_verifier"]
    outcome = score_one(scorer, "x", ["1", "1"], ["no_such_verifier", "test_fixed"])
    assert outcome.reward == 10.0
    assert outcome.per_verifier == {"no_such_verifier": 0.0, "test_fixed": 1.0}
    assert "unknown verifier" in outcome.errors[0]
    assert scorer.error_counts["no_such_verifier"] == before + 1

    outcome = score_one(scorer, "x", ["1"], ["test_fixed", "test_fixed"])
    assert outcome.reward == 0.0 and outcome.per_verifier == {}
    assert "2 verifier names but 1 ground truths" in outcome.errors[0]


def test_concurrent_calls_use_all_workers(scorer, tmp_path):
    """Calls run on both workers at once: two worker pids, and calls of different workers overlap in time."""
    log = tmp_path / "calls.log"
    calls = [(f"p{i}", "x", [{"seconds": 0.5, "log_file": str(log)}], ["test_sleep"]) for i in range(8)]
    outcomes = asyncio.run(score_many(scorer, calls))
    assert [o.reward for o in outcomes] == [10.0] * 8
    spans = [(int(pid), float(start), float(end)) for pid, start, end in map(str.split, log.read_text().splitlines())]
    assert len(spans) == 8 and len({pid for pid, _, _ in spans}) == 2
    overlapping = [(a, b) for a in spans for b in spans if a[0] != b[0] and a[1] < b[2] and b[1] < a[2]]
    assert overlapping, spans


def test_reward_arithmetic_penalty_format_and_remap():
    flags = RewardConfig(
        verification_reward=2.0,
        non_stop_penalty=True,
        non_stop_penalty_value=-1.0,
        format_reward=0.5,
        remap_verifier="Legacy=test_fixed",
    )
    settings = RewardSettings(flags, verifier_timeout_s=TIMEOUT_S)
    with RewardScorer(settings, max_workers=1) as scorer:
        plain = score_one(scorer, "answer", ["1"], ["LEGACY"])
        assert plain.reward == 2.0
        assert plain.per_verifier == {"test_fixed": 1.0}  # keyed by the verifier that actually ran
        formatted = score_one(scorer, "plan</think><answer>x</answer>", ["0.5", "1"], ["legacy", "test_fixed"])
        assert formatted.reward == pytest.approx(2.0 * 1.5 + 0.5)
        assert formatted.per_verifier == {"test_fixed": 0.75}  # repeated verifier -> mean score
        truncated = score_one(scorer, "plan</think><answer>x</answer>", ["1"], ["legacy"], finish_reason="length")
        assert truncated.reward == -1.0  # replaces verifier and format reward
        assert truncated.per_verifier == {"test_fixed": 1.0}  # metrics still computed
    with pytest.raises(RuntimeError, match="closed"):
        score_one(scorer, "answer", ["1"], ["legacy"])


def test_verifiable_reward_can_be_disabled():
    flags = RewardConfig(apply_verifiable_reward=False, format_reward=1.0)
    settings = RewardSettings(flags, verifier_timeout_s=TIMEOUT_S)
    with RewardScorer(settings, max_workers=1) as scorer:
        outcome = score_one(scorer, "x</think><answer>y</answer>", [None], ["test_raise"])
    assert (outcome.reward, outcome.per_verifier, outcome.errors) == (1.0, {}, [])


def test_close_stops_worker_processes(tmp_path):
    pid_file = tmp_path / "pid"
    scorer = RewardScorer(RewardSettings(verifier_timeout_s=TIMEOUT_S), max_workers=1)
    assert score_one(scorer, "x", [{"seconds": 0, "pid_file": str(pid_file)}], ["test_sleep"]).reward == 10.0
    pid = int(pid_file.read_text())
    assert alive(pid)
    scorer.close()
    assert not alive(pid)


def test_format_detection():
    assert has_think_answer_format("reasoning</think> <answer>42</answer>")
    assert not has_think_answer_format("<answer>42</answer></think>")
    assert not has_think_answer_format("reasoning</think><answer> </answer>")
    assert not has_think_answer_format("reasoning</think>42")


def test_invalid_construction():
    with pytest.raises(ValueError, match="max_workers"):
        RewardScorer(RewardSettings(), max_workers=0)
    with pytest.raises(ValueError, match="verifier_timeout_s"):
        RewardScorer(RewardSettings(verifier_timeout_s=0), max_workers=1)
