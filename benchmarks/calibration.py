"""The simulator's cost model, fitted on measurements of the real stack (the e2e benchmark's measured.json).

Two sources for the engine's cost per step:
* batches (`fit_cost_model` by default): batches of heavy-tail samples, each run alone on the engine and timed
  whole, plus the queue path's extra time per sample measured beside a direct batch;
* the training runs' own steps (`steps_of_modes`): every engine step of the chosen modes' runs, as the engine
  actor saw it (`messages.EngineStep`), with the learner, the queues and the weight syncs around it. The steps
  of other modes than the one predicted make an out-of-sample check (the simulator's validation does that).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Collection, Sequence
from typing import Any

from benchmarks.simulated_engines import held_context_tokens
from benchmarks.simulated_world import CostModel
from open_instruct.messages import EngineStep

# One row per usable engine step: the seconds since the step before, and what the step computed.
STEP_COLUMNS = ("step_s", "generated_tokens", "kv_tokens", "prefill_tokens", "started_requests")


def step_rows(trace: Sequence[EngineStep]) -> list[list[float]]:
    """`STEP_COLUMNS` rows of the steps that followed the step before them straight away: the engine had work
    queued after it (so it stepped again at once) and no weight-sync pause came between them. A step's time is
    the engine's own (`EngineStep.engine_step_s`), or where no request decoded in both steps the time between
    the two arrivals, which the actor's other work on its core can stretch or squeeze."""
    rows = []
    for before, step in itertools.pairwise(trace):
        if before.queued_requests == 0 or before.pause_transitions != step.pause_transitions:
            continue
        rows.append(
            [
                round(step.engine_step_s or step.arrived_s - before.arrived_s, 6),
                step.generated_tokens,
                step.kv_tokens,
                step.prefill_tokens,
                step.started_requests,
            ]
        )
    return rows


def steps_of(measured: dict[str, Any], modes: Collection[str]) -> list[list[float]]:
    """The `STEP_COLUMNS` rows of `modes`' runs in `measured` ("engine_steps"), every round's."""
    return [row for run in measured.get("engine_steps", []) if run["mode"] in modes for row in run["steps"]]


def step_time_error(cost: CostModel, rows: list[list[float]]) -> float:
    """How far `cost` is off on these `STEP_COLUMNS` rows: their predicted time over their measured time, less 1."""
    measured = sum(row[0] for row in rows)
    predicted = sum(
        cost.step_s(generated, kv) + cost.start_s(prefill, started) for _, generated, kv, prefill, started in rows
    )
    return predicted / measured - 1 if measured else 0.0


def fit_cost_model(measured: dict[str, Any], steps_of_modes: Collection[str] | None = None) -> CostModel:
    """Least-squares cost model from measurements on a real (small) setup.

    Format (times in seconds):
        {"decode": [{"samples": [[20, 812], [20, 40], ...], "elapsed_s": 3.1}, ...],  # one engine
         "queue_overhead": [{"samples": 128, "queue_s": 1.1, "direct_s": 0.3}, ...],  # optional
         "engine_steps": [{"mode": "streaming", "round": 0, "steps": [[step_s, ...], ...]}, ...],  # optional
         "prefill_tokens_per_s": 20000.0,
         "learner": [{"tokens": 65536, "step_s": 4.2}, ...],  # tokens of the whole batch (all ranks)
         "weight_sync_pause_s": 1.5,
         "start_latency_s": 0.05,  # optional: from a prompt's admission to its start on an engine with room
         "max_running": 256,
         "kv_block_tokens": 128,  # optional (1): the KV cache's block, the unit a context is counted in
         "num_learners": 2}  # the data-parallel ranks the learner points were measured on

    Decode from batches (the default): each entry is one batch generated to its samples' exact lengths
    ([prompt tokens, response tokens] per sample). The engine runs it in max(lengths) steps, over which the
    running samples add up to sum(lengths) and their contexts to sum(prompt * length + length * (length - 1) / 2)
    (each context in whole KV blocks of kv_block_tokens, as the engine holds it and as the steps' KV usage counts
    it), so elapsed_s less the prompts' prefill is decode_base_s, decode_per_seq_s and decode_per_context_token_s
    times those three, fitted by least squares with every cost >= 0. Batches shaped like the workload (its tail
    included) tell the costs apart; batches of short equal samples would not see the context's. Those batches go
    to the engine directly; per_sample_s, what a sample's way through the prompt and result queues adds, is the
    median over "queue_overhead" of (queue_s - direct_s) / samples (0 without it).

    Decode from steps (`steps_of_modes`: the modes whose "engine_steps" to use): each `STEP_COLUMNS` row less its
    prefill is decode_base_s + decode_per_seq_s * generated_tokens + decode_per_context_token_s * kv_tokens +
    per_sample_s * started_requests, fitted the same way. The queue path's cost is inside those steps.

    Learner: step_s fitted as learner_base_s + learner_per_token_s * tokens / num_learners. With a single
    distinct x a line cannot be fitted and goes through the origin; a negative intercept is refitted through the
    origin, a negative slope becomes 0 (intercept = mean).
    """
    prefill_per_token_s = 1.0 / measured["prefill_tokens_per_s"] if measured.get("prefill_tokens_per_s") else 0.0
    block = int(measured.get("kv_block_tokens", 1))
    if steps_of_modes is None:
        base, per_seq, per_context, per_sample = _decode_from_batches(measured, prefill_per_token_s, block)
    else:
        base, per_seq, per_context, per_sample = _decode_from_steps(measured, steps_of_modes, prefill_per_token_s)
    learners = measured.get("num_learners", 1)
    learner = measured["learner"]
    l_base, l_per_token = fit_line([p["tokens"] / learners for p in learner], [p["step_s"] for p in learner])
    return CostModel(
        decode_base_s=base,
        decode_per_seq_s=per_seq,
        decode_per_context_token_s=per_context,
        per_sample_s=per_sample,
        prefill_per_token_s=prefill_per_token_s,
        max_running=int(measured["max_running"]),
        weight_sync_pause_s=float(measured["weight_sync_pause_s"]),
        start_latency_s=float(measured.get("start_latency_s", 0.0)),
        kv_block_tokens=block,
        learner_base_s=l_base,
        learner_per_token_s=l_per_token,
    )


