"""Stateful environments: the counter, number-guessing and Wordle games used to debug agent rollouts.

The rollout loop builds a FRESH instance for every sample (`cls(**constructor_config)`), awaits
`reset(**row_kwargs)`, then `step(call)` per call, and reads `metrics()` at the end. open-instruct
reuses pooled actors across rollouts, so a `reset` that forgets a field leaks one sample's state
into the next; a new object per sample makes that impossible by construction.

The reward rules follow open-instruct's `counter`, `guess_number` and `wordle` environments so the
debug scripts teach the same behaviour and their curves compare. The code is ours. Methods are
`async` although they do no I/O, so that network-backed environments fit the same interface.
"""

from __future__ import annotations

import inspect
import re
from collections import Counter
from functools import lru_cache
from importlib import resources
from typing import Any

from open_instruct.agents.base import Environment, Role, StepResult, ToolCall, ToolDefinition
from open_instruct.extensions import register_environment, registered_environments


def _no_parameters() -> dict[str, Any]:
    # A fresh dict per definition: callers may annotate schemas, and must not alter a shared one.
    return {"type": "object", "properties": {}}


def _as_int(env: str, key: str, value: Any) -> int:
    """Dataset rows and CLI configs often carry numbers as strings ("4"); accept those, reject the rest."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ValueError(f"{env}: {key!r} must be an integer, got {value!r}")


def _required(env: str, kwargs: dict[str, Any], key: str) -> Any:
    # A row without the key would otherwise start a game with no answer; say which column to fix.
    if kwargs.get(key) is None:
        raise ValueError(f"{env}: reset needs {key!r} from the row's env_config")
    return kwargs[key]


def _game_over(name: str) -> StepResult:
    # The loop stops on `done`, but a caller that keeps stepping gets a clear no-op, not a new game.
    return StepResult(f"The {name} episode is over.", reward=0.0, done=True, error="episode is over")


@register_environment("counter")
class CounterEnv:
    """Move a counter from 0 to the row's `target`, then `submit`. Each move costs 0.1, so the best
    episode is the shortest one; a correct submit earns +1.0, a wrong one -0.5."""

    response_role: Role = "tool"

    def __init__(self, *, target: int = 5) -> None:
        # The constructor default exists only for config validation: `reset` always takes the row's.
        self.target = _as_int("counter", "target", target)
        self.value = 0
        self.step_count = 0
        self.done = False

    @classmethod
    def tool_definitions(cls) -> tuple[ToolDefinition, ...]:
        return (
            ToolDefinition("increment", "Add 1 to the counter.", _no_parameters()),
            ToolDefinition("decrement", "Subtract 1 from the counter.", _no_parameters()),
            ToolDefinition("submit", "Submit the counter's value as the answer; ends the episode.", _no_parameters()),
        )

    async def reset(self, **kwargs: Any) -> None:
        self.target = _as_int("counter", "target", _required("counter", kwargs, "target"))
        self.value = 0
        self.step_count = 0
        self.done = False

    async def step(self, call: ToolCall) -> StepResult:
        if self.done:
            return _game_over("counter")
        self.step_count += 1
        if call.name in ("increment", "decrement"):
            self.value += 1 if call.name == "increment" else -1
            return StepResult(f"value is now {self.value}", reward=-0.1)
        if call.name == "submit":
            self.done = True
            if self.value == self.target:
                return StepResult(f"correct: value {self.value} is the target", reward=1.0, done=True)
            return StepResult(f"wrong: value {self.value} is not the target", reward=-0.5, done=True)
        # A misspelt action is the model's mistake, not the episode's end: no reward, let it retry.
        return StepResult(
            f"unknown action {call.name!r}; use increment, decrement or submit",
            error=f"unknown action {call.name!r}",
        )

    def metrics(self) -> dict[str, float]:
        return {
            "step_count": float(self.step_count),
            "final_value": float(self.value),
            "reached_target": float(self.value == self.target),
        }


@register_environment("guess_number")
class GuessNumberEnv:
    """Find the row's `number` in [min_val, max_val]. A miss earns more the closer it was, so the
    hints are worth following; a hit earns 1.0 and ends the episode."""

    response_role: Role = "tool"

    def __init__(self, *, min_val: int = 1, max_val: int = 100) -> None:
        self.min_val = _as_int("guess_number", "min_val", min_val)
        self.max_val = _as_int("guess_number", "max_val", max_val)
        if self.max_val <= self.min_val:  # the miss reward divides by the range's width
            raise ValueError(f"guess_number: max_val ({self.max_val}) must exceed min_val ({self.min_val})")
        self.secret = self.min_val
        self.guesses = 0
        self.solved = False
        self.best_distance = self.max_val - self.min_val

    @classmethod
    def tool_definitions(cls) -> tuple[ToolDefinition, ...]:
        parameters = {
            "type": "object",
            "properties": {"number": {"type": "integer", "description": "Your guess."}},
            "required": ["number"],
        }
        return (
            ToolDefinition(
                "guess", "Guess the secret integer; the reply says too low, too high or correct.", parameters
            ),
        )

    async def reset(self, **kwargs: Any) -> None:
        secret = _as_int("guess_number", "number", _required("guess_number", kwargs, "number"))
        if not self.min_val <= secret <= self.max_val:
            # A secret outside the range would make the distance reward meaningless; it is a data error.
            raise ValueError(f"guess_number: 'number' {secret} is outside [{self.min_val}, {self.max_val}]")
        self.secret = secret
        self.guesses = 0
        self.solved = False
        # Before any guess the best distance is the worst possible one, so the mean stays meaningful.
        self.best_distance = self.max_val - self.min_val

    async def step(self, call: ToolCall) -> StepResult:
        if self.solved:
            return _game_over("guess_number")
        if call.name != "guess":
            return StepResult(f"unknown action {call.name!r}; use guess", error=f"unknown action {call.name!r}")
        try:
            guess = _as_int("guess_number", "number", call.args.get("number"))
        except ValueError as error:
            # A small penalty: a malformed call wastes a turn, but must not look worse than a bad guess.
            return StepResult(f"invalid guess: {error}", reward=-0.1, error=str(error))
        self.guesses += 1
        distance = abs(guess - self.secret)
        self.best_distance = min(self.best_distance, distance)
        if distance == 0:
            self.solved = True
            return StepResult(f"{guess} is correct", reward=1.0, done=True)
        hint = "too low" if guess < self.secret else "too high"
        return StepResult(f"{guess} is {hint}", reward=1.0 - distance / (self.max_val - self.min_val))

    def metrics(self) -> dict[str, float]:
        return {
            "guesses": float(self.guesses),
            "solved": float(self.solved),
            "best_distance": float(self.best_distance),
        }


@lru_cache(maxsize=1)
def wordle_dictionary() -> frozenset[str]:
    """The shipped word list, read once per process (package data, so it works from an installed wheel)."""
    text = (resources.files("open_instruct.agents") / "wordle_words.txt").read_text(encoding="utf-8")
    return frozenset(word.strip().lower() for word in text.splitlines() if word.strip())


def wordle_feedback(secret: str, guess: str) -> str:
    """G/Y/X per letter. Greens are taken first, then yellows only while the secret still has unmatched
    copies of that letter, so a guess cannot earn two yellows for one letter of the secret."""
    marks = ["X"] * len(guess)
    unmatched = Counter(s for s, g in zip(secret, guess) if s != g)
    for i, (s, g) in enumerate(zip(secret, guess)):
        if s == g:
            marks[i] = "G"
    for i, g in enumerate(guess):
        if marks[i] != "G" and unmatched[g] > 0:
            marks[i] = "Y"
            unmatched[g] -= 1
    return "".join(marks)


_GUESS_TAG = re.compile(r"<guess>(.*?)</guess>", re.IGNORECASE | re.DOTALL)


@register_environment("wordle")
class WordleEnv:
    """Wordle as a text environment: it reads each whole model turn and replies as the user.

    The model answers in `<guess>word</guess>`; the last such tag in a turn counts. Rewards give
    partial credit per green/yellow, a bonus for winning fast, and a share for using the tags at all,
    so a small model gets signal before it can win."""

    response_role: Role = "user"

    def __init__(self, *, max_guesses: int = 6) -> None:
        self.max_guesses = _as_int("wordle", "max_guesses", max_guesses)
        if self.max_guesses < 1:
            raise ValueError(f"wordle: max_guesses must be at least 1, got {self.max_guesses}")
        self.secret = ""
        self._clear()

    def _clear(self) -> None:
        self.guessed: list[str] = []
        self.turns = 0
        self.tagged_turns = 0
        self.invalid_in_a_row = 0
        self.invalid_attempts = 0
        self.last_marks = ""
        self.total_greens = 0
        self.total_yellows = 0
        self.solved = False
        self.done = False

    @classmethod
    def tool_definitions(cls) -> tuple[ToolDefinition, ...]:
        return ()  # a text environment sees the whole turn; it exposes no function to call

    async def reset(self, **kwargs: Any) -> None:
        word = str(_required("wordle", kwargs, "word")).strip().lower()
        if len(word) != 5 or not word.isalpha():
            raise ValueError(f"wordle: 'word' must be 5 letters, got {kwargs['word']!r}")
        self.secret = word
        self._clear()

    def _score(self) -> float:
        """The game's score so far: credit for the latest feedback plus the share of tagged turns."""
        tag_share = self.tagged_turns / self.turns if self.turns else 0.0
        return 0.2 * self.last_marks.count("G") + 0.1 * self.last_marks.count("Y") + 0.2 * tag_share

    def _problem(self, guess: str | None) -> str | None:
        if guess is None:
            return "no <guess>...</guess> tag found"
        if len(guess) != 5 or not guess.isalpha():
            return f"{guess!r} is not a 5-letter word"
        if guess in self.guessed:
            return f"{guess!r} was already guessed"
        # The secret always counts as a word, so a row may use one the shipped list lacks.
        if guess != self.secret and guess not in wordle_dictionary():
            return f"{guess!r} is not in the dictionary"
        return None

    async def step(self, call: ToolCall) -> StepResult:
        if self.done:
            return _game_over("wordle")
        self.turns += 1
        tags = _GUESS_TAG.findall(str(call.args.get("text", "")))
        self.tagged_turns += bool(tags)
        guess = tags[-1].strip().lower() if tags else None
        problem = self._problem(guess)
        if problem is not None:
            return self._invalid(problem)
        return self._play(guess)

    def _invalid(self, problem: str) -> StepResult:
        self.invalid_attempts += 1
        self.invalid_in_a_row += 1
        if self.invalid_in_a_row >= 2:
            # Two bad moves in a row end the game (as TextArena does), keeping the credit earned so far.
            self.done = True
            return StepResult(
                f"Invalid move: {problem}. Two invalid moves in a row; the game is over.",
                reward=self._score(),
                done=True,
                error=problem,
            )
        return StepResult(
            f"Invalid move: {problem}. Please resubmit a valid guess in <guess>...</guess> tags.", error=problem
        )

    def _play(self, guess: str) -> StepResult:
        self.invalid_in_a_row = 0
        self.guessed.append(guess)
        self.last_marks = wordle_feedback(self.secret, guess)
        self.total_greens += self.last_marks.count("G")
        self.total_yellows += self.last_marks.count("Y")
        feedback = f"{' '.join(guess.upper())}\n{' '.join(self.last_marks)}"
        if guess == self.secret:
            self.solved = self.done = True
            tag_share = self.tagged_turns / self.turns
            return StepResult(f"{feedback}\nYou solved it!", reward=1.0 + 1.0 / self.turns + 0.2 * tag_share, done=True)
        left = self.max_guesses - len(self.guessed)
        if left == 0:
            self.done = True
            return StepResult(
                f"{feedback}\nOut of guesses; the word was {self.secret}.", reward=self._score(), done=True
            )
        return StepResult(f"{feedback}\n{left} guesses left.", reward=self._score())

    def metrics(self) -> dict[str, float]:
        return {
            "guesses": float(len(self.guessed)),
            "invalid_attempts": float(self.invalid_attempts),
            "solved": float(self.solved),
            "total_greens": float(self.total_greens),
            "total_yellows": float(self.total_yellows),
        }


def make_environment(name: str, config: dict[str, Any]) -> Environment:
    """Build one environment from its `--tool_configs` entry, naming a misspelt key in one line
    (a bare TypeError from the constructor would not say which flag to fix)."""
    environments = registered_environments()
    cls = environments.get(name)
    if cls is None:
        raise ValueError(f"unknown environment {name!r} (known: {', '.join(sorted(environments))})")
    known = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise ValueError(f"--tool_configs for {name!r}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    return cls(**config)
