"""gloo weight-transfer backend: the wire format, the streamed send and which failure is reported. A failed send
in a real 3-process group is in tests/integration/test_gloo_transfer_processes.py, an in-flight update between
real processes in tests/integration/test_weight_sync.py."""

import pytest
import torch

from open_instruct.weights import gloo as wt


def test_bucket_layout_splits_and_aligns():
    dtypes = ["float32", "float32", "bfloat16", "float32"]
    shapes = [[10], [1000], [3, 3], [5000]]
    layout = wt.bucket_layout(dtypes, shapes, bucket_bytes=4096)
    seen = [i for _, items in layout for i, _, _ in items]
    assert seen == [0, 1, 2, 3]
    for total, items in layout:
        for _, off, nb in items:
            assert off % 64 == 0 and off + nb <= total
    # the 20000-byte tensor exceeds the bucket and travels alone
    assert [i for i, _, _ in layout[-1][1]] == [3]


def test_update_info_matches_sent_tensors():
    pairs = [("a.weight", torch.randn(4, 3, dtype=torch.float64)), ("b.idx", torch.arange(5))]
    info = wt.make_update_info(pairs, torch.float32, bucket_bytes=128)
    assert info["names"] == ["a.weight", "b.idx"]
    assert info["dtype_names"] == ["float32", "int64"]  # floats cast, integers kept
    assert info["shapes"] == [[4, 3], [5]]


class _RecordingGroup:
    def __init__(self):
        self.buffers = []

    def broadcast(self, buf, src):
        self.buffers.append(buf.clone())

        class _Done:
            def wait(self):
                return None

        return _Done()


def test_streamed_send_follows_the_bucket_plan_and_checks_the_metadata():
    pairs = [("a", torch.arange(6, dtype=torch.float32).view(2, 3)), ("b", torch.ones(40))]
    group = _RecordingGroup()
    sent = wt.trainer_send_stream(group, iter(pairs), ["float32", "float32"], [[2, 3], [40]], bucket_bytes=64)
    assert len(group.buffers) == 2 and sent == sum(b.numel() for b in group.buffers)
    assert torch.equal(group.buffers[0][:24].view(torch.float32), torch.arange(6, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"weight 1 \(b\) is float32\[40\] but the engines were told float32\[4\]"):
        wt.trainer_send_stream(_RecordingGroup(), iter(pairs), ["float32", "float32"], [[2, 3], [4]], 1 << 20)


def test_a_lost_connection_is_reported_only_when_nothing_else_failed():
    from open_instruct.weights.sync import root_cause

    closed = RuntimeError("Worker failed with error '[pair.cc:553] Connection closed by peer [127.0.0.1]:4515'")
    refused = ValueError("weight 0 (model.embed_tokens.weight) has shape (8, 4), the engines expect (1,)")
    died = RuntimeError("ActorDiedError: The actor died unexpectedly before finishing this task.")
    assert root_cause([("engine 0", closed), ("learner 0", refused)]) == ("learner 0", refused)
    assert root_cause([("learner 0", closed), ("engine 1", died), ("engine 0", closed)]) == ("engine 1", died)
    assert root_cause([("engine 0", closed), ("engine 1", closed)]) == ("engine 0", closed)
