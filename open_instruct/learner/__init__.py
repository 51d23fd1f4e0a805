"""Learners: DeepSpeed ranks in Ray actors, and the driver's handle on them.

actor.py              `LearnerActor`: one rank's train step (loss, ZeRO), weights out, checkpoint
policy_weights.py     what trains, chosen once: the whole model or (--use_peft) a LoRA adapter; wrap, reference,
                      synced parameters, saves, checkpoint flags
weight_sender.py      `WeightSender`: the learner's end of a weight sync (transport, watchdog, what is sent)
group.py              `LearnerGroup` (driver handle): splits a batch over ranks, gathers step results
deepspeed_setup.py    DeepSpeed configs and engine construction
rendezvous.py         `HeldPort`: the port rank 0's groups meet on, held open until their store adopts it
sequence_parallel.py  Ulysses sequence parallelism: sharding a packed batch over ranks
gathered.py           saves and the reference's checkpoint, one parameter gathered at a time, written by rank 0
reference.py          the KL penalty's reference: a frozen copy (ZeRO-3: partitioned), or the base, adapter off
logprobs.py           token log-probabilities and entropies of packed rows: chunked, with its own backward (pure)
"""
