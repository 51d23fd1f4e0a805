"""The engines' shared reload (`weight_reload`) on CPU, with vLLM's real layerwise-reload code on a toy model,
and the GPU engine (`RestoringNCCLWeightTransferEngine`) as far as it runs without CUDA: registered, built by
vLLM's factory, restoring the previous weights when an update fails."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

from open_instruct.weights import reload as weight_reload
from open_instruct.weights.reload import RestoringReload, finish_reload


class Pair(torch.nn.Module):
    """A layer with two weights: rebuilt only once both have arrived."""

    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(2, 3))
        self.w2 = torch.nn.Parameter(torch.randn(2, 3))


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = Pair(), Pair()

    def load_weights(self, weights):
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        params = dict(self.named_parameters())  # looked up per call: a reload swaps the Parameters
        for name, tensor in weights:
            param = params[name]
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)


def toy_in_reload():
    """A toy model as vLLM's worker holds it during an update: metadata recorded, layers on meta."""
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload, record_metadata_for_reloading

    torch.manual_seed(0)
    model = Toy()
    old = {n: p.detach().clone() for n, p in model.named_parameters()}
    record_metadata_for_reloading(model)
    initialize_layerwise_reload(model)
    assert all(p.is_meta for p in model.parameters())
    return model, old


# Layer a complete, layer b half received when the update fails.
ARRIVED = [("a.w1", torch.ones(2, 3)), ("a.w2", torch.ones(2, 3)), ("b.w1", torch.full((2, 3), 5.0))]


def test_a_failed_update_keeps_the_old_weights_of_every_layer_it_did_not_complete():
    model, old = toy_in_reload()
    model.load_weights(ARRIVED)
    counts = finish_reload(model, None, failed=True)
    assert counts == {"updated": 1, "kept": 1, "discarded": 1}
    params = dict(model.named_parameters())
    assert not any(p.is_meta for p in params.values())
    assert torch.equal(params["a.w1"], torch.ones(2, 3)) and torch.equal(params["a.w2"], torch.ones(2, 3))
    assert torch.equal(params["b.w1"], old["b.w1"]) and torch.equal(params["b.w2"], old["b.w2"])

    # What finalizing as after a complete update would have done: half-new layer b, its other half whatever
    # the fresh allocation held. The discarding above is what keeps b coherent.
    model, old = toy_in_reload()
    model.load_weights(ARRIVED)
    finish_reload(model, None)
    assert torch.equal(dict(model.named_parameters())["b.w1"], torch.full((2, 3), 5.0))


class FailingEngine:
    """Stands in for a vLLM engine whose receive fails after one chunk has been loaded."""

    def __init__(self, model):
        self.model, self.model_config = model, None
        self.calls = []

    def update_weights(self, update_info):
        self.calls.append(update_info)
        self.model.load_weights(ARRIVED)
        raise ConnectionError("peer gone")

    def finish_weight_update(self):
        raise AssertionError("the mixin's finish must be used")


class RestoringFailingEngine(RestoringReload, FailingEngine):
    pass


def test_the_mixin_restores_before_re_raising_and_a_later_update_succeeds():
    model, old = toy_in_reload()
    engine = RestoringFailingEngine(model)
    with pytest.raises(ConnectionError, match="peer gone"):
        engine.update_weights({"chunk": 0})
    assert engine.calls == [{"chunk": 0}]  # the base engine's update ran
    params = dict(model.named_parameters())
    assert not any(p.is_meta for p in params.values()) and torch.equal(params["b.w2"], old["b.w2"])

    engine.start_weight_update()  # the next session starts from a clean reload state
    model.load_weights([(n, torch.full((2, 3), 7.0)) for n in ("a.w1", "a.w2", "b.w1", "b.w2")])
    engine.finish_weight_update()
    assert all(torch.equal(p, torch.full((2, 3), 7.0)) for p in model.parameters())


class RecordingQuant:
    def __init__(self):
        self.processed = 0

    def process_weights_after_loading(self, layer):
        self.processed += 1


class Head(torch.nn.Module):
    """Like vLLM's ParallelLMHead with tied embeddings: quant_method, tie_weights, no checkpoint weight."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight
        self.quant_method = RecordingQuant()

    def tie_weights(self, other):
        return self


class TiedToy(Toy):
    def __init__(self):
        super().__init__()
        self.head = Head(self.a.w1)


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_tied_head_is_re_processed_without_vllms_failed_to_load_warning():
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload, record_metadata_for_reloading

    model = TiedToy()
    record_metadata_for_reloading(model)
    initialize_layerwise_reload(model)
    model.load_weights(ARRIVED[:2])  # layer a; nothing for the head (tied) nor for b (really missing)
    records = Records()
    log = logging.getLogger(weight_reload._LAYERWISE_LOGGER)
    log.addHandler(records)
    try:
        finish_reload(model, None)
    finally:
        log.removeHandler(records)
    assert model.head.quant_method.processed == 1
    assert records.messages == ["Pair: Failed to load weights"]  # the missing layer still warns; the head not


class FakeVllmConfig:
    def __init__(self):
        from vllm.config import ParallelConfig

        self.parallel_config = ParallelConfig()
        self.model_config = None


def test_the_nccl_engine_is_registered_and_restores_the_old_weights_when_an_update_fails():
    from vllm.config import WeightTransferConfig
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from open_instruct.weights import nccl, nccl_engine

    model, old = toy_in_reload()
    engine = WeightTransferEngineFactory.create_engine(
        WeightTransferConfig(backend=nccl.ENGINE_BACKEND), FakeVllmConfig(), torch.device("cpu"), model
    )
    assert isinstance(engine, nccl_engine.RestoringNCCLWeightTransferEngine)
    model.load_weights(ARRIVED)  # an earlier chunk of this update
    # No NCCL group here, so vLLM's receive raises: the restore path runs as after any NCCL failure.
    info = {"names": ["b.w2"], "dtype_names": ["float32"], "shapes": [[2, 3]]}
    with pytest.raises(RuntimeError, match="NCCL weight transfer not initialized"):
        engine.update_weights(info)
    params = dict(model.named_parameters())
    assert not any(p.is_meta for p in params.values())
    assert torch.equal(params["a.w1"], torch.ones(2, 3)) and torch.equal(params["b.w1"], old["b.w1"])


def test_gpu_engines_get_the_restoring_nccl_engine_imported_in_their_workers(model_path):
    from open_instruct.generation.engine_setup import engine_args, engine_settings
    from open_instruct.weights import nccl

    args = engine_args(engine_settings(model_path, max_model_len=128, weight_transfer_backend="nccl"))
    assert args.weight_transfer_config.backend == "nccl_restoring"
    assert args.worker_extension_cls == nccl.WORKER_EXTENSION
    gloo = engine_args(engine_settings(model_path, max_model_len=128, weight_transfer_backend="gloo"))
    assert gloo.weight_transfer_config.backend == "gloo"
    # A fresh process, as vLLM's worker: resolving the extension by name is what registers the engine.
    check = (
        "from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory as F\n"
        "from vllm.utils.import_utils import resolve_obj_by_qualname\n"
        "assert 'nccl_restoring' not in F._registry\n"
        f"resolve_obj_by_qualname({nccl.WORKER_EXTENSION!r})\n"
        "assert F._registry['nccl_restoring']().__name__ == 'RestoringNCCLWeightTransferEngine'\n"
    )
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
