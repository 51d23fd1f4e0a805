"""Asynchronous reward scoring: verifiers run in killable worker processes, off the event loop.

`RewardScorer.score` turns one response into a `RewardOutcome`:

1. Pairing: verifier i scores ground truth i. A plain-string verifier name is paired with the
   ground truth as given (wrapped into one-element lists). Names are lower-cased, then remapped
   through --remap_verifier, then looked up in the registry.
2. Verifiable reward: Σ over pairs of `verification_reward` × score (skipped entirely when
   `apply_verifiable_reward` is False).
3. Format reward: `format_reward` is added when a `</think>` is followed by a non-empty
   `<answer>...</answer>` (the tulu_thinker prompt already opened `<think>`).
4. Non-stop penalty: with `non_stop_penalty`, a response whose `finish_reason` is not "stop"
   (typically truncated at the length limit) gets exactly `non_stop_penalty_value` as its reward;
   this *replaces* steps 2-3, as in open-instruct. Verifiers still run so per-verifier metrics
   stay comparable.

Failure isolation: a verifier that raises, returns a non-finite or out-of-range score, times out
(`verifier_timeout_s`) or kills its process scores 0 for that pair; the error is appended to
`RewardOutcome.errors` (with sample id and verifier name), counted in `error_counts` by verifier
name and logged. An unknown verifier name is handled the same way. Nothing is raised to the caller.

Why processes: verifiers are CPU-bound Python (sympy, regexes), may hang on adversarial input and
cannot be interrupted from another thread. There are `max_workers` worker slots, each one child
process serving one call at a time, and as many dispatch threads, so a thread always finds an
idle slot. On a timeout only that slot's process is killed and replaced; calls in other slots are
unaffected and a hung verifier never outlives its timeout. A new process imports the verifier
modules and reports ready before its first call, so import time is never charged to a timeout.

Why not `multiprocessing`/`ProcessPoolExecutor`: with "spawn" and "forkserver" every worker
re-executes the launching script as `__mp_main__` (CPython 3.11's fork server does not preload it
either), which for the trainer's entry point would import torch/vLLM/Ray into each reward worker
on every start and recycle; killing one executor process also needs private attributes. The
workers here are plain `python -c` subprocesses speaking length-prefixed pickles over their
stdin/stdout. They inherit the parent's `sys.path`, and verifier functions are sent by reference
(module + name), so any verifier registered at module level in an importable module works.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import math
import os
import pickle
import queue
import re
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Self

from open_instruct.extensions import BUILTIN_VERIFIER_MODULES, verifier_key
from open_instruct.rewards import RewardSettings, Verifier, VerifierInput, get_verifier

logger = logging.getLogger(__name__)

_WARM_UP_TIMEOUT_S = 120.0
_SYS_PATH_ENV = "OPEN_INSTRUCT_REWARD_WORKER_SYS_PATH"
_BOOTSTRAP = (
    "import json, os, sys; "
    f"sys.path[:] = json.loads(os.environ[{_SYS_PATH_ENV!r}]); "
    "from open_instruct.rewards.scoring import worker_main; worker_main()"
)
_HEADER = struct.Struct(">Q")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class RewardOutcome:
    reward: float
    per_verifier: dict[str, float]  # verifier name (after remap) -> raw score in [0, 1]; mean if repeated
    errors: list[str]


_R1_FORMAT = re.compile(r".*?</think>\s*<answer>.*?</answer>", re.DOTALL)


def r1_format_matches(text: str) -> bool:
    """open-instruct's R1 format check: from the start, a closed think block, then an answer block."""
    return _R1_FORMAT.match(text) is not None


def has_think_answer_format(text: str) -> bool:
    _, closed, after = text.partition("</think>")
    match = _ANSWER.search(after) if closed else None
    return bool(match and match.group(1).strip())


# ---------------------------------------------------------------------------------------------
# Worker process side


def _send(fd: int, obj: Any) -> None:
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    data = memoryview(_HEADER.pack(len(payload)) + payload)
    while data:
        data = data[os.write(fd, data) :]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    """n bytes from fd, None on EOF; raises TimeoutError once `deadline` (monotonic) passes."""
    chunks: list[bytes] = []
    while n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _recv(fd: int, deadline: float | None = None) -> Any:
    header = _read_exact(fd, _HEADER.size, deadline)
    if header is None:
        raise EOFError
    payload = _read_exact(fd, _HEADER.unpack(header)[0], deadline)
    if payload is None:
        raise EOFError
    return pickle.loads(payload)


