"""A LoRA engine's adapter on disk: the folder it serves from (--lora_adapter_dir) is locked while its engine
lives and swept once that engine is killed; only the writing worker of an engine keeps the received adapter."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from open_instruct import adapters
from open_instruct.weights import adapter_names
from open_instruct.weights.adapter_engine import AdapterUpdate

HOLDER = """
import sys
from open_instruct import adapters
folder = adapters.AdapterFolder(sys.argv[1], 7)
print(folder.path, flush=True)
sys.stdin.read()  # held until killed
"""


def killed_engines_folder(root: Path) -> Path:
    """The folder of an engine process that was SIGKILLed (its shutdown never ran)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    path = Path(holder.stdout.readline().strip())
    assert adapters.sweep_folders(str(root), now=time.time() + 3600) == []  # held while the process lives
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    holder.stdin.close()
    holder.stdout.close()
    return path


def test_a_killed_engines_folder_is_swept_and_a_live_ones_is_kept(tmp_path):
    root = tmp_path / "adapters"  # --lora_adapter_dir: created when missing
    live = adapters.AdapterFolder(str(root), 0)
    assert Path(live.path).parent == root and Path(live.path).name.startswith(adapters.FOLDER_PREFIX)
    leftover = killed_engines_folder(root)
    (leftover / adapter_names.ADAPTER_FILE).write_bytes(b"x" * 1024)
    unrelated = root / "someone_elses"
    unrelated.mkdir()

    assert adapters.sweep_folders(str(root)) == []  # younger than the margin: maybe still being set up
    assert adapters.sweep_folders(str(root), now=time.time() + adapters.SWEEP_MARGIN_S) == [str(leftover)]
    assert not leftover.exists() and Path(live.path).is_dir() and unrelated.is_dir()
    live.close()
    assert not Path(live.path).exists()
    live.close()  # twice is harmless (shutdown after a failed start)


def test_a_folder_never_locked_is_swept_after_the_margin(tmp_path):
    old = tmp_path / f"{adapters.FOLDER_PREFIX}e0_abc"
    old.mkdir()
    assert adapters.sweep_folders(str(tmp_path), now=time.time() + adapters.SWEEP_MARGIN_S) == [str(old)]
    assert adapters.sweep_folders(str(tmp_path / "missing")) == []


def test_the_default_folder_is_the_temp_folder():
    folder = adapters.AdapterFolder(None, 3)
    try:
        assert Path(folder.path).parent == Path(tempfile.gettempdir())
    finally:
        folder.close()


def stream(update: AdapterUpdate, tensors: dict[str, torch.Tensor]) -> None:
    update.start()
    buffer = torch.empty(4)  # a transport reuses its receive buffer for the next bucket
    for name, value in tensors.items():
        buffer.copy_(value)
        update.load_weights([(name, buffer)])
    update.finish()


def test_only_the_writing_worker_keeps_the_adapter_and_every_worker_checks_it_arrived(tmp_path):
    from safetensors.torch import load_file

    tensors = {"a.lora_A.weight": torch.arange(4.0), "a.lora_B.weight": torch.ones(4)}
    writer, reader = AdapterUpdate(str(tmp_path), writes=True), AdapterUpdate(str(tmp_path), writes=False)
    received_by_reader = []
    original = reader.load_weights

    def watched(weights):
        names = original(weights)
        received_by_reader.append(dict(reader.received))
        return names

    reader.load_weights = watched
    stream(writer, tensors)
    stream(reader, tensors)
    assert all(not kept for kept in received_by_reader) and reader.tensors == 0  # nothing copied, reset after
    saved = load_file(str(tmp_path / adapter_names.ADAPTER_FILE))
    assert set(saved) == set(tensors) and all(torch.equal(saved[k], v) for k, v in tensors.items())
    for update in (writer, reader):
        update.start()
        with pytest.raises(ValueError, match="carried no tensors"):
            update.finish()
