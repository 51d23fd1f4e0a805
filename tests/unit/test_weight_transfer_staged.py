"""Staged weight transports (no process group): `shm` on a CPU node, `ipc` on a shared GPU.

The wire logic is pure enough to test here: what the learner writes, what an engine reads back, and
that nothing is left in shared memory. The real engines load from the file in
tests/integration/test_weight_sync.py (shared-memory test) and in the --single_gpu_mode run of
tests/nightly/test_single_gpu_mode_run.py.
"""

from __future__ import annotations

import os

import pytest
import torch

from open_instruct.weights import ipc, ipc_engine, shm, shm_engine

WEIGHTS = [
    ("model.embed_tokens.weight", torch.randn(7, 5)),
    ("model.norm.weight", torch.randn(5).to(torch.bfloat16)),
    ("model.layers.0.mlp.up_proj.weight", torch.randn(3, 5)),
]
NAMES = [n for n, _ in WEIGHTS]
DTYPES = [str(t.dtype).removeprefix("torch.") for _, t in WEIGHTS]
SHAPES = [list(t.shape) for _, t in WEIGHTS]


class RecordingModel:
    """Stands in for the vLLM model: keeps what `load_weights` was given."""

    def __init__(self):
        self.loaded: dict[str, torch.Tensor] = {}

    def load_weights(self, weights):
        self.loaded.update((name, tensor.clone()) for name, tensor in weights)


def engine_reading_into(model) -> shm_engine.SharedMemoryWeightTransferEngine:
    engine = object.__new__(shm_engine.SharedMemoryWeightTransferEngine)  # vLLM's constructor needs a whole worker
    engine.model = model
    return engine


def test_the_learner_stages_one_file_that_an_engine_reads_back_exactly(tmp_path):
    stager = shm.Stager(directory=str(tmp_path))
    info, staged = shm.trainer_stage(stager, iter(WEIGHTS), NAMES, DTYPES, SHAPES, tag="v1")
    path = info["path"]
    assert os.path.dirname(path) == str(tmp_path) and os.path.getsize(path) == staged == info["total_bytes"]
    assert staged >= sum(t.numel() * t.element_size() for _, t in WEIGHTS)

    model = RecordingModel()
    engine_reading_into(model).receive_weights(shm_engine.SharedMemoryUpdateInfo(**info))
    assert list(model.loaded) == NAMES
    for name, tensor in WEIGHTS:
        assert model.loaded[name].dtype == tensor.dtype and torch.equal(model.loaded[name], tensor)

    shm.trainer_release(stager)
    assert not os.path.exists(path) and stager.staged_path is None
    shm.trainer_release(stager)  # idempotent


def test_a_missed_release_is_made_up_by_the_next_stage(tmp_path):
    stager = shm.Stager(directory=str(tmp_path))
    first, _ = shm.trainer_stage(stager, iter(WEIGHTS), NAMES, DTYPES, SHAPES, tag="v1")
    second, _ = shm.trainer_stage(stager, iter(WEIGHTS), NAMES, DTYPES, SHAPES, tag="v2")
    assert not os.path.exists(first["path"]) and os.listdir(tmp_path) == [os.path.basename(second["path"])]
    shm.trainer_release(stager)
    assert os.listdir(tmp_path) == []


def test_a_weight_that_disagrees_with_the_metadata_is_refused_and_nothing_stays_behind(tmp_path):
    stager = shm.Stager(directory=str(tmp_path))
    wrong = [*SHAPES[:2], [5, 3]]
    with pytest.raises(ValueError, match=r"weight 2 \(model.layers.0.mlp.up_proj.weight\) is float32\[3, 5\] but"):
        shm.trainer_stage(stager, iter(WEIGHTS), NAMES, DTYPES, wrong)
    shm.trainer_release(stager)  # what the driver does after every staged sync, failed or not
    assert os.listdir(tmp_path) == []


def test_an_engine_on_another_machine_says_so():
    info = shm_engine.SharedMemoryUpdateInfo("/dev/shm/open_instruct-weights-gone", NAMES, DTYPES, SHAPES, 0)
    info.total_bytes = shm.layout(DTYPES, SHAPES)[0]
    with pytest.raises(FileNotFoundError, match=r"not on this engine's node.*--vllm_sync_backend gloo"):
        engine_reading_into(RecordingModel()).receive_weights(info)
    with pytest.raises(ValueError, match=r"the metadata describes .* bytes, the learner wrote 3"):
        engine_reading_into(RecordingModel()).receive_weights(
            shm_engine.SharedMemoryUpdateInfo("/nowhere", NAMES, DTYPES, SHAPES, 3)
        )


