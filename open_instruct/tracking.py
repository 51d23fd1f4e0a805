"""Run records: metrics.jsonl (always), Weights & Biases (--with_tracking), tqdm, summary and a PNG.

`MemoryLog` keeps what the loop reports in memory (simulations and tests); `RunLog` adds the files and
keeps its per-step and per-eval records on disk only (`JsonlRecords`), so a 100k-step run holds none of
them in memory; the summary and the plot read them back.

`metrics.jsonl` holds one JSON object per training step (its contract keys are `CONTRACT_KEYS` of
tests/integration/test_training_loop.py, checked on every step); evaluation rows are merged into the
step at which the round finished. On resume, lines past the resumed step are dropped so the file reads
as one run. wandb runs offline when no API key is configured, so tracking works on machines without
network (sync later with `wandb sync`).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)


def truncate_jsonl(path: Path, keep_through_step: int, key: str = "training_step") -> None:
    """Drop records of steps after `keep_through_step` (they are redone after a resume)."""
    if not path.exists():
        return
    kept = [
        line
        for line in path.read_text().splitlines()
        if line.strip() and json.loads(line).get(key, -1) <= keep_through_step
    ]
    path.write_text("".join(line + "\n" for line in kept))


class JsonlRecords(Sequence):
    """A list of records that lives in a JSON-lines file: `append` writes a line, reading parses the file
    again. Only records of steps from `first_step` on are seen (the steps this process logged, as an
    in-memory list would hold), though the file keeps the earlier ones of a resumed run."""

    def __init__(self, path: Path, key: str = "training_step"):
        self.path, self.key = path, key
        self.first_step = 0
        self._count = 0
        self._last: dict | None = None  # `[-1]` without a pass over the file

    def start(self, first_step: int) -> None:
        self.first_step, self._count, self._last = first_step, 0, None

    def append(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        self._count, self._last = self._count + 1, record

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[dict]:
        if not self.path.exists():
            return
        with open(self.path) as f:
            for line in f:
                record = json.loads(line) if line.strip() else None
                if record is not None and record.get(self.key, -1) >= self.first_step:
                    yield record

    def __reversed__(self) -> Iterator[dict]:
        return reversed(list(self))  # Sequence's default would read the file once per item

    def __getitem__(self, index):
        if isinstance(index, slice):
            return list(self)[index]
        index = range(self._count)[index]  # IndexError as a list's; negative indices count from the end
        if index == self._count - 1 and self._last is not None:
            return self._last
        return next(itertools.islice(iter(self), index, None))


class MetricWindow:
    """--logging_steps: step records gathered until `every` of them are in, then given out as one record.

    Numbers are averaged over the records that have them (an eval key lands in one step only); other
    values keep the newest. The record is stamped with the window's last step."""

    def __init__(self, every: int):
        self.every = every
        self.records: list[dict] = []

    def add(self, record: dict) -> dict | None:
        self.records.append(record)
        return self.flush() if len(self.records) >= self.every else None

    def flush(self) -> dict | None:
        if not self.records:
            return None
        merged: dict = {}
        sums: dict[str, list[float]] = {}
        for record in self.records:
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "training_step":
                    sums.setdefault(key, []).append(value)
                else:
                    merged[key] = value
        merged.update({key: sum(values) / len(values) for key, values in sums.items()})
        self.records = []
        return merged


