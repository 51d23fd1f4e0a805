"""messages: the typed records that cross process boundaries; here, the one place a Completion is made from
its request (`Completion.of_request`), which the engine's three delivery paths share.
Run: `.venv/bin/pytest tests/unit/test_messages.py` (under a second).
"""

from __future__ import annotations

import dataclasses

from open_instruct.messages import Completion, PromptRequest, SamplingSettings, VersionSpan


def request(**overrides) -> PromptRequest:
    sampling = SamplingSettings(max_tokens=8, temperature=0.6)
    made = PromptRequest("train:0:7", (5, 6, 7), ("3",), ("gsm8k",), sampling, 4, 11, 3, is_eval=True, queued_at=123.5)
    return dataclasses.replace(made, **overrides)


def test_a_completion_carries_its_requests_identity_admission_and_temperature():
    spans = (VersionSpan(3, 0, 2), VersionSpan(4, 2, 3))
    c = Completion.of_request(
        request(),
        2,
        9,
        response_token_ids=(1, 2, 3),
        behaviour_logprobs=(-0.1, -0.2, -0.3),
        finish_reason="stop",
        version_spans=spans,
        started_at=124.0,
    )
    assert (c.prompt_id, c.sample_index, c.engine_id, c.prompt_token_ids) == ("train:0:7", 2, 9, (5, 6, 7))
    assert (c.admitted_version, c.is_eval, c.queued_at, c.temperature) == (3, True, 123.5, 0.6)
    assert (c.response_token_ids, c.finish_reason, c.version_spans, c.started_at) == ((1, 2, 3), "stop", spans, 124.0)
    assert c.max_version == 4 and c.error is None


def test_a_completion_with_no_outcome_is_an_empty_error_sample():
    c = Completion.of_request(request(is_eval=False), 0, 1)
    assert (c.response_token_ids, c.behaviour_logprobs, c.version_spans, c.finish_reason) == ((), (), (), "error")
    assert c.token_spans == () and c.min_version == 3 and not c.is_eval
    aborted = Completion.of_request(request(), 1, 1, finish_reason="abort", error="aborted before generating")
    assert (aborted.finish_reason, aborted.error) == ("abort", "aborted before generating")
