"""Learners: DeepSpeed ranks in Ray actors, and the driver's handle on them.

actor.py              `LearnerActor`: one rank's train step (loss, ZeRO), checkpoint, weight send
group.py              `LearnerGroup` (driver handle): splits a batch over ranks, gathers step results
deepspeed_setup.py    DeepSpeed configs and engine construction
sequence_parallel.py  Ulysses sequence parallelism: sharding a packed batch over ranks
reference.py          `ReferencePolicy`: the KL penalty's frozen policy, partitioned under ZeRO-3
logprobs.py           token log-probabilities and entropies of packed rows: chunked, with its own backward (pure)
"""