def test_the_default_directory_is_shared_memory_when_it_has_room():
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        assert shm._directory_for(1 << 20, None) == "/dev/shm"
    assert shm._directory_for(1 << 60, None) != "/dev/shm"  # an exabyte: the temp directory instead
    assert shm._directory_for(1, "/somewhere") == "/somewhere"


def test_engines_read_learner_rank_0s_file_only():
    assert shm.merge_staged([{"path": "a"}, None, None]) == {"path": "a"}
    with pytest.raises(ValueError, match="expected one staged file"):
        shm.merge_staged([None, None])


def unpickled_handles(info: dict) -> list:
    import base64
    import pickle

    return pickle.loads(base64.b64decode(info["ipc_handles_pickled"]))


def test_ipc_handles_of_every_rank_are_merged_by_gpu():
    part = {"names": ["w", "b"], "dtype_names": ["bfloat16"] * 2, "shapes": [[2], [1]]}
    rank0 = {**part, "ipc_handles": [{"GPU-0": ("w0",)}, {"GPU-0": ("b0",)}]}
    rank1 = {**part, "ipc_handles": [{"GPU-1": ("w1",)}, {"GPU-1": ("b1",)}]}
    merged = ipc.merge_staged([rank0, rank1])
    assert merged["names"] == ["w", "b"] and "ipc_handles" not in merged
    expected = [{"GPU-0": ("w0",), "GPU-1": ("w1",)}, {"GPU-0": ("b0",), "GPU-1": ("b1",)}]
    assert unpickled_handles(merged) == expected
    with pytest.raises(ValueError, match="learner rank 1 staged other weights"):
        ipc.merge_staged([rank0, {**rank1, "names": ["w", "x"]}])
    with pytest.raises(ValueError, match="no learner rank staged"):
        ipc.merge_staged([None])


def test_staged_engines_are_registered_with_vllm_under_their_names():
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    assert WeightTransferEngineFactory._registry[shm.ENGINE_BACKEND]() is shm_engine.SharedMemoryWeightTransferEngine
    assert WeightTransferEngineFactory._registry[ipc.ENGINE_BACKEND]() is ipc_engine.RestoringIPCWeightTransferEngine
    assert ipc.worker_init_info("h", 1, 2, 3.0) == {"packed": False}  # one handle per tensor, never reused


def test_files_of_dead_learners_are_removed_when_a_learner_opens_the_transport(tmp_path):
    import subprocess
    import sys

    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(finished.stdout)
    dead = tmp_path / f"{shm.FILE_PREFIX}{dead_pid}-v3-abcd1234"
    live = tmp_path / f"{shm.FILE_PREFIX}{os.getpid()}-v3-abcd1234"
    unrelated = tmp_path / "someone-elses-file"
    for path in (dead, live, unrelated):
        path.write_bytes(b"x")
    assert shm.remove_orphans(str(tmp_path)) == [str(dead)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, unrelated.name])


def test_merged_ipc_info_crosses_vllms_engine_channel_and_parses_in_its_worker(monkeypatch):
    """The CUDA-IPC receive needs a GPU; the payload's way does not. A handle holds torch types, which
    vLLM's msgpack channel (AsyncLLM -> engine core) refuses; pickled, it crosses, and vLLM's IPC update
    info unpickles it in the worker when the engine process has `ENGINE_ENV`."""
    from vllm import envs
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferInitInfo, IPCWeightTransferUpdateInfo
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    if hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()  # an engine built in this process would have frozen the variables
    handle = (torch.Tensor, (2,), (1,), 0, torch.UntypedStorage, torch.bfloat16, 0, b"cuda-ipc-handle", 4, 0)
    part = {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[2]], "ipc_handles": [{"GPU-0": handle}]}
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    with pytest.raises(TypeError, match="not serializable"):
        MsgpackEncoder().encode({"update_info": part})  # raw handles cannot cross
    merged = ipc.merge_staged([part])
    crossed = MsgpackDecoder().decode(MsgpackEncoder().encode({"update_info": merged}))["update_info"]
    with pytest.raises(ValueError, match="VLLM_ALLOW_INSECURE_SERIALIZATION"):
        IPCWeightTransferUpdateInfo(**crossed)
    monkeypatch.setenv(*next(iter(ipc.ENGINE_ENV.items())))
    parsed = IPCWeightTransferUpdateInfo(**crossed)
    assert parsed.names == ["w"] and parsed.ipc_handles == [{"GPU-0": handle}]
    assert not IPCWeightTransferInitInfo(**ipc.worker_init_info("h", 1, 2, 3.0)).packed
