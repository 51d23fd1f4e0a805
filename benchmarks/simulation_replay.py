"""The prompts and response lengths of a measured run, replayed by the simulation (`simulation.simulate`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.workloads import ShapedWorkload


@dataclass(frozen=True, slots=True)
class SimPrompt:
    """What `PromptFeeder` reads from a `data.PromptRow`."""

    prompt_id: str
    prompt_token_ids: tuple[int, ...]
    ground_truths: tuple[Any, ...] = ()
    verifier_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Replay:
    """The prompts and response lengths of a measured run (`benchmarks.e2e` writes them into measured.json).
    A simulation of that run admits the same rows in the same order (the same --seed shuffles them) and gives
    each sample the length the real one had, so that a validation compares costs and schedules, not two draws
    of a heavy tail (the longest of a batch's 32 samples sets a synchronous step's time)."""

    seed: int  # the run's --seed
    prompts: tuple[tuple[str, int], ...]  # (row prompt id, prompt tokens) of every row, in the dataset's order
    lengths: ShapedWorkload  # its `length(sample id)` is the exact response length of each real sample

    @classmethod
    def of_rows(cls, seed: int, rows, lengths: ShapedWorkload) -> Replay:
        """The replay of a run of `rows` (data.PromptRow) under `seed`, whose samples `lengths` shaped."""
        return cls(seed, tuple((row.prompt_id, len(row.prompt_token_ids)) for row in rows), lengths)

    def as_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "prompts": [list(p) for p in self.prompts], "workload": asdict(self.lengths)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Replay:
        prompts = tuple((str(prompt_id), int(tokens)) for prompt_id, tokens in d["prompts"])
        return cls(int(d["seed"]), prompts, ShapedWorkload(**d["workload"]))

    def rows(self) -> list[SimPrompt]:
        return [SimPrompt(prompt_id, (0,) * tokens) for prompt_id, tokens in self.prompts]
