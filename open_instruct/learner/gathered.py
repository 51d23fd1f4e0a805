"""A learner's weights to disk and back one parameter at a time: the HF model save (merged with its LoRA
adapter on request), the reference's checkpoint and its resume.

Under ZeRO-3 every rank joins each parameter's gather in turn and only rank 0 copies it (to CPU, in the
model's dtype) and writes it at once into a safetensors file whose header was laid out beforehand from the
parameters' full shapes (`ds_shape`). No rank ever holds more than one gathered parameter, the bound of a
weight sync one parameter at a time, whatever the model's size; whole gathers would cost a model per GPU
(+60 GiB at 32B, +130 GiB at 70B). Reading back memory-maps the files and reads one tensor at a time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# A shard file's size. It bounds files, not memory: a shard is written tensor by tensor as they are gathered.
SHARD_BYTES = 5 << 30
SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"


def _safetensors_dtypes() -> dict:
    import torch

    return {
        torch.float64: "F64",
        torch.float32: "F32",
        torch.bfloat16: "BF16",
        torch.float16: "F16",
        torch.int64: "I64",
        torch.int32: "I32",
        torch.int16: "I16",
        torch.int8: "I8",
        torch.uint8: "U8",
        torch.bool: "BOOL",
    }


@dataclass(frozen=True)
class Entry:
    """One tensor of a save, as it will be written: its name, full shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: object  # torch.dtype

    @property
    def nbytes(self) -> int:
        import math

        return math.prod(self.shape) * self.dtype.itemsize


def full_shape(param) -> tuple[int, ...]:
    """A parameter's whole shape, also when ZeRO-3 holds only a partition of it."""
    return tuple(int(d) for d in getattr(param, "ds_shape", param.shape))


def gathered(named: list, partitioned: bool, keep: bool) -> Iterator[tuple[str, object]]:
    """(name, CPU copy in the parameter's dtype) per parameter, gathered one at a time under ZeRO-3 (a
    collective: every rank walks the whole sequence). Where `keep` is false the rank only joins the gathers
    and gets None."""
    return _gathered([(name, [p], p.detach) for name, p in named], partitioned, keep)


def gathered_state(named: list, partitioned: bool, keep: bool) -> dict:
    """`gathered` as a state dict: {name: CPU copy}, or {} on a rank whose `keep` is false."""
    return {name: t for name, t in gathered(named, partitioned, keep) if t is not None}


def _gathered(items: list, partitioned: bool, keep: bool) -> Iterator[tuple[str, object]]:
    """(name, CPU copy of value()) per (name, parameters, value) item, its parameters gathered together."""
    import deepspeed

    for name, params, value in items:
        with deepspeed.zero.GatheredParameters(params, enabled=partitioned):
            yield name, value().to("cpu", copy=True) if keep else None


def plan_shards(entries: list[Entry], shard_bytes: int = SHARD_BYTES) -> list[list[Entry]]:
    """Consecutive entries grouped into files of at most `shard_bytes` (a larger tensor gets a file alone)."""
    shards: list[list[Entry]] = []
    size = 0
    for entry in entries:
        if not shards or (size + entry.nbytes > shard_bytes and shards[-1]):
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += entry.nbytes
    return shards


def _header(shard: list[Entry]) -> bytes:
    names = _safetensors_dtypes()
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for entry in shard:
        header[entry.name] = {
            "dtype": names[entry.dtype],
            "shape": list(entry.shape),
            "data_offsets": [offset, offset + entry.nbytes],
        }
        offset += entry.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    return len(text).to_bytes(8, "little") + text


def write_safetensors(
    directory: str | Path, entries: list[Entry], tensors: Iterator, write: bool, shard_bytes: int = SHARD_BYTES
) -> list[str]:
    """Write `tensors` ((name, tensor or None) in the order of `entries`) as safetensors shards under `directory`:
    `model.safetensors`, or numbered shards and `model.safetensors.index.json` as transformers names them.
    Where `write` is false the sequence is only walked (the other ranks' half of the gathers). Returns the
    file names."""
    import torch

    shards = plan_shards(entries, shard_bytes)
    files = (
        [SAFE_WEIGHTS]
        if len(shards) == 1
        else [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    )
    directory = Path(directory)
    if write:
        directory.mkdir(parents=True, exist_ok=True)
    for file, shard in zip(files, shards):
        out = open(directory / file, "wb") if write else None  # noqa: SIM115 (closed below, after its tensors)
        try:
            if out is not None:
                out.write(_header(shard))
            for entry in shard:
                name, tensor = next(tensors)
                if out is None:
                    continue
                if name != entry.name or tuple(tensor.shape) != entry.shape or tensor.dtype != entry.dtype:
                    raise RuntimeError(
                        f"save: {name} {tuple(tensor.shape)} {tensor.dtype} where {entry.name} {entry.shape} "
                        f"{entry.dtype} was laid out"
                    )
                out.write(tensor.contiguous().view(-1).view(torch.uint8).numpy().data)
        finally:
            if out is not None:
                out.close()
    for _ in tensors:  # nothing left, but a generator's last gather closes only when it is exhausted
        pass
    if write and len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(e.nbytes for e in entries)},
            "weight_map": {entry.name: file for file, shard in zip(files, shards) for entry in shard},
        }
        (directory / SAFE_INDEX).write_text(json.dumps(index, indent=2))
    return files


