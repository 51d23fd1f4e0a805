"""A DeepSpeed data-parallel learner rank (`LearnerActor`) and what it needs to know (`LearnerSettings`).

One training step: pi_old (from the first training forward when there is one mini-batch and no LoRA dropout,
else an eval-mode no-grad pass) and reference logprobs, then num_epochs x num_mini_batches optimizer steps;
weights go out to the engines through the transfer group. How DeepSpeed itself is built lives in deepspeed_setup.py.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from open_instruct.config.algorithm import AlgorithmConfig
from open_instruct.config.derived import resolve_dtype
from open_instruct.config.fields import groups_from_flags
from open_instruct.config.learner import LearnerConfig
from open_instruct.config.model import ModelConfig
from open_instruct.learner.deepspeed_setup import (
    UNIVERSAL_SUFFIX,
    deepspeed_config,
    init_distributed,
    initialize_engine,
    learner_threads,
    make_optimizer,
    make_universal,
    on_gpu,
    peak_memory_gib,
    usable_cores,
    zero3_loading,
)
from open_instruct.learner.policy_weights import PolicyWeights, policy_weights
from open_instruct.learner.rendezvous import HeldPort
from open_instruct.learner.weight_sender import WeightSender, weight_metadata
from open_instruct.messages import LearnerReady, LearnerStepResult, TrainBatch, WeightMetadata, WeightsSent

# ----------------------------------------------------------------------------- the learner actor

REFERENCE_DIR = "reference"  # the moved reference's safetensors, beside the learner state (save_state)

# The learner's --attn_implementation as transformers names it ("te" has no HF kernel; SDPA is its fallback).
HF_ATTENTION = {
    "torch": "sdpa",
    "te": "sdpa",
    "flash_2": "flash_attention_2",
    "flash_3": "flash_attention_3",
    "flash_4": "flash_attention_4",
}


@dataclass(frozen=True)
class LearnerSettings:
    """What a learner rank needs; crosses into the actor process. The flag groups it reads, as parsed (a flag
    keeps its name: `settings.learner.deepspeed_zpg` is --deepspeed_zpg), and what only the driver knows."""

    model_path: str
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    total_steps: int = 1  # optimizer steps in the run (scheduler_steps): the schedule's length
    seed: int = 1
    # pi_old from a separate no-grad pass even where the first training forward gives it (benchmarks, tests).
    separate_old_logprob_pass: bool = False
    param_persistence_threshold: int | None = None  # ZeRO-3: None keeps zero3.json's (tests: 0 partitions all)
    cpu_cores: tuple[int, ...] = ()  # CPU --single_gpu_mode: the cores left to this learner by its engine
    node_learners: int = 1  # learner ranks on this rank's node, which share its cores (set per rank at placement)

    @classmethod
    def from_config(cls, cfg, model_path: str) -> LearnerSettings:
        return cls(
            model_path,
            cfg.learner,
            cfg.algorithm,
            cfg.model,
            total_steps=scheduler_steps(cfg),
            seed=cfg.run.seed,
        )

    @property
    def warm_up_steps(self) -> int:
        """--warm_up_steps, else open-instruct's --warmup_ratio of the run's optimizer steps."""
        return self.learner.warm_up_steps or int(self.learner.warmup_ratio * self.total_steps)

    @cached_property  # read in every micro-batch of a train step
    def importance_ratio_cap(self) -> float:
        """The TIS cap: open-instruct's --use_rho_correction / --rho_clamp_upper_bound, or ours."""
        algorithm = self.algorithm
        if not algorithm.use_rho_correction:
            return 0.0
        if algorithm.rho_clamp_upper_bound != 2.0:
            return algorithm.rho_clamp_upper_bound
        return algorithm.truncated_importance_sampling_ratio_cap

    @cached_property  # read in every micro-batch of a train step
    def rho_bounds(self):
        """open-instruct's --rho_* bounds as a loss.RhoBounds, or None when none is set."""
        from open_instruct.loss import RhoBounds

        algorithm = self.algorithm
        bounds = RhoBounds(
            algorithm.rho_clamp_lower_bound,
            algorithm.rho_mask_lower_bound,
            algorithm.rho_mask_upper_bound,
            algorithm.rho_mask_sequence_level,
            algorithm.rho_mask_tv_divergence,
        )
        return None if bounds == RhoBounds() else bounds

    @property
    def attn_implementation(self) -> str | None:
        """--attn_implementation as transformers names it; None: its default."""
        return HF_ATTENTION.get(self.model.attn_implementation or "")

    @property
    def old_logprobs_from_training_pass(self) -> bool:
        """With one mini-batch, the first epoch's forward runs at pi_old itself: its detached logprobs are
        pi_old exactly (ratio 1), so the separate pass would only repeat that forward. Not when that forward
        drops out (`--lora_dropout`): pi_old would then carry one draw of dropout noise, and rho and the TIS
        weights would measure the noise instead of staleness; the eval-mode pass gives pi_old itself."""
        return (
            self.algorithm.num_mini_batches == 1 and not self.separate_old_logprob_pass and not self.weights.drops_out
        )

    @cached_property
    def weights(self) -> PolicyWeights:
        """What trains: the whole model, or with --use_peft an adapter on a frozen base; chosen once, here."""
        return policy_weights(self)

    @property
    def zero3(self) -> bool:
        return self.learner.deepspeed_stage == 3


