"""Moving new learner weights into running engines (in-flight, KV cache kept).

sync.py       `WeightSync` (driver handle): pause → transfer → finish(version) → resume, failures named
transport.py  the `WeightTransport` Protocol, the registry of transports, shared wire-format checks
gloo.py       CPU transport: a gloo broadcast into vLLM's weight-transfer API
nccl.py       GPU transport: vLLM's NCCL engine, restoring the old weights on failure
shm.py        CPU transport for engines on the learner's node: one shared-memory file
ipc.py        GPU transport for engines on the learner's GPU: CUDA IPC handles
gloo_engine.py, nccl_engine.py, shm_engine.py, ipc_engine.py
              each transport's engine side: the vLLM weight-transfer engine its worker imports and
              registers (the modules above are the trainer side and import no vLLM, so the driver and
              the learners do not pay for vLLM's import)
reload.py     engine side: a failed update restores the previous weights
adapter_engine.py
              engine side, --use_peft: an update replaces the served LoRA adapter instead of the weights
adapter_names.py
              both sides, --use_peft: the served adapter's id and file, the names its tensors travel under
checkpoint_names.py
              learner side: a converted model's weights (transformers' stacked MoE experts) under its
              checkpoint's names and shapes, which the engines load
watchdog.py   learner side: a send that overruns the sync timeout aborts its group (else it is abandoned)
shm_sweep.py  removing shared-memory files left by killed runs
"""