class MemoryLog:
    """The run's records in memory: what the loop reports, with nothing written (simulations, tests)."""

    def __init__(self) -> None:
        self.history: list[dict] = []
        self.evals: list[dict] = []
        self.summary: dict = {}
        self.untrained: list[str] = []
        self.fates: dict[str, list[str]] = {}  # prompt ids by fate (trained, requeued, dropped, filtered, failed)

    def start(self, num_steps: int, start_step: int = 0) -> None:
        """Called once the loop knows where it starts (after a resume)."""

    def step(self, step: int, metrics: dict, trained_prompt_ids: list[str], fates: dict | None = None) -> dict:
        """`fates`: ids of prompts that left untrained this step, by fate (requeued, dropped, filtered, failed)."""
        record = self._record(step, metrics)
        for fate, ids in {"trained": trained_prompt_ids, **(fates or {})}.items():
            self.fates.setdefault(fate, []).extend(ids)
        return record

    def _record(self, step: int, metrics: dict) -> dict:
        record = {"training_step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self.history.append(record)
        return record

    def eval_round(self, step: int, metrics: dict, rows: list[dict]) -> dict:
        record = {"training_step": step, **metrics}
        self.evals.append(record)
        return record

    def finish(self, summary: dict, untrained_prompt_ids: list[str]) -> None:
        self.summary, self.untrained = summary, untrained_prompt_ids


class RunLog(MemoryLog):
    """MemoryLog plus files in --output_dir, wandb (--with_tracking) and a tqdm bar. `history` and `evals`
    are metrics.jsonl and eval.jsonl themselves: in memory they would grow with every step."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.out = Path(cfg.run.output_dir)
        self.metrics_path = self.out / "metrics.jsonl"
        self.trained_path = self.out / "trained_prompts.jsonl"
        self.history = JsonlRecords(self.metrics_path)  # type: ignore[assignment]
        self.evals = JsonlRecords(self.out / "eval.jsonl")  # type: ignore[assignment]
        self.wandb = self.bar = None
        self.window = MetricWindow(cfg.run.logging_steps)

    def start(self, num_steps: int, start_step: int = 0) -> None:
        from tqdm import tqdm

        self.out.mkdir(parents=True, exist_ok=True)
        if start_step > 0:
            truncate_jsonl(self.metrics_path, start_step - 1)
            truncate_jsonl(self.trained_path, start_step - 1, key="step")
            truncate_jsonl(self.out / "eval.jsonl", start_step - 1)
        else:
            for path in (
                self.metrics_path,
                self.trained_path,
                self.out / "eval_samples.jsonl",
                self.out / "eval.jsonl",
            ):
                path.unlink(missing_ok=True)
        self.history.start(start_step)
        self.evals.start(start_step)
        self.wandb = self._start_wandb() if self.cfg.tracking_enabled else None
        self.bar = tqdm(total=num_steps, initial=start_step, desc="training", unit="step", dynamic_ncols=True)

    def _start_wandb(self):
        import dataclasses

        import wandb

        if not os.environ.get("WANDB_API_KEY") and "WANDB_MODE" not in os.environ:
            os.environ["WANDB_MODE"] = "offline"  # no credentials: record locally instead of failing
        config = {
            group.name: dataclasses.asdict(getattr(self.cfg, group.name))
            for group in dataclasses.fields(self.cfg)
            if dataclasses.is_dataclass(getattr(self.cfg, group.name))
        }
        return wandb.init(
            project=self.cfg.run.wandb_project_name or self.cfg.run.wandb_project,
            entity=self.cfg.run.wandb_entity,
            group=self.cfg.run.wandb_group_name,
            name=self.cfg.run_name,
            config=config,
            dir=str(self.out),
            resume="allow",
        )

    def step(self, step: int, metrics: dict, trained_prompt_ids: list[str], fates: dict | None = None) -> dict:
        # The ids go to trained_prompts.jsonl, not into memory: a long run admits millions of prompts.
        record = self._record(step, metrics)  # appended to metrics.jsonl
        with open(self.trained_path, "a") as f:
            f.write(json.dumps({"step": step, "prompt_ids": trained_prompt_ids, **(fates or {})}) + "\n")
        window = self.window.add(record)
        if self.wandb is not None and window is not None:
            self.wandb.log(window, step=step)
        postfix = {
            "reward": f"{metrics.get('objective/verifiable_reward', 0.0):.2f}",
            "tok/s": f"{metrics.get('perf/generated_tokens_per_s', 0.0):.0f}",
        }
        if "eval/verifiable_reward" in metrics:
            postfix["eval"] = f"{metrics['eval/verifiable_reward']:.2f}"
        self.bar.set_postfix(postfix)
        self.bar.update(1)
        return record

    def eval_round(self, step: int, metrics: dict, rows: list[dict]) -> dict:
        """Every finished eval round: eval.jsonl (all rounds) and a few sample completions."""
        record = super().eval_round(step, metrics, rows)  # appended to eval.jsonl
        with open(self.out / "eval_samples.jsonl", "a") as f:
            for row in rows:
                f.write(json.dumps({"training_step": step, **row}) + "\n")
        if self.wandb is not None:
            import wandb

            table = wandb.Table(columns=list(rows[0]) if rows else ["prompt"], data=[list(r.values()) for r in rows])
            self.wandb.log({"eval/samples": table}, step=step)
        return record

    def finish(self, summary: dict, untrained_prompt_ids: list[str]) -> None:
        super().finish(summary, untrained_prompt_ids)
        if self.bar is not None:
            self.bar.close()
        (self.out / "untrained_prompts.json").write_text(json.dumps(untrained_prompt_ids))
        (self.out / "summary.json").write_text(json.dumps({k: _plain(v) for k, v in summary.items()}, indent=1))
        try:
            plot_run(self.history, self.out / "training.png")
        except Exception as error:  # a plot must never fail a finished run
            logger.warning("could not draw training.png: %s", error)
        if self.wandb is not None:
            window = self.window.flush()
            if window is not None:
                self.wandb.log(window, step=window["training_step"])
            self.wandb.summary.update({k: _plain(v) for k, v in summary.items()})
            self.wandb.finish()
        lines = [f"  {k}: {v:.4g}" if isinstance(v, float) else f"  {k}: {v}" for k, v in summary.items()]
        logger.info("run summary (also in %s):\n%s", self.out / "summary.json", "\n".join(lines))


def _plain(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def plot_run(history: Iterable[dict], path: Path) -> None:
    """Reward (train and eval) and utilization (engines busy, learner busy) over training steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # One pass, keeping only the plotted numbers: `history` may be a long run's metrics.jsonl.
    steps, rewards, busy, learner_busy, evals = [], [], [], [], []
    for h in history:
        steps.append(h["training_step"])
        rewards.append(h.get("objective/verifiable_reward", 0.0))
        busy.append(1.0 - h.get("time/generation_idle_frac", 0.0))
        learner_busy.append(1.0 - h.get("time/learner_wait_s", 0.0) / max(h.get("time/step_s", 1.0), 1e-9))
        if "eval/verifiable_reward" in h:
            evals.append((h["training_step"], h["eval/verifiable_reward"]))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot(steps, rewards, label="train reward (sampled)")
    if evals:
        top.plot(*zip(*evals), "o-", label="eval reward (greedy)")
    top.set_ylabel("verifiable reward")
    top.legend()
    bottom.plot(steps, busy, label="engines busy")
    bottom.plot(steps, learner_busy, label="learner busy")
    bottom.set_ylim(0, 1.05)
    bottom.set_ylabel("fraction of time")
    bottom.set_xlabel("training step")
    bottom.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