def learner_settings(model_path: str, **values) -> LearnerSettings:
    """LearnerSettings from flag values by their names (`deepspeed_stage=3, beta=0.0`), each into its group, and
    LearnerSettings' own fields (`total_steps=4`); unnamed flags keep their defaults. For benchmarks and tests
    that start learners without a whole run's configuration."""
    groups = {"learner": LearnerConfig, "algorithm": AlgorithmConfig, "model": ModelConfig}
    built, rest = groups_from_flags(values, groups)
    return LearnerSettings(model_path, **built, **rest)


def scheduler_steps(cfg) -> int:
    """Optimizer steps in the whole run, the length of the learning-rate schedule: every training step takes
    num_epochs x num_mini_batches optimizer steps (open-instruct's count too)."""
    return max(1, cfg.num_training_steps * cfg.algorithm.num_epochs * cfg.algorithm.num_mini_batches)


def make_scheduler(optimizer, settings: LearnerSettings):
    """--lr_scheduler_type's schedule, built by transformers' `get_scheduler` from the name, as open-instruct
    builds it (same warm-up and length arguments), so every name it accepts means the same curve here.
    DeepSpeed steps it once per optimizer step."""
    from transformers import get_scheduler

    return get_scheduler(
        settings.learner.lr_scheduler_type,
        optimizer=optimizer,
        num_warmup_steps=settings.warm_up_steps,
        num_training_steps=settings.total_steps,
    )


def learner_deepspeed_config(s: LearnerSettings, world_size: int, dtype_name: str) -> dict:
    """What DeepSpeed is told for these settings, on `world_size` learner ranks."""
    return deepspeed_config(
        stage=s.learner.deepspeed_stage,
        micro_batch_size=s.learner.per_device_train_batch_size,
        max_grad_norm=s.learner.max_grad_norm,
        bf16=dtype_name == "bfloat16",
        fp16=dtype_name == "float16",
        world_size=world_size // s.learner.sequence_parallel_size,  # data-parallel ranks
        offload_param=s.learner.deepspeed_offload_param,
        offload_optimizer=s.learner.deepspeed_offload_optimizer,
        hpz_partition_size=s.learner.deepspeed_zpg,
        load_universal=s.learner.deepspeed_checkpoint_load_universal,
        param_persistence_threshold=s.param_persistence_threshold,
    )


