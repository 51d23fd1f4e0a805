"""Admission under the staleness bound and delivery accounting (pure logic, no Ray)."""

from __future__ import annotations

import pytest

from open_instruct.data.dataset import PromptRow
from open_instruct.generation.ledger import DeliveryError, DeliveryLedger
from open_instruct.messages import Completion, SamplingSettings
from open_instruct.prompt_feeder import FeederState, PromptFeeder, request_seed

SAMPLING = SamplingSettings(max_tokens=8)


def rows(count: int) -> list[PromptRow]:
    return [PromptRow("toy:train", i, (1, 2, i), ("x",), ("gsm8k",)) for i in range(count)]


def feeder(count=5, per_step=2, async_steps=1, state: FeederState | None = None) -> PromptFeeder:
    return PromptFeeder(
        rows(count),
        prompts_per_step=per_step,
        samples_per_prompt=3,
        async_steps=async_steps,
        sampling=SAMPLING,
        seed=7,
        state=state,
    )


def completion(prompt_id: str, j: int, reason="stop") -> Completion:
    return Completion(prompt_id, j, (1,), (2,), (-0.1,), reason, (), 0, 0)


def test_admissions_stop_at_the_staleness_bound_until_the_learner_steps():
    f = feeder(per_step=2, async_steps=1)
    assert len(f.admit(learner_version=0)) == 4  # (0 + 1 + 1) x 2
    assert f.admit(learner_version=0) == []
    assert len(f.admit(learner_version=1)) == 2
    assert f.state.admitted == 6


def test_synchronous_bound_admits_one_batch_per_version():
    f = feeder(per_step=2, async_steps=0)
    first = f.admit(0)
    assert len(first) == 2 and {r.admitted_version for r in first} == {0}
    assert f.admit(0) == []
    assert [r.admitted_version for r in f.admit(1)] == [1, 1]


def test_ids_are_unique_across_epochs_and_every_row_is_used_once_per_epoch():
    f = feeder(count=5, per_step=5, async_steps=0)
    epoch0 = f.admit(0)
    epoch1 = f.admit(1)
    ids = [r.prompt_id for r in epoch0 + epoch1]
    assert len(set(ids)) == 10
    assert {i.split("@")[0] for i in ids[:5]} == {f"toy:train:{i}" for i in range(5)}
    assert all(i.endswith("@0") for i in ids[:5]) and all(i.endswith("@1") for i in ids[5:])


def test_resuming_from_state_continues_the_same_sequence():
    straight = feeder(count=7, per_step=3, async_steps=0)
    ids = [r.prompt_id for v in range(4) for r in straight.admit(v)]
    first = feeder(count=7, per_step=3, async_steps=0)
    resumed_ids = [r.prompt_id for v in range(2) for r in first.admit(v)]
    second = feeder(count=7, per_step=3, async_steps=0, state=first.state)
    resumed_ids += [r.prompt_id for v in range(2, 4) for r in second.admit(v)]
    assert resumed_ids == ids


def test_request_seed_depends_on_prompt_not_order():
    assert request_seed(1, "a@0") == request_seed(1, "a@0")
    assert request_seed(1, "a@0") != request_seed(1, "a@1") != request_seed(2, "a@0")
    f = feeder()
    request = f.admit(0)[0]
    assert request.seed == request_seed(7, request.prompt_id) and request.num_samples == 3


def test_ledger_counts_and_names_missing_prompts():
    ledger = DeliveryLedger()
    f = feeder(per_step=2, async_steps=0)
    a, b = f.admit(0)
    ledger.admit(a)
    ledger.admit(b)
    ledger.started(a.prompt_id, engine_id=0)
    ledger.started(b.prompt_id, engine_id=1)
    assert [ledger.deliver(completion(a.prompt_id, j)) for j in range(3)] == [False, False, True]
    ledger.deliver(completion(b.prompt_id, 0, reason="error"))
    assert ledger.in_flight() == [b.prompt_id]
    assert ledger.in_flight(engine_id=0) == [] and ledger.in_flight(engine_id=1) == [b.prompt_id]
    assert ledger.counts() == {"admitted_prompts": 2, "expected_samples": 6, "delivered_samples": 4, "error_samples": 1}
    with pytest.raises(DeliveryError, match="4 of 6 samples delivered; 1 prompts incomplete"):
        ledger.check_complete()


def test_ledger_rejects_duplicates_and_strangers():
    ledger = DeliveryLedger()
    [a] = feeder(per_step=1, async_steps=0).admit(0)
    ledger.admit(a)
    ledger.deliver(completion(a.prompt_id, 0))
    with pytest.raises(DeliveryError, match="delivered twice"):
        ledger.deliver(completion(a.prompt_id, 0))
    with pytest.raises(DeliveryError, match="out of range"):
        ledger.deliver(completion(a.prompt_id, 3))
    with pytest.raises(DeliveryError, match="unknown prompt"):
        ledger.deliver(completion("nope@0", 0))
    with pytest.raises(DeliveryError, match="admitted twice"):
        ledger.admit(a)
