"""HF-format model checkpoints and resumable run state.

Model checkpoints (`--save_freq`): `<output_dir>/checkpoints/step_<k>/` holds safetensors,
config and tokenizer, loadable by transformers and vLLM; only the newest
`--keep_last_n_checkpoints` are kept.

Run state (`--checkpoint_state_freq`, `--checkpoint_state_dir`): `step_<k>/learner/` is each
rank's DeepSpeed checkpoint (weights, optimizer, scheduler) plus RNG states; `driver.pkl` is
`DriverState`: the step, the policy version, the data position, the replay buffer's groups (complete
ones, and the delivered samples of incomplete ones), and the admitted prompts that were not trained
yet, each for its missing samples only, with the tokens those had when the run stopped (they continue
after the resume instead of starting over). `latest` names the newest complete state; it is written
last, so a kill during a save leaves the previous state in charge.

`driver.pkl` carries `DriverState.schema`; `load_driver_state` reads any older schema through one function,
`migrate`: classes that moved are found at their new place, fields added since get their defaults. A state
newer than this code is refused in one line (an old checkout cannot know what it would drop).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from open_instruct.errors import UserError
from open_instruct.messages import PromptRequest
from open_instruct.prompt_feeder import FeederState
from open_instruct.replay_buffer import BufferState

logger = logging.getLogger(__name__)

# 1: states written before the schema was recorded (the flat package layout); 2: the subpackage layout.
SCHEMA_VERSION = 2
# Where schema 1 kept the classes a driver state may hold, and where they live now.
_MOVED_MODULES = {"open_instruct.evolving_rubrics": "open_instruct.rewards.evolving_rubrics"}


@dataclass(frozen=True)
class DriverState:
    next_step: int  # the first step the resumed run trains
    version: int  # learner policy version after `next_step - 1` steps
    feeder: FeederState
    buffer: BufferState  # complete groups, and the samples incomplete ones have so far
    requeue: tuple[PromptRequest, ...]  # admitted, untrained, not complete: missing samples and their partials
    episodes: int  # samples trained so far
    outcomes: dict[str, int] = field(default_factory=dict)  # metrics.PromptOutcomes.totals()
    rubrics: tuple | None = None  # evolving rubrics: (queries -> QueryRubrics, row id -> ground truths)
    schema: int = SCHEMA_VERSION


class _MigratingUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        return super().find_class(_MOVED_MODULES.get(module, module), name)


def migrate(state: DriverState) -> DriverState:
    """Any stored `DriverState` as this code's schema: fields a state predates take their defaults (pickle
    restores the stored fields only), and `schema` becomes the current one."""
    stored = vars(state)
    schema = stored.get("schema", 1)
    if schema > SCHEMA_VERSION:
        raise UserError(
            f"the resumable state has schema {schema}, newer than this code's {SCHEMA_VERSION}: "
            "resume it with the version of open_instruct that wrote it"
        )
    known = {f.name for f in dataclasses.fields(DriverState)} - {"schema"}
    return DriverState(**{name: value for name, value in stored.items() if name in known}, schema=SCHEMA_VERSION)


def load_driver_state(path: Path) -> DriverState:
    with open(path, "rb") as f:
        return migrate(_MigratingUnpickler(f).load())


def _step_dirs(root: Path) -> list[Path]:
    return sorted((p for p in root.glob("step_*") if p.is_dir()), key=lambda p: int(p.name.split("_")[1]))


def save_model(learners, tokenizer, output_dir: str, step: int, keep_last_n: int) -> Path:
    """`learners` is the LearnerGroup (or a fake with the same `save_model`)."""
    root = Path(output_dir) / "checkpoints"
    path = root / f"step_{step}"
    learners.save_model(str(path))  # a collective under ZeRO-3
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    if keep_last_n > 0:
        for old in _step_dirs(root)[:-keep_last_n]:
            shutil.rmtree(old, ignore_errors=True)
    return path


def save_state(learners, state_dir: str, driver: DriverState, keep_last_n: int = 1) -> Path:
    """Write one resumable state, then keep the newest `keep_last_n` (-1: all). 0 keeps the one just written:
    open-instruct deletes that one too, leaving nothing to resume from."""
    root = Path(state_dir)
    path = root / f"step_{driver.next_step}"
    shutil.rmtree(path, ignore_errors=True)
    (path / "learner").mkdir(parents=True)
    learners.save_state(str(path / "learner"))
    with open(path / "driver.pkl.tmp", "wb") as f:
        pickle.dump(driver, f)
    (path / "driver.pkl.tmp").rename(path / "driver.pkl")
    (root / "latest.tmp").write_text(path.name)
    (root / "latest.tmp").rename(root / "latest")
    others = [p for p in _step_dirs(root) if p.name != path.name]
    keep_others = len(others) if keep_last_n < 0 else max(0, keep_last_n - 1)
    for old in others[: len(others) - keep_others]:
        shutil.rmtree(old, ignore_errors=True)
    logger.info("saved resumable state for step %d to %s", driver.next_step, path)
    return path


def latest_state(state_dir: str | None) -> tuple[Path, DriverState] | None:
    """The newest state under `state_dir` (a --checkpoint_state_dir), or `state_dir` itself when it is one
    state's step_<k> folder."""
    if not state_dir:
        return None
    pointer = Path(state_dir) / "latest"
    if (Path(state_dir) / "driver.pkl").exists():
        path = Path(state_dir)
    elif pointer.exists():
        path = Path(state_dir) / pointer.read_text().strip()
    else:
        return None
    return path, load_driver_state(path / "driver.pkl")


def load_learners(learners, path: Path) -> int:
    return learners.load_state(str(path / "learner"))
