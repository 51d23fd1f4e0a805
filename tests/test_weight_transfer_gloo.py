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
