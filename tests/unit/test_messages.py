"""messages: the typed records that cross process boundaries; here, the one place a Completion is made from
its request (`Completion.of_request`), which the engine's three delivery paths share, and a packed row's way
through pickle (out of band, as Ray ships a learner's batch).
Run: `.venv/bin/pytest tests/unit/test_messages.py` (under a second).
"""

from __future__ import annotations

import dataclasses
import pickle

import torch

from open_instruct.messages import Completion, PromptRequest, SamplingSettings, VersionSpan
from open_instruct.packing import ROW_TENSOR_FIELDS, PackItem, pack


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


def test_a_packed_row_pickles_out_of_band_and_comes_back_exact_and_writable():
    items = [
        PackItem((1, 2), (3, 4, 5), (-0.5, -0.25, -1.0), 0.5, None, 3, "a/0"),
        PackItem((7,), (8, 9), (-2.0, -0.125), -1.0, (0, 1), 1, "b/1"),
    ]
    (row,) = pack(items, 16, pad_token_id=0)
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(row, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == len(ROW_TENSOR_FIELDS) and len(stream) < 1000  # the tensors travel out of band
    # As Ray maps them from its object store: read-only. The rebuilt row owns writable copies.
    back = pickle.loads(stream, buffers=[b.raw().toreadonly() for b in buffers])
    for name in ROW_TENSOR_FIELDS:
        sent, received = getattr(row, name), getattr(back, name)
        assert received.dtype == sent.dtype and torch.equal(received, sent), name
        received.logical_not_() if received.dtype == torch.bool else received.add_(1)  # writable, and not the sender's
        assert not torch.equal(received, sent), name
    assert back.sample_ids == ("a/0", "b/1")
