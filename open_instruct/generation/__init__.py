"""Generation: vLLM engines in Ray actors, the driver's handle on them, and recovery when one fails.

actor.py           `GenerationActor`: one AsyncLLM pulling prompts, streaming scored Completions back
engine_state.py    the state the actor and its two collaborators (the next two modules) share, declared once
sample_requests.py one sample as vLLM requests, continued from tokens it has (a dead engine's, a reprefill cut)
weight_receive.py  the engine's side of a weight sync: pause (KV kept, or cut for reprefill), receive, resume
agent_turns.py     a multi-turn sample (tools, environments): one engine request per turn
scoring.py         a finished sample's reward, computed in the actor off its event loop
engine_setup.py    vLLM engine arguments from the configuration, the step probe, the cores its process runs on
outputs.py         vLLM outputs -> Completions and progress reports (partial samples)
channels.py        the shared prompt and result channels
pool.py            `EnginePool` (driver handle): start, poll, pause/resume, a dead engine's samples resubmitted
replacement.py     a dead engine replaced in the background; it joins at the next weight sync (driver handle)
process_reaper.py  an engine's processes recorded at start, confirmed gone (killed by pid) before a replacement
faults.py          what recovery keeps: partial samples of dead engines, resubmission, hang detection
ledger.py          `DeliveryLedger`: every admitted sample delivered exactly once
"""
