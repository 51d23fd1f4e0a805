"""Driver-side handle on the learner ranks: the only code that waits on learner actors.

The training loop hands `LearnerGroup.train_step` the step's groups; the group turns them into
one `TrainBatch` per rank (advantages, filters, packing, an even split: `batching.assemble`),
runs every rank's step and reports one rank-averaged result. Checkpoints, weight metadata and
the full state dict go through it too. Collective calls (ZeRO-3 gathers, DeepSpeed
checkpoints) are issued on every rank at once, as they must be.

`start_*` methods return Ray object refs instead of waiting, for the weight sync, which must
run the learners' send concurrently with the engines' receive.
"""

from __future__ import annotations

import contextlib
import time

from open_instruct.batching import BatchSettings, assemble
from open_instruct.learner.deepspeed_setup import LEARNER_TIMEOUT_FLOOR_S
from open_instruct.loss import effective_sample_fraction
from open_instruct.messages import LearnerReady, LearnerStepResult, StepReport, WeightMetadata


class LearnerFailure(RuntimeError):
    """A learner rank's process died (killed, out of memory, node lost); names the rank."""


def rank_mean(results: list[LearnerStepResult]) -> dict[str, float]:
    """The ranks' metrics combined: the `learner/*` ones (time, lr, grad norm, per-rank tokens) averaged, the
    per-token statistics (loss, ratio, KL, entropy) weighted by each rank's trained tokens, so that they are
    the step's token means whatever the layout (sequence-parallel ranks see only part of each row)."""
    tokens = [r.metrics.get("learner/trained_tokens", 0.0) for r in results]
    total = sum(tokens)
    out = {}
    for key in results[0].metrics:
        values = [r.metrics[key] for r in results]
        if key.startswith("learner/") or total <= 0:
            out[key] = sum(values) / len(values)
        else:
            out[key] = sum(v * t for v, t in zip(values, tokens)) / total
    if "offpolicy/rho_sq_mean" in out:  # from the step's token means, not a mean of per-rank fractions
        out["offpolicy/ess_frac"] = effective_sample_fraction(out["offpolicy/rho_mean"], out["offpolicy/rho_sq_mean"])
    return out


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")


def model_bytes(model_path: str) -> int:
    """The size of a model's weights: its weight files' bytes where they are on disk (a local folder, or a hub
    name already in the hub's cache), else 2 bytes (bf16) per parameter estimated from its config."""
    from pathlib import Path

    folder = Path(model_path).expanduser()
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(model_path, local_files_only=True))
        except Exception:  # not cached (or not a hub name): the config's estimate
            return 2 * estimated_parameters(model_path)
    files = {f for pattern in WEIGHT_FILES for f in folder.glob(pattern)}
    total = sum(f.stat().st_size for f in files)
    return total or 2 * estimated_parameters(model_path)