def _warm_up() -> list[str]:
    # A missing optional module must not take the other verifiers down, so failures are reported.
    failed = []
    for module in BUILTIN_VERIFIER_MODULES:
        try:
            importlib.import_module(module)
        except Exception as e:
            failed.append(f"{module}: {type(e).__name__}: {e}")
    return failed


def _exit_when_orphaned(parent: int) -> None:
    # If the trainer dies without closing us, do not let a hung verifier live on.
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def worker_main() -> None:
    """Entry point of a worker process: serve calls from stdin until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    requests, replies = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    # Verifiers that print must not corrupt the reply channel.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    _send(replies, ("ready", _warm_up()))
    while True:
        try:
            fn, inp, settings = _recv(requests)
        except EOFError:
            return
        except Exception as e:
            _send(replies, ("error", f"{type(e).__name__}: {e}"))
            continue
        try:
            reply = ("ok", fn(inp, settings).score)
        except BaseException as e:
            reply = ("error", f"{type(e).__name__}: {e}")
        try:
            _send(replies, reply)
        except (pickle.PicklingError, TypeError) as e:
            _send(replies, ("error", f"unpicklable verifier result: {e}"))


# ---------------------------------------------------------------------------------------------
# Parent side


class _VerifierTimeout(Exception):
    pass


class _WorkerDied(Exception):
    pass


class _VerifierRaised(Exception):
    """The verifier raised in the worker; the message is its `Type: message`."""


class _Worker:
    """One child process serving one verifier call at a time."""

    def __init__(self) -> None:
        env = dict(os.environ, **{_SYS_PATH_ENV: json.dumps(sys.path)})
        self.process = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            bufsize=0,
        )
        self.ready = False

    def call(self, fn: Verifier, inp: VerifierInput, settings: RewardSettings, timeout_s: float) -> Any:
        try:
            if not self.ready:
                self._wait_ready()
            _send(self.process.stdin.fileno(), (fn, inp, settings))
            status, value = _recv(self.process.stdout.fileno(), time.monotonic() + timeout_s)
        except TimeoutError:
            raise _VerifierTimeout(f"timed out after {timeout_s}s") from None
        except (EOFError, BrokenPipeError):
            raise _WorkerDied(f"worker process died (exit code {self.process.poll()})") from None
        if status != "ok":
            raise _VerifierRaised(value)
        return value

    def _wait_ready(self) -> None:
        try:
            status, failed = _recv(self.process.stdout.fileno(), time.monotonic() + _WARM_UP_TIMEOUT_S)
        except TimeoutError:
            raise _VerifierTimeout(f"worker start-up took over {_WARM_UP_TIMEOUT_S}s") from None
        if status != "ready":
            raise _WorkerDied(f"worker sent {status!r} instead of ready")
        for failure in failed:
            logger.warning("reward worker could not import verifier module %s", failure)
        self.ready = True

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)
        self.process.stdin.close()
        self.process.stdout.close()

    def stop(self) -> None:
        self.process.stdin.close()  # EOF: the worker exits after its current call
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process.stdout.close()


class RewardScorer:
    def __init__(self, settings: RewardSettings, max_workers: int):
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if not settings.verifier_timeout_s > 0:
            raise ValueError(f"verifier_timeout_s must be > 0, got {settings.verifier_timeout_s}")
        self.settings = settings
        self._remap = settings.reward.verifier_remap
        self._max_workers = max_workers
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        for _ in range(max_workers):
            self._idle.put(_Worker())
        self._dispatch = ThreadPoolExecutor(max_workers, thread_name_prefix="reward-dispatch")
        self._lock = threading.Lock()
        self._error_counts: Counter[str] = Counter()
        self._closed = False

    @property
    def error_counts(self) -> Counter[str]:
        """Errors so far by verifier name (a snapshot)."""
        with self._lock:
            return Counter(self._error_counts)

    def resolve_name(self, name: str) -> str:
        name = verifier_key(name)
        return self._remap.get(name, name)

    def _call(self, fn: Verifier, inp: VerifierInput) -> Any:
        """Blocking: run one verifier call in an idle worker, replacing the worker if it hangs or dies."""
        worker = self._idle.get()
        try:
            return worker.call(fn, inp, self.settings, self.settings.verifier_timeout_s)
        except (_VerifierTimeout, _WorkerDied):
            worker.kill()
            worker = _Worker()
            raise
        finally:
            self._idle.put(worker)

    def _score_pair(
        self, sample_id: str, raw_name: Any, ground_truth: Any, prediction: str, response_token_count: int, query: str
    ) -> tuple[str, float, str | None]:
        name = self.resolve_name(str(raw_name))
        try:
            fn = get_verifier(name)
            score = self._call(fn, VerifierInput(prediction, ground_truth, response_token_count, query))
            if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
                raise ValueError(f"verifier returned a non-numeric or non-finite score {score!r}")
            if not 0.0 <= score <= 1.0:
                raise ValueError(f"verifier returned score {score!r} outside [0, 1]")
            return name, float(score), None
        except Exception as e:
            detail = (
                str(e)
                if isinstance(e, (_VerifierTimeout, _WorkerDied, _VerifierRaised))
                else f"{type(e).__name__}: {e}"
            )
            return name, 0.0, self._record_error(sample_id, name, detail)

    def _record_error(self, sample_id: str, name: str, detail: str) -> str:
        message = f"sample {sample_id}: verifier {name!r}: {detail}"
        with self._lock:
            self._error_counts[name] += 1
        logger.warning("reward error: %s", message)
        return message

    def _pairs(self, sample_id: str, verifier_names, ground_truths, errors: list[str]) -> list[tuple[str, Any]]:
        """(verifier name, its ground truth) pairs; none, with an error, when the counts differ."""
        if isinstance(verifier_names, str):
            return [(verifier_names, ground_truths)]
        names = list(verifier_names)
        truths = [ground_truths] if isinstance(ground_truths, str) else list(ground_truths)
        if len(names) != len(truths):
            detail = f"{len(names)} verifier names but {len(truths)} ground truths"
            errors.append(self._record_error(sample_id, "<pairing>", detail))
            return []
        return list(zip(names, truths))

    async def score(
        self,
        sample_id: str,
        prediction: str,
        ground_truths: list,
        verifier_names: list[str],
        finish_reason: str,
        response_token_count: int,
        query: str = "",
    ) -> RewardOutcome:
        if self._closed:
            raise RuntimeError("RewardScorer is closed")
        errors: list[str] = []
        per_verifier: dict[str, list[float]] = {}
        reward = 0.0
        reward_flags = self.settings.reward
        if reward_flags.apply_verifiable_reward:
            pairs = self._pairs(sample_id, verifier_names, ground_truths, errors)
            loop = asyncio.get_running_loop()
            results = await asyncio.gather(
                *(
                    loop.run_in_executor(
                        self._dispatch,
                        self._score_pair,
                        sample_id,
                        name,
                        gt,
                        prediction,
                        response_token_count,
                        query,
                    )
                    for name, gt in pairs
                )
            )
            for name, score, error in results:
                per_verifier.setdefault(name, []).append(score)
                reward += reward_flags.verification_reward * score
                if error is not None:
                    errors.append(error)
        if reward_flags.r1_format_gate and not r1_format_matches(prediction):
            reward = 0.0  # the verifier's reward counts only for well-formed responses
        if reward_flags.r1_format_bonus and r1_format_matches(prediction):
            reward += reward_flags.r1_format_bonus
        if reward_flags.format_reward and has_think_answer_format(prediction):
            reward += reward_flags.format_reward
        if reward_flags.non_stop_penalty and finish_reason != "stop":
            reward = reward_flags.non_stop_penalty_value
        return RewardOutcome(
            reward=reward,
            per_verifier={name: sum(s) / len(s) for name, s in per_verifier.items()},
            errors=errors,
        )

    def close(self) -> None:
        """Wait for in-flight calls (each bounded by the timeout), then stop every worker process."""
        if self._closed:
            return
        self._closed = True
        self._dispatch.shutdown(wait=True, cancel_futures=True)
        for _ in range(self._max_workers):
            self._idle.get().stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