def _decode_from_batches(measured: dict[str, Any], prefill_per_token_s: float, block: int) -> tuple[float, ...]:
    terms, elapsed = [], []
    for batch in measured["decode"]:
        prompts, lengths = zip(*batch["samples"])
        # at its k-th step a sample attends to prompt + k tokens, held in whole blocks
        context = sum(held_context_tokens(p, n, block) for p, n in batch["samples"])
        terms.append((max(lengths), sum(lengths), context))
        elapsed.append(batch["elapsed_s"] - sum(prompts) * prefill_per_token_s)
    base, per_seq, per_context = fit_nonnegative(terms, elapsed)
    overheads = [(o["queue_s"] - o["direct_s"]) / o["samples"] for o in measured.get("queue_overhead", [])]
    return base, per_seq, per_context, max(0.0, statistics.median(overheads)) if overheads else 0.0


def _decode_from_steps(
    measured: dict[str, Any], modes: Collection[str], prefill_per_token_s: float
) -> tuple[float, ...]:
    rows = steps_of(measured, modes)
    if not rows:
        raise ValueError(f"no engine steps of {sorted(modes)} in the measurements to fit on")
    terms = [(1.0, generated, kv, started) for _, generated, kv, _, started in rows]
    elapsed = [step_s - prefill * prefill_per_token_s for step_s, _, _, prefill, _ in rows]
    return fit_nonnegative(terms, elapsed)


def fit_nonnegative(xs: list[tuple[float, ...]], ys: list[float]) -> tuple[float, ...]:
    """Coefficients >= 0 minimizing the squared error of y = sum(c_i * x_i) (no intercept): the best
    least-squares fit over every subset of the terms whose coefficients all come out >= 0 (the others 0)."""
    import numpy as np

    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if x.ndim != 2 or len(x) != len(y) or not len(y):
        raise ValueError("need at least one point, each with the same terms, to fit")
    best, best_error = np.zeros(x.shape[1]), float(y @ y)
    for subset in itertools.chain.from_iterable(
        itertools.combinations(range(x.shape[1]), size) for size in range(1, x.shape[1] + 1)
    ):
        columns = list(subset)
        solution = np.linalg.lstsq(x[:, columns], y, rcond=None)[0]
        if (solution < 0).any():
            continue
        error = float(np.sum((y - x[:, columns] @ solution) ** 2))
        if error < best_error - 1e-15 * max(1.0, best_error):
            best, best_error = np.zeros(x.shape[1]), error
            best[columns] = solution
    return tuple(float(c) for c in best)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) by least squares."""
    if not xs or len(xs) != len(ys):
        raise ValueError("need at least one (x, y) point to fit")
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0, my / mx if mx else 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if slope < 0:
        return my, 0.0
    intercept = my - slope * mx
    if intercept < 0:
        return 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return intercept, slope