def estimated_parameters(model_path: str) -> int:
    """A decoder's parameter count from its config (embeddings, attention, MLP or experts); 0 when it cannot
    be read."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path)
        config = getattr(config, "text_config", None) or config
        hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    except Exception:
        return 0
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None) or 1
    intermediate = getattr(config, "moe_intermediate_size", None) if experts > 1 else None
    intermediate = intermediate or getattr(config, "intermediate_size", 4 * hidden)
    return 2 * vocab * hidden + layers * (4 * hidden * hidden + 3 * hidden * intermediate * experts)


class LearnerGroup:
    def __init__(self, actors: list, batch_settings: BatchSettings, timeout_s: float = LEARNER_TIMEOUT_FLOOR_S):
        self.actors = actors  # in rank order
        self.batch_settings = batch_settings
        self.timeout_s = timeout_s  # setup, saves, resume: `learner_timeout_s` of the model's size

    def _all(self, method: str, *args, timeout_s: float | None = None) -> list:
        refs = [getattr(actor, method).remote(*args) for actor in self.actors]
        return self._wait(refs, method, timeout_s or self.timeout_s)

    def _wait(self, refs: list, what: str, timeout_s: float | None) -> list:
        """Every rank's reply; a rank whose process died is named (the others may still wait for it)."""
        import ray

        try:
            return ray.get(refs, timeout=timeout_s)
        except ray.exceptions.RayActorError as error:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            dead = []
            for rank, ref in enumerate(refs):
                if ref in ready:
                    try:
                        ray.get(ref, timeout=0)
                    except ray.exceptions.RayActorError:
                        dead.append(rank)
            ranks = ", ".join(map(str, dead)) or "?"
            raise LearnerFailure(f"learner rank {ranks} died during {what} ({type(error).__name__})") from error

    def setup(self) -> list[LearnerReady]:
        """Rendezvous all ranks at rank 0's node (the port is picked there) and build their engines."""
        return self._all("setup", *self.rendezvous_address())

    # -- training

    def train_step(self, groups, step: int) -> StepReport:
        """Assemble the groups into one batch per rank and train every rank on it (no timeout: a step
        takes as long as it takes; a dead rank raises)."""

        started = time.time()
        batches, stats = assemble(groups, step, self.batch_settings)
        # Under sequence parallelism each group of consecutive ranks shares its data-parallel rank's batch.
        per_batch = len(self.actors) // len(batches)
        refs = [a.train_step.remote(batches[r // per_batch]) for r, a in enumerate(self.actors)]
        results = self._wait(refs, f"train step {step}", None)
        metrics = {
            **rank_mean(results),
            "batch/groups_filtered_zero_std": float(stats.groups_filtered_zero_std),
            "batch/samples_masked": float(stats.samples_masked),
            "batch/packed_rows": float(stats.packed_rows),
            **stats.balance,
        }
        return StepReport(metrics, stats.trained_tokens, started, time.time())

    # -- weights out (see weight_sync.py)

    def rendezvous_address(self, hold: bool = True) -> tuple[str, int]:
        """Rank 0's node address and a port free on it, held open there until the group's store adopts it
        (`hold`; else released, for a group that binds the port itself)."""
        import ray

        return ray.get(self.actors[0].rendezvous_address.remote(hold), timeout=self.timeout_s)

    def policy_version(self) -> int:
        """How many steps the policy has taken (restored ones included): the version its weights are."""
        import ray

        return ray.get(self.actors[0].policy_version.remote(), timeout=self.timeout_s)

    def weight_metadata(self, dtype_name: str) -> WeightMetadata:
        import ray

        return ray.get(self.actors[0].weight_metadata.remote(dtype_name), timeout=self.timeout_s)

    def start_open_weight_transport(
        self, backend: str, host: str, port: int, world_size: int, timeout_s: float, every_rank: bool = False
    ) -> dict[str, object]:
        """Rank 0 (`every_rank`: each rank) opens the trainer end of the weight transport; refs by actor name
        (rank 0's blocks on the engines joining its group)."""
        actors = self.actors if every_rank else self.actors[:1]
        return {
            f"learner {r}": a.open_weight_transport.remote(backend, host, port, world_size, timeout_s)
            for r, a in enumerate(actors)
        }

    def start_send_weights(
        self, metadata: WeightMetadata, bucket_bytes: int, version: int, timeout_s: float
    ) -> dict[str, object]:
        """Every rank walks its parameters (ZeRO-3 gathers), rank 0 broadcasts, each within `timeout_s`;
        refs by actor name."""
        return {
            f"learner {r}": a.send_weights.remote(metadata, bucket_bytes, version, timeout_s)
            for r, a in enumerate(self.actors)
        }

    def start_release_weights(self) -> dict[str, object]:
        """A staged sync is over: every rank frees what it staged; refs by actor name."""
        return {f"learner {r}": a.release_weights.remote() for r, a in enumerate(self.actors)}

    # -- checkpoints (collectives: every rank at once)

    def full_state_dict(self) -> dict:
        return self._all("full_state_dict")[0]

    def save_model(self, path: str) -> None:
        self._all("save_model", path)

    def save_state(self, directory: str) -> None:
        self._all("save_state", directory)

    def load_state(self, directory: str) -> int:
        versions = self._all("load_state", directory)
        if len(set(versions)) != 1:
            raise RuntimeError(f"learner ranks restored different versions: {versions}")
        return versions[0]

    def kill(self) -> None:
        import ray

        for actor in self.actors:
            with contextlib.suppress(Exception):  # already gone with its node
                ray.kill(actor)
