"""Hub datasets without a network: a local `datasets` builder writes rows into a `datasets` cache under the hub
name, as a download would, and `datasets.load_dataset(name, split=...)` reads them back offline.

So a test goes through the trainer's hub code path (`data.sources.HubSource`) with the splits a hub dataset
really has: asking one it lacks fails inside `datasets`, as it does on a cluster. `offline_hub` points this
process there (what HF_HUB_OFFLINE=1 and HF_DATASETS_CACHE do for a new one: `hub_env`).
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets


class _RowsBuilder(datasets.GeneratorBasedBuilder):
    """One split per entry of `splits`, each holding its rows; column types are inferred as a download's are."""

    def __init__(self, splits: dict[str, list[dict]], **kwargs):
        self.splits = splits
        super().__init__(**kwargs)

    def _info(self) -> datasets.DatasetInfo:
        return datasets.DatasetInfo()

    def _split_generators(self, dl_manager):
        return [datasets.SplitGenerator(name=split, gen_kwargs={"rows": rows}) for split, rows in self.splits.items()]

    def _generate_examples(self, rows):
        yield from enumerate(rows)


def cache_hub_dataset(cache: Path, name: str, splits: dict[str, list[dict]]) -> None:
    """Write `name` (OWNER/NAME) with exactly these splits into the `datasets` cache at `cache`."""
    builder = _RowsBuilder(splits, cache_dir=str(cache), repo_id=name, dataset_name=name.split("/")[-1], hash="local")
    builder.download_and_prepare()


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def hub_env(cache: Path) -> dict[str, str]:
    """The environment of a process that reads hub datasets from `cache` only."""
    return {"HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(cache)}


def offline_hub(monkeypatch, cache: Path) -> None:
    """This process reads hub datasets from `cache` only: `datasets` read both settings when it was imported."""
    for name, value in hub_env(cache).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
