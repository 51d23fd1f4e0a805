"""Stand-ins for Slurm's `srun` and `scontrol`, so a Slurm job's node bring-up (scripts/slurm.sh ->
scripts/node_launch.sh -> configs/beaker_configs/ray_node_setup.sh) runs with every "node" on this machine.

`srun [--opt=value ...] COMMAND...` starts COMMAND once per node (--nodes, else SLURM_NNODES), each in its own
session with Slurm's task variables (SLURM_PROCID, SLURM_NODEID, SLURM_LOCALID=0, SLURM_STEP_NUM_NODES,
SLURM_STEP_NODELIST) plus that task's entries of FAKE_SRUN_TASK_ENV (a JSON list, one object per task: what
differs between real machines, such as ports, when all "nodes" share one). Task i's output goes to
FAKE_SRUN_OUT/task<i>.log and srun's options to FAKE_SRUN_OUT/srun.json. It waits for every task and exits with
the largest status; with --kill-on-bad-exit=1 a failing task gets the others killed, as Slurm does.
`scontrol show hostnames LIST` expands a node list (`gpu[01-03,07],login`) one host a line.
"""

from __future__ import annotations

import sys
from pathlib import Path

FAKE_SRUN = f"""#!{sys.executable}
import json, os, signal, subprocess, sys
args, opts = sys.argv[1:], {{}}
while args and args[0].startswith("--"):
    key, _, value = args.pop(0)[2:].partition("=")
    opts[key] = value
out = os.environ["FAKE_SRUN_OUT"]
with open(os.path.join(out, "srun.json"), "w") as f:
    json.dump({{"options": opts, "command": args}}, f)
nodes = int(opts.get("nodes") or os.environ["SLURM_NNODES"])
extra = json.loads(os.environ.get("FAKE_SRUN_TASK_ENV", "[]"))
tasks = {{}}
for rank in range(nodes):
    env = dict(os.environ, SLURM_PROCID=str(rank), SLURM_NODEID=str(rank), SLURM_LOCALID="0",
               SLURM_STEP_NUM_NODES=str(nodes), SLURM_STEP_NODELIST=os.environ.get("SLURM_JOB_NODELIST", ""))
    env.update(extra[rank] if rank < len(extra) else {{}})
    log = open(os.path.join(out, f"task{{rank}}.log"), "w")
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    tasks[proc.pid] = proc
codes = {{}}
while len(codes) < len(tasks):
    pid, status = os.wait()
    if pid not in tasks:
        continue
    codes[pid] = os.waitstatus_to_exitcode(status)
    if codes[pid] != 0 and opts.get("kill-on-bad-exit") == "1":
        for other in tasks:
            if other not in codes:
                try:
                    os.killpg(other, signal.SIGKILL)
                except ProcessLookupError:
                    pass
sys.exit(max(abs(code) for code in codes.values()))
"""

FAKE_SCONTROL = f"""#!{sys.executable}
import re, sys
if sys.argv[1:3] != ["show", "hostnames"] or len(sys.argv) != 4:
    sys.exit("fake scontrol: only 'show hostnames LIST'")
for part in re.findall(r"[^,\\[]+(?:\\[[^\\]]*\\])?", sys.argv[3]):
    match = re.fullmatch(r"([^\\[]*)\\[([^\\]]*)\\]", part)
    if not match:
        print(part)
        continue
    for item in match.group(2).split(","):
        low, _, high = item.partition("-")
        for number in range(int(low), int(high or low) + 1):
            print(f"{{match.group(1)}}{{number:0{{len(low)}}d}}")
"""


def install(directory: Path) -> Path:
    """`srun` and `scontrol` stand-ins in `directory`; returns it (put it first on PATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (directory / name).write_text(text)
        (directory / name).chmod(0o755)
    return directory