def save_parameters(directory: str | Path, named: list, partitioned: bool, write: bool, shard_bytes: int = SHARD_BYTES):
    """`named` parameters under their own names (the reference's checkpoint), one at a time; rank 0 writes."""
    entries = [Entry(name, full_shape(p), p.dtype) for name, p in named]
    return write_safetensors(directory, entries, gathered(named, partitioned, write), write, shard_bytes)


def save_hf_model(
    model, directory: str | Path, partitioned: bool, write: bool, shard_bytes: int = SHARD_BYTES
) -> list[str]:
    """A transformers model as `save_pretrained` writes it (config, generation config, safetensors under the
    checkpoint's original names: transformers' reverse of its load-time conversions, applied per parameter),
    gathered one parameter at a time. Call on every rank at once under ZeRO-3; rank 0 (`write`) writes."""
    # A tied weight is one parameter, under its first name: saved once, as save_pretrained saves it.
    items = [(name, [p], p.detach, full_shape(p), p.dtype) for name, p in model.named_parameters()]
    return _save_items(model, items, directory, partitioned, write, shard_bytes)


def save_merged_lora(
    peft_model, directory: str | Path, partitioned: bool, write: bool, shard_bytes: int = SHARD_BYTES
) -> list[str]:
    """A peft LoRA model's base with its adapter merged in (W + scaling B A, peft's own `get_delta_weight`), as a
    plain transformers model in the base's dtype: each LoRA layer's base weight is gathered with its adapter,
    every other parameter alone, so no rank holds more than one layer's weights. Collective as `save_hf_model`."""
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    layers = {f"{name}.base_layer.weight": m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    items = []
    for name, param in base.named_parameters():
        if ".lora_" in name:  # the adapter's own: merged into its base weight below
            continue
        layer = layers.get(name)
        saved = name.replace(".base_layer.", ".")
        if layer is None:
            items.append((saved, [param], param.detach, full_shape(param), param.dtype))
            continue
        (adapter,) = layer.active_adapters  # one adapter: the policy's
        if adapter not in layer.lora_A:
            raise NotImplementedError(f"merging {type(layer).__name__} at {name}: only LoRA linear layers merge")
        pair = [layer.lora_A[adapter].weight, layer.lora_B[adapter].weight]

        def merged(param=param, layer=layer, adapter=adapter):
            return param.detach() + layer.get_delta_weight(adapter).to(param.dtype)

        items.append((saved, [param, *pair], merged, full_shape(param), param.dtype))
    return _save_items(base, items, directory, partitioned, write, shard_bytes)


def _save_items(model, items: list, directory, partitioned: bool, write: bool, shard_bytes: int) -> list[str]:
    import torch

    revert = _reverter(model)
    entries = []
    for name, _, _, shape, dtype in items:
        meta = torch.empty(shape, dtype=dtype, device="meta")
        entries += [Entry(n, tuple(t.shape), t.dtype) for n, t in revert(name, meta).items()]

    def converted() -> Iterator[tuple[str, object]]:
        gathering = [(name, params, value) for name, params, value, _, _ in items]
        for name, tensor in _gathered(gathering, partitioned, write):
            yield from revert(name, tensor).items()

    files = write_safetensors(directory, entries, converted(), write, shard_bytes)
    if write:
        floating = next((dtype for *_, dtype in items if dtype.is_floating_point), torch.float32)
        model.config.dtype = str(floating).removeprefix("torch.")
        model.config.architectures = [type(model).__name__]
        model.config.save_pretrained(directory)
        if model.can_generate() and model.generation_config is not None:
            model.generation_config.save_pretrained(directory)
    return files


def _reverter(model) -> Callable:
    """name, tensor -> {saved name: tensor}: transformers' reverse of the conversions it applied at load (fused
    MoE experts split back, renamings undone), one parameter at a time; a tensor of None keeps the names of
    the meta layout (the ranks that write nothing)."""
    from transformers.core_model_loading import revert_weight_conversion

    names: dict[str, list[str]] = {}

    def revert(name: str, tensor):
        if tensor is None:
            return dict.fromkeys(names[name])
        out = revert_weight_conversion(model, {name: tensor})
        names.setdefault(name, list(out))
        return out

    return revert


def reader(directory: str | Path) -> Callable[[str], object]:
    """name -> tensor from the safetensors files under `directory`, memory-mapped, one tensor read per call."""
    from safetensors import safe_open

    directory = Path(directory)
    index = directory / SAFE_INDEX
    if index.exists():
        where = {name: directory / file for name, file in json.loads(index.read_text())["weight_map"].items()}
    else:
        with safe_open(directory / SAFE_WEIGHTS, framework="pt") as f:
            where = dict.fromkeys(f.keys(), directory / SAFE_WEIGHTS)

    def read(name: str):
        if name not in where:
            raise KeyError(f"{name} is not in the checkpoint under {directory}")
        with safe_open(where[name], framework="pt") as f:
            return f.get_tensor(name)

    return read
