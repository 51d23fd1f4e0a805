"""Every registered weight transport satisfies the declared interface (`weights.transport`): the constants
both ends read, and the trainer calls of its shape (broadcast or staged) with the parameters the learner and
the driver pass."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest

from open_instruct.weights import transport as transports


def _members(protocol) -> dict[str, object]:
    names = set(getattr(protocol, "__annotations__", {}))
    for klass in protocol.__mro__:
        if klass is object or klass.__name__ in ("Protocol", "Generic"):
            continue
        names |= set(getattr(klass, "__annotations__", {}))
        names |= {n for n, v in vars(klass).items() if callable(v) and not n.startswith("_")}
    return {name: getattr(protocol, name, None) for name in sorted(names)}


@pytest.mark.parametrize("backend", transports.TRANSPORTS)
def test_each_transport_module_implements_its_protocol(backend):
    module = transports.transport(backend)
    protocol = transports.StagedTransport if module.STAGED else transports.BroadcastTransport
    for name, declared in _members(protocol).items():
        assert hasattr(module, name), f"weights.{backend} lacks {name} ({protocol.__name__})"
        if callable(declared):  # the Protocol is the signature's one home: the same parameters and defaults
            wanted = {p.name: p.default for p in inspect.signature(declared).parameters.values() if p.name != "self"}
            given = {p.name: p.default for p in inspect.signature(getattr(module, name)).parameters.values()}
            assert list(given) == list(wanted), f"weights.{backend}.{name}{list(given)} does not take {list(wanted)}"
            defaults = {p: d for p, d in wanted.items() if d is not inspect.Parameter.empty}
            assert {p: given[p] for p in defaults} == defaults, f"weights.{backend}.{name}: defaults differ"
    assert backend == module.BACKEND
    engine_module, extension = module.WORKER_EXTENSION.rsplit(".", 1)
    assert engine_module == f"{module.__name__}_engine"
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    assert inspect.isclass(getattr(importlib.import_module(engine_module), extension))
    assert module.ENGINE_BACKEND in WeightTransferEngineFactory._registry  # registered by the import
    for flag in ("HOLDS_PORT", "STAGED", "EVERY_RANK_STAGES", "KEEPS_REFERENCES", "RECEIVE_CAN_HANG"):
        assert isinstance(getattr(module, flag), bool), f"weights.{backend}.{flag}"
    assert isinstance(module.ENGINE_ENV, dict)
    info = module.worker_init_info("10.0.0.1", 1234, 5, 60.0, rank_offset=3)
    assert isinstance(info, dict)
    if not module.STAGED:  # one group: rank 0 sends, each engine's ranks start at its offset
        assert not module.EVERY_RANK_STAGES and not module.KEEPS_REFERENCES
        assert info["rank_offset"] == 3 and info["world_size"] == 5
        assert module.update_info(["x"], ["bfloat16"], [[2]], 1024)["names"] == ["x"]
    else:  # no group, so no port to hold
        assert not module.HOLDS_PORT


def test_an_unknown_backend_is_named_with_the_choices():
    with pytest.raises(ValueError, match=r"unknown weight-transfer backend 'tcp': expected 'gloo' \(CPU\)"):
        transports.transport("tcp")


def test_the_driver_and_the_trainer_side_of_every_transport_import_no_vllm():
    """vLLM's import costs seconds of CPU; only engines need it (its worker imports the *_engine modules)."""
    trainer_sides = ", ".join(f"open_instruct.weights.{backend}" for backend in transports.TRANSPORTS)
    code = (
        f"import sys, open_instruct.weights.sync, open_instruct.orchestrator, {trainer_sides}\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'vllm'], sorted(sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