class LearnerActor:
    """One DeepSpeed data-parallel rank. Ray is applied in `cluster.py`."""

    def __init__(self, rank: int, world_size: int, settings: LearnerSettings):
        self.rank, self.world_size = rank, world_size
        self.settings = settings
        self.engine = None
        self.reference = None
        self.weights = settings.weights
        self.version = 0
        self.sender = WeightSender(rank, settings.learner.gather_whole_model)
        self.held_port = HeldPort()

    def rendezvous_address(self, hold: bool = True) -> tuple[str, int]:
        """This node's address and a port free on it (called on rank 0), held open until a group's store adopts it;
        without `hold` released at once, for a group that binds the port itself."""
        import ray

        port = self.held_port.hold()
        if not hold:
            self.held_port.release()
        return ray.util.get_node_ip_address(), port

    def setup(self, master_addr: str, master_port: int) -> LearnerReady:
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(self.settings.seed)
        if not on_gpu() and self.settings.cpu_cores:  # a node shared with its engine (--single_gpu_mode)
            os.sched_setaffinity(0, self.settings.cpu_cores)
        # Ray starts a num_cpus=1 actor with OMP_NUM_THREADS=1, so torch would step an offloaded optimizer on
        # one core: set the count from the cores this rank may use instead.
        usable, pinned = usable_cores(), bool(self.settings.cpu_cores)
        torch.set_num_threads(learner_threads(on_gpu(), usable, self.settings.node_learners, self.world_size, pinned))
        timeout = self.settings.learner.backend_timeout
        listener = self.held_port.take(master_port)
        init_distributed(self.rank, self.world_size, master_addr, master_port, timeout, listener)
        dtype_name = resolve_dtype(self.settings.model.dtype, self.settings.model.model_dtype, on_gpu())
        dtype = getattr(torch, dtype_name)
        loading = {
            "dtype": dtype,
            **({"attn_implementation": self.settings.attn_implementation} if self.settings.attn_implementation else {}),
        }
        config = learner_deepspeed_config(self.settings, self.world_size, dtype_name)
        # Under ZeRO-3, while this object lives transformers builds each model inside deepspeed.zero.Init: every
        # rank materialises only its partition of each parameter, never a whole copy (CPU or GPU).
        partitioned_loading = zero3_loading(config, self.world_size)
        model = AutoModelForCausalLM.from_pretrained(self.settings.model_path, **loading)
        if self.settings.learner.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        model.config.use_cache = False  # packed rows need the per-document mask (see packing.py)
        model = self.weights.wrap(model)
        reference = self.weights.load_reference(
            lambda: AutoModelForCausalLM.from_pretrained(self.settings.model_path, **loading)
        )
        del partitioned_loading
        optimizer = make_optimizer(
            model,
            learning_rate=self.settings.learner.learning_rate,
            weight_decay=self.settings.learner.weight_decay,
            decay_bias_and_norm=not self.settings.learner.set_weight_decay_on_bias_and_norm,
            fused=self.settings.learner.fused_optimizer,
        )
        scheduler = make_scheduler(optimizer, self.settings)
        mpu = None
        if (
            self.settings.learner.sequence_parallel_size > 1
        ):  # after loading: the policy and the reference both go through it
            from open_instruct.learner import sequence_parallel

            mpu = sequence_parallel.register(
                model, model.config._attn_implementation, self.settings.learner.sequence_parallel_size
            )
        self.engine = initialize_engine(model, optimizer, config, lr_scheduler=scheduler, mpu=mpu)
        self.reference = self.weights.reference(self.engine, reference, config, mpu)
        cores = tuple(sorted(os.sched_getaffinity(0)))
        threads = torch.get_num_threads()
        return LearnerReady(self.rank, os.getpid(), self.engine.zero_optimization_stage(), cores, threads)

    @property
    def zero3(self) -> bool:
        return self.settings.zero3

    def synced_parameters(self) -> list[tuple[str, object]]:
        """What a weight sync sends, in order, named as the engines load it: every parameter (HF names), or with
        --use_peft the adapter's only, under peft's saved names (`policy_weights`)."""
        return self.weights.synced(self.engine.module)

    def parameter_storage(self) -> dict[str, int]:
        """Bytes of parameters this rank holds (its ZeRO-3 partitions, or whole tensors), against the whole
        models' bytes: how much of the model each rank keeps resident."""
        held, whole = 0, 0
        for model in (self.engine, self.reference):
            for param in model.parameters() if model is not None else ():
                partition = getattr(param, "ds_tensor", None)
                local = partition if partition is not None else param
                held += local.numel() * local.element_size()
                whole += getattr(param, "ds_numel", param.numel()) * param.element_size()
        return {"held_bytes": held, "whole_bytes": whole}

    # -------------------------------------------------------------- one training step

    def train_step(self, batch: TrainBatch) -> LearnerStepResult:
        """Old/ref logprobs, then num_epochs x num_mini_batches optimizer steps over this rank's rows."""
        from open_instruct.packing import collate, split_evenly

        started = time.monotonic()
        device = self.engine.device
        micro = [{k: v.to(device) for k, v in collate(rows).items()} for rows in batch.micro_batches]
        if self.settings.learner.sequence_parallel_size > 1:  # this rank's slice of every row (see sequence_parallel)
            from open_instruct.learner.sequence_parallel import shard

            size = self.settings.learner.sequence_parallel_size
            micro = [shard(mb, self.rank % size, size) for mb in micro]
        self._score_old_and_reference(micro, batch.temperature)
        self.engine.train()
        mini_batches = split_evenly(micro, self.settings.algorithm.num_mini_batches)
        totals: dict[str, float] = {}
        tokens_seen = 0.0
        for _ in range(self.settings.algorithm.num_epochs):
            for mini, global_tokens in zip(mini_batches, batch.mini_batch_tokens):
                tokens_seen += self._optimizer_step(mini, global_tokens, totals, batch.temperature)
        self.version += 1
        self._refresh_reference()
        metrics = {k: v / max(tokens_seen, 1.0) for k, v in totals.items()}
        metrics.update(
            {
                "learner/step_s": time.monotonic() - started,
                "learner/lr": float(self.engine.get_lr()[0]),
                "learner/trained_tokens": tokens_seen / self.settings.algorithm.num_epochs,
                "learner/grad_norm": float(self.engine.get_global_grad_norm() or 0.0),
                "learner/peak_memory_gib": peak_memory_gib(),
            }
        )
        return LearnerStepResult(self.rank, metrics)

    def _refresh_reference(self) -> None:
        """--ref_policy_update_freq N: every N steps the reference moves toward the policy (Polyak)."""
        freq, alpha = self.settings.algorithm.ref_policy_update_freq, self.settings.algorithm.alpha
        if self.reference is None or not freq or alpha <= 0 or self.version % freq:
            return
        self.reference.move_toward(self.engine.module, alpha)

    def reference_state_dict(self) -> dict:
        """The reference policy's weights on CPU, for tests; a collective under ZeRO-3, where rank 0 alone keeps
        them (the others get {})."""
        return self.reference.state_dict(keep=self.rank == 0 or not self.reference.partitioned)

    def _score_old_and_reference(self, micro: list[dict], temperature: float) -> None:
        """The trust region's anchor (pi_old) and, with a KL penalty, the reference policy, without grad.
        pi_old is left to the first training forward where that equals it (`old_logprobs_from_training_pass`)."""
        import torch

        with torch.no_grad():
            self.engine.eval()
            for mb in micro:
                if not self.settings.old_logprobs_from_training_pass:
                    self._set_old_logprobs(mb, token_logprobs(self.engine, mb, temperature))
                if self.reference is not None:
                    mb["ref_logprobs"] = token_logprobs(self.reference.model, mb, temperature)

    def _set_old_logprobs(self, mb: dict, learner_logprobs) -> None:
        mb["old_logprobs"] = learner_logprobs
        if self.settings.algorithm.use_vllm_logprobs:
            mb["old_logprobs"] = engine_logprobs_as_old(mb)

    def _optimizer_step(
        self, mini: list[dict], global_tokens: int, totals: dict[str, float], temperature: float
    ) -> float:
        """One mini-batch at the samples' `temperature`: accumulate its micro-batches' gradients, step; tokens out."""
        from open_instruct import loss as losses

        denominator = losses.step_denominator(
            self.settings.algorithm.constant_loss_denominator or max(1, global_tokens), world_size=self.world_size
        )
        tokens = 0.0
        for i, mb in enumerate(mini):
            self.engine.set_gradient_accumulation_boundary(i == len(mini) - 1)
            if self.settings.algorithm.record_entropy:
                new_logprobs, entropy = token_logprobs(self.engine, mb, temperature, with_entropy=True)
            else:
                new_logprobs, entropy = token_logprobs(self.engine, mb, temperature), None
            if "old_logprobs" not in mb:  # the first epoch's pass at pi_old; later epochs reuse these
                self._set_old_logprobs(mb, new_logprobs.detach())
            mask = mb["response_mask"].bool()
            importance = losses.importance_weights(
                mb["old_logprobs"],
                mb["behaviour_logprobs"],
                mask,
                self.settings.importance_ratio_cap,
                self.settings.algorithm.importance_sampling_mode,
                sample_ids_BT=_sample_ids(mb["doc_ids"]),
                bounds=self.settings.rho_bounds,
                advantages_BT=mb["advantages"],
            )
            kl = None
            if self.reference is not None:
                kl = losses.kl_per_token(
                    new_logprobs, mb["ref_logprobs"], self.settings.algorithm.kl_estimator_name, mb["old_logprobs"]
                )
            out = losses.policy_loss(
                new_logprobs,
                mb["old_logprobs"],
                mb["advantages"],
                importance.mask_BT,
                clip_lower=self.settings.algorithm.clip_lower,
                clip_higher=self.settings.algorithm.clip_higher,
                loss_denominator=denominator,
                importance_weights_BT=importance.weights_BT,
                kl_BT=kl,
                beta=self.settings.algorithm.beta,
                loss_fn=self.settings.algorithm.loss_fn,
            )
            self.engine.backward(out.loss)
            self.engine.step()
            n = float(out.num_tokens)
            tokens += n
            for key, value in _loss_stats(out, importance).items():
                totals[key] = totals.get(key, 0.0) + value * n
            if entropy is not None:  # a token sum: the step's metrics divide every total by its tokens
                totals["policy/entropy_avg"] = totals.get("policy/entropy_avg", 0.0) + float(
                    entropy[importance.mask_BT].sum()
                )
        return tokens

    # -------------------------------------------------------------- weights out

    def policy_version(self) -> int:
        return self.version

    def weight_metadata(self, dtype_name: str) -> WeightMetadata:
        return weight_metadata(self.synced_parameters(), dtype_name, self.checkpoint_names)

    @cached_property
    def checkpoint_names(self):
        """A model that transformers converted at load (its MoE experts stacked) syncs under its checkpoint's
        names, as it is saved; None for the others and for an adapter (`weights.checkpoint_names`)."""
        return self.weights.checkpoint_names(self.engine.module)

    def open_weight_transport(self, backend: str, host: str, port: int, world_size: int, timeout_s: float) -> int:
        return self.sender.open(backend, host, port, world_size, timeout_s, self.held_port.take(port))

    def send_weights(self, metadata: WeightMetadata, bucket_bytes: int, version: int, timeout_s: float) -> WeightsSent:
        named = self.synced_parameters()
        return self.sender.send(
            named, self.zero3, metadata, bucket_bytes, version, timeout_s, checkpoint_names=self.checkpoint_names
        )

    def release_weights(self) -> None:
        self.sender.release()

    def full_state_dict(self) -> dict:
        """HF-named CPU tensors of the current weights in the model's dtype (with --use_peft peft's parameter
        names).

        Under ZeRO-3 a collective (call it on every rank at once): parameters are gathered one at a time and
        rank 0 alone keeps its copies (the others get {}), so no GPU ever holds a whole model.
        """
        from open_instruct.learner.gathered import gathered_state

        named = list(self.engine.module.named_parameters())
        return gathered_state(named, self.zero3, self.rank == 0 or not self.zero3)

    # -------------------------------------------------------------- checkpoints (call on every rank)

    def save_model(self, path: str) -> str | None:
        """HF-format weights (safetensors + config) that transformers and vLLM load, or with --use_peft the adapter
        in peft's format (and on request base + adapter merged: `AdapterWeights.save`); rank 0 writes."""
        self.weights.save(self.engine.module, path, self.rank)
        return path if self.rank == 0 else None

    def save_state(self, directory: str) -> None:
        """Model, optimizer, scheduler (DeepSpeed checkpoint) and this rank's RNG states."""
        import random

        import numpy as np
        import torch
        from deepspeed.checkpoint.constants import (
            UNIVERSAL_CHECKPOINT_INFO,
            UNIVERSAL_CHECKPOINT_VERSION_KEY,
            UNIVERSAL_CHECKPOINT_VERSION_VALUE,
        )

        # ds_to_universal refuses a checkpoint without this entry; no tensor parallelism, so nothing else.
        universal = {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE}
        client_state = {"version": self.version, UNIVERSAL_CHECKPOINT_INFO: universal}
        self.engine.save_checkpoint(
            directory,
            tag="learner",
            client_state=client_state,
            exclude_frozen_parameters=self.weights.exclude_frozen_parameters,
        )
        rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        if on_gpu():
            rng["cuda"] = torch.cuda.get_rng_state()
        torch.save(rng, Path(directory) / f"rng_rank{self.rank}.pt")
        if self.reference is not None and self.settings.algorithm.ref_policy_update_freq:
            # It moved: keep it. A collective under ZeRO-3 (one parameter at a time); rank 0 writes.
            self.reference.save(str(Path(directory) / REFERENCE_DIR), write=self.rank == 0)

    def load_state(self, directory: str) -> int:
        """Restore what `save_state` wrote; returns the restored policy version. With --deepspeed_checkpoint_
        load_universal from its universal copy (rank 0 builds it once), so the state may come from a run with
        a different number of ranks; a rank that had no counterpart there keeps its seeded RNG."""
        import random

        import numpy as np
        import torch

        tag = "learner"
        if self.settings.learner.deepspeed_checkpoint_load_universal:
            if self.rank == 0:
                make_universal(directory, tag)
            torch.distributed.barrier()
            tag = "learner" + UNIVERSAL_SUFFIX
        _, client_state = self.engine.load_checkpoint(
            directory, tag=tag, load_module_strict=self.weights.load_module_strict
        )
        if client_state is None:
            raise FileNotFoundError(f"no learner checkpoint under {directory}")
        rng_file = Path(directory) / f"rng_rank{self.rank}.pt"
        if rng_file.exists() or not self.settings.learner.deepspeed_checkpoint_load_universal:
            rng = torch.load(rng_file, weights_only=False)
            random.setstate(rng["python"])
            np.random.set_state(rng["numpy"])
            torch.set_rng_state(rng["torch"])
            if on_gpu() and "cuda" in rng:
                torch.cuda.set_rng_state(rng["cuda"])
        self.version = int(client_state["version"])
        reference = Path(directory) / REFERENCE_DIR
        if self.reference is not None and reference.is_dir():
            from open_instruct.learner.gathered import reader

            # Under ZeRO-3 rank 0 alone reads (memory-mapped, a tensor at a time) and the gathers hand it out.
            self.reference.load(reader(reference) if self.rank == 0 or not self.reference.partitioned else None)
        elif self.reference is not None and (Path(directory) / "reference.pt").exists():  # a checkpoint's older form
            reads = self.rank == 0 or not self.reference.partitioned
            state = torch.load(Path(directory) / "reference.pt", map_location="cpu", mmap=True) if reads else None
            self.reference.load(state.__getitem__ if state is not None else None)
        return self.version


