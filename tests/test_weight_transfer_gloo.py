"""gloo weight-transfer backend: wire-format unit tests (fast) + the in-flight update prototype (slow)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from open_instruct import weight_transfer_gloo as wt

REPO = Path(__file__).resolve().parents[1]


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


@pytest.mark.slow
def test_inflight_update_keeps_kv(tmp_path):
    out = tmp_path / "wsync.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "prototype_weight_sync.py"),
            "--json",
            str(out),
            "--port",
            "29591",
        ],
        check=False,
        cwd=REPO,
        env={**os.environ, "VLLM_WORKER_MULTIPROC_METHOD": "spawn"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["worker_registered"] == [True]
    assert res["mixed_len"] == 150 and res["switch_at"] >= 40
    assert res["mixed_versions"][0][0] == "0" and res["mixed_versions"][-1][0] == "1"
    for key in (
        "prefix_equals_A",
        "suffix_equals_hf_mixed",
        "suffix_differs_from_hf_recompute_B",
        "suffix_differs_from_fresh_B",
        "round2_equals_A",
    ):
        assert res[key], (key, res)
    assert res["ok"], res


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


def test_weight_transports_share_one_interface():
    from open_instruct import weight_sync

    for backend in weight_sync.TRANSPORTS:
        module = weight_sync.transport(backend)
        assert backend == module.BACKEND and isinstance(module.ENGINE_BACKEND, str)
        assert module.WORKER_EXTENSION.startswith(module.__name__)
        info = module.worker_init_info("10.0.0.1", 1234, 5, 60.0, rank_offset=3)
        assert isinstance(info, dict) and callable(module.trainer_init)
        if module.STAGED:  # no group: stage, engines load, release
            for call in ("trainer_stage", "merge_staged", "trainer_release"):
                assert callable(getattr(module, call)), (backend, call)
        else:
            assert not module.EVERY_RANK_STAGES and not module.KEEPS_REFERENCES
            assert info["rank_offset"] == 3 and info["world_size"] == 5
            assert callable(module.trainer_send_stream)
            assert module.update_info(["x"], ["bfloat16"], [[2]], 1024)["names"] == ["x"]
    with pytest.raises(ValueError, match="unknown weight-transfer backend 'tcp'"):
        weight_sync.transport("tcp")