def token_logprobs(model, mb: dict, temperature: float, with_entropy: bool = False):
    """Target-aligned logprobs of a micro-batch: whole rows, or under sequence parallelism this rank's window."""
    from open_instruct.learner import sequence_parallel
    from open_instruct.learner.logprobs import packed_token_logprobs

    if sequence_parallel.is_shard(mb):
        return sequence_parallel.window_logprobs(model, mb, temperature, with_entropy)
    return packed_token_logprobs(model, mb, temperature, with_entropy)


def _sample_ids(doc_ids_BT):
    """Batch-wide sample index per token (-1 on padding), from per-row document ids (0 = padding)."""
    import torch

    offsets = torch.cumsum(doc_ids_BT.max(dim=1).values, 0) - doc_ids_BT.max(dim=1).values
    return torch.where(doc_ids_BT > 0, doc_ids_BT - 1 + offsets[:, None], torch.full_like(doc_ids_BT, -1))


def engine_logprobs_as_old(mb: dict):
    """--use_vllm_logprobs: the trust region is anchored at the engines' sampling logprobs, where they exist.

    Tokens without one (tool output, NaN; padding) keep the learner's own. The importance ratio
    old / behaviour is then 1 on sampled tokens, so the correction is a no-op rather than an error
    (open-instruct refuses the combination with its rho correction)."""
    import torch

    behaviour = mb["behaviour_logprobs"]
    use = mb["response_mask"].bool() & ~torch.isnan(behaviour)
    return torch.where(use, behaviour.to(mb["old_logprobs"].dtype), mb["old_logprobs"])


def _loss_stats(out, importance) -> dict[str, float]:
    return {
        "loss/policy_avg": float(out.policy_loss_avg),
        "objective/kl_avg": float(out.kl_avg),
        "policy/clipfrac_avg": float(out.clipfrac),
        "policy/ratio_avg": float(out.ratio_avg),
        "policy/approx_kl_avg": float(out.approx_kl),
        "offpolicy/rho_mean": float(importance.stats["rho_mean"]),
        "offpolicy/rho_max": float(importance.stats["rho_max"]),
        "offpolicy/rho_sq_mean": float(importance.stats["rho_sq_mean"]),
        "offpolicy/truncated_frac": float(importance.stats["truncated_frac"]),
    }
