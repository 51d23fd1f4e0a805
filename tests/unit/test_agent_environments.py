"""The shipped environments score exactly as open-instruct's do, reject bad rows and configs with one
clear line, and keep no state between samples (the rollout builds a fresh instance per sample)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from open_instruct.agents import environments
from open_instruct.agents.base import ToolCall
from open_instruct.agents.environments import (
    CounterEnv,
    GuessNumberEnv,
    WordleEnv,
    make_environment,
    wordle_dictionary,
    wordle_feedback,
)


def play(env, row: dict, calls: list[ToolCall]):
    """Reset with a row's kwargs, then step through the calls; returns every StepResult."""

    async def run():
        await env.reset(**row)
        return [await env.step(call) for call in calls]

    return asyncio.run(run())


def turn(text: str) -> ToolCall:
    # The rollout hands a text environment the whole model turn under the name of its pool.
    return ToolCall("wordle", {"text": text})


# --- counter ---------------------------------------------------------------------------------------


def test_counter_reaches_a_string_target_and_submits():
    env = CounterEnv()
    steps = play(env, {"target": "3", "other_column": "ignored"}, [ToolCall("increment")] * 3 + [ToolCall("submit")])
    assert [s.reward for s in steps] == [-0.1, -0.1, -0.1, 1.0]
    assert [s.result for s in steps[:3]] == ["value is now 1", "value is now 2", "value is now 3"]
    assert [s.done for s in steps] == [False, False, False, True]
    assert all(s.error is None for s in steps)
    assert env.metrics() == {"step_count": 4.0, "final_value": 3.0, "reached_target": 1.0}


def test_counter_wrong_submit_costs_half_and_ends():
    env = CounterEnv(target=9)
    steps = play(
        env, {"target": 2}, [ToolCall("increment"), ToolCall("decrement"), ToolCall("decrement"), ToolCall("submit")]
    )
    assert [s.reward for s in steps] == [-0.1, -0.1, -0.1, -0.5]
    assert steps[2].result == "value is now -1"
    assert steps[-1].done and "wrong" in steps[-1].result
    assert env.metrics() == {"step_count": 4.0, "final_value": -1.0, "reached_target": 0.0}
    after = asyncio.run(env.step(ToolCall("increment")))  # stepping a finished episode changes nothing
    assert after.done and after.reward == 0.0 and env.metrics()["final_value"] == -1.0


def test_counter_unknown_action_is_an_error_but_not_the_end():
    env = CounterEnv()
    [step] = play(env, {"target": 1}, [ToolCall("multiply", {"by": 2})])
    assert step.reward == 0.0 and not step.done
    assert "unknown action" in step.result and "'multiply'" in step.result
    assert isinstance(step.error, str) and not step.ok
    assert env.metrics()["step_count"] == 1.0


def test_counter_reset_needs_an_integer_target():
    with pytest.raises(ValueError, match=r"^counter: reset needs 'target' from the row's env_config$"):
        play(CounterEnv(), {"number": 3}, [])
    with pytest.raises(ValueError, match=r"counter: 'target' must be an integer, got 'four'"):
        play(CounterEnv(), {"target": "four"}, [])
    with pytest.raises(ValueError, match="'target'"):
        play(CounterEnv(), {"target": 2.5}, [])


# --- guess_number ----------------------------------------------------------------------------------


def test_guess_number_misses_earn_closeness_and_a_hint_then_a_hit_ends():
    env = GuessNumberEnv()
    calls = [ToolCall("guess", {"number": 50}), ToolCall("guess", {"number": 30}), ToolCall("guess", {"number": "37"})]
    high, low, hit = play(env, {"number": "37"}, calls)
    assert high.reward == pytest.approx(1 - 13 / 99) and "too high" in high.result and not high.done
    assert low.reward == pytest.approx(1 - 7 / 99) and "too low" in low.result and not low.done
    assert hit.reward == 1.0 and hit.done and "correct" in hit.result
    assert env.metrics() == {"guesses": 3.0, "solved": 1.0, "best_distance": 0.0}


def test_guess_number_uses_the_configured_range():
    env = GuessNumberEnv(min_val=0, max_val=10)
    [step] = play(env, {"number": 4}, [ToolCall("guess", {"number": 9})])
    assert step.reward == pytest.approx(0.5) and "too high" in step.result
    assert env.metrics() == {"guesses": 1.0, "solved": 0.0, "best_distance": 5.0}


@pytest.mark.parametrize("args", [{"number": "abc"}, {"number": 3.5}, {"number": True}, {}])
def test_guess_number_non_integer_guess_costs_a_little(args):
    env = GuessNumberEnv()
    [step] = play(env, {"number": 10}, [ToolCall("guess", args)])
    assert step.reward == -0.1 and not step.done and step.error
    assert env.metrics() == {"guesses": 0.0, "solved": 0.0, "best_distance": 99.0}


def test_guess_number_reset_errors():
    with pytest.raises(ValueError, match=r"^guess_number: reset needs 'number' from the row's env_config$"):
        play(GuessNumberEnv(), {"target": 3}, [])
    with pytest.raises(ValueError, match=r"guess_number: 'number' must be an integer"):
        play(GuessNumberEnv(), {"number": "x"}, [])
    with pytest.raises(ValueError, match="outside"):
        play(GuessNumberEnv(), {"number": 500}, [])
    with pytest.raises(ValueError, match="max_val"):
        GuessNumberEnv(min_val=5, max_val=5)


# --- wordle ----------------------------------------------------------------------------------------


def test_wordle_feedback_handles_duplicate_letters():
    assert wordle_feedback("apple", "paper") == "YYGYX"
    assert wordle_feedback("apple", "puppy") == "YXGXX"  # one spare 'p' in the secret: one yellow
    assert wordle_feedback("apple", "lapel") == "YYGYX"  # the second 'l' finds no copy left
    assert wordle_feedback("plant", "plant") == "GGGGG"


def test_wordle_scores_greens_yellows_and_the_tag_share():
    env = WordleEnv()
    [step] = play(env, {"word": "APPLE"}, [turn("Let me try <guess>Paper</guess>")])
    assert step.result == "P A P E R\nY Y G Y X\n5 guesses left."
    assert step.reward == pytest.approx(0.2 * 1 + 0.1 * 3 + 0.2) and not step.done and step.error is None
    assert env.metrics() == {
        "guesses": 1.0,
        "invalid_attempts": 0.0,
        "solved": 0.0,
        "total_greens": 1.0,
        "total_yellows": 3.0,
    }


def test_wordle_invalid_then_valid():
    env = WordleEnv()
    first, second = play(env, {"word": "plant"}, [turn("I guess crane"), turn("<guess>crane</guess>")])
    assert first.reward == 0.0 and not first.done and "resubmit" in first.result and first.error
    # crane vs plant: greens on 'a' and 'n'; one of the two turns used the tags.
    assert second.reward == pytest.approx(0.4 + 0.2 * 1 / 2) and not second.done
    assert env.metrics()["invalid_attempts"] == 1.0 and env.metrics()["guesses"] == 1.0


@pytest.mark.parametrize(
    "bad", ["<guess>xyzzy</guess>", "<guess>cat</guess>", "<guess>cr4ne</guess>", "<guess>crane</guess>"]
)
def test_wordle_two_invalid_in_a_row_end_with_partial_credit(bad):
    # Not a word, too short, not letters, already guessed: each is invalid.
    env = WordleEnv()
    steps = play(env, {"word": "plant"}, [turn("<guess>crane</guess>"), turn("no tag here"), turn(bad)])
    assert steps[0].reward == pytest.approx(0.6)
    assert steps[1].reward == 0.0 and not steps[1].done
    last = steps[2]
    assert last.done and last.error
    assert last.reward == pytest.approx(0.4 + 0.2 * 2 / 3)  # latest feedback XXGGX, tags in 2 of 3 turns
    assert env.metrics()["invalid_attempts"] == 2.0 and env.metrics()["solved"] == 0.0


def test_wordle_a_valid_guess_resets_the_invalid_streak():
    env = WordleEnv()
    steps = play(env, {"word": "plant"}, [turn("oops"), turn("<guess>crane</guess>"), turn("oops again")])
    assert [s.done for s in steps] == [False, False, False]


def test_wordle_win_rewards_speed_and_tags():
    env = WordleEnv()
    _first, win = play(env, {"word": "plant"}, [turn("<guess>crane</guess>"), turn("<guess>plant</guess>")])
    assert win.done and "solved" in win.result
    assert win.reward == pytest.approx(1 + 1 / 2 + 0.2)
    assert env.metrics() == {
        "guesses": 2.0,
        "invalid_attempts": 0.0,
        "solved": 1.0,
        "total_greens": 7.0,
        "total_yellows": 0.0,
    }


def test_wordle_out_of_guesses_ends_with_a_valid_guess_reward():
    env = WordleEnv(max_guesses=2)
    first, last = play(env, {"word": "plant"}, [turn("<guess>crane</guess>"), turn("<guess>slate</guess>")])
    assert not first.done
    assert last.done and "plant" in last.result
    assert last.reward == pytest.approx(0.2 * 2 + 0.1 * 1 + 0.2)  # slate vs plant: XGGYX
    assert env.metrics()["solved"] == 0.0


def test_wordle_the_last_tag_in_a_turn_counts():
    env = WordleEnv()
    [step] = play(env, {"word": "plant"}, [turn("<guess>crane</guess> no wait: <GUESS> PLANT </GUESS>")])
    assert step.done and step.reward == pytest.approx(1 + 1 + 0.2)


def test_wordle_accepts_a_secret_missing_from_the_list():
    secret = "zymic"
    assert secret not in wordle_dictionary()
    env = WordleEnv()
    [step] = play(env, {"word": secret}, [turn(f"<guess>{secret}</guess>")])
    assert step.done and env.metrics()["solved"] == 1.0
    [other] = play(WordleEnv(), {"word": "plant"}, [turn(f"<guess>{secret}</guess>")])
    assert "not in the dictionary" in other.result


def test_wordle_reset_errors():
    with pytest.raises(ValueError, match=r"^wordle: reset needs 'word' from the row's env_config$"):
        play(WordleEnv(), {}, [])
    with pytest.raises(ValueError, match="5 letters"):
        play(WordleEnv(), {"word": "cat"}, [])


def test_the_word_list_ships_sorted_common_words():
    path = Path(environments.__file__).parent / "wordle_words.txt"
    words = path.read_text(encoding="utf-8").split("\n")
    words = [w for w in words if w]
    assert words == sorted(set(words)) and 1000 <= len(words) <= 2500
    assert all(len(w) == 5 and w.isalpha() and w.islower() for w in words)
    common = "plant crane slate house water light world about other which there their would could apple paper"
    assert set(common.split()) <= wordle_dictionary() == set(words)


# --- registry, fresh state, schemas ------------------------------------------------------------------


def test_make_environment_names_the_problem_in_one_line():
    known = r"\(known: counter, generic_sandbox, guess_number, wordle\)"
    with pytest.raises(ValueError, match=r"unknown environment 'chess' " + known):
        make_environment("chess", {})
    with pytest.raises(ValueError) as error:
        make_environment("counter", {"foo": 1})
    assert str(error.value) == "--tool_configs for 'counter': unknown key 'foo' (known: target)"
    with pytest.raises(ValueError, match=r"unknown key 'step' \(known: max_val, min_val\)"):
        make_environment("guess_number", {"step": 2, "max_val": 10})
    env = make_environment("guess_number", {"max_val": "10"})
    assert isinstance(env, GuessNumberEnv) and env.max_val == 10


def test_a_fresh_instance_after_reset_has_no_leftover_state():
    used = CounterEnv()
    play(used, {"target": 2}, [ToolCall("increment")] * 2 + [ToolCall("submit")])
    fresh = CounterEnv()
    play(fresh, {"target": 2}, [])
    assert fresh.metrics() == {"step_count": 0.0, "final_value": 0.0, "reached_target": 0.0}
    play(used, {"target": 2}, [])  # reset alone also clears, for callers that do reuse an instance
    assert used.metrics() == fresh.metrics()

    word = WordleEnv()
    play(word, {"word": "plant"}, [turn("<guess>crane</guess>"), turn("x"), turn("y")])
    again = WordleEnv()
    [step] = play(again, {"word": "plant"}, [turn("<guess>crane</guess>")])  # not "already guessed"
    assert step.error is None and again.metrics()["guesses"] == 1.0 and again.metrics()["invalid_attempts"] == 0.0

    guesser = GuessNumberEnv()
    play(guesser, {"number": 5}, [ToolCall("guess", {"number": 5})])
    play(guesser, {"number": 6}, [])
    assert guesser.metrics() == {"guesses": 0.0, "solved": 0.0, "best_distance": 99.0}


def test_tool_definitions_and_roles():
    counter = CounterEnv.tool_definitions()
    assert [d.name for d in counter] == ["increment", "decrement", "submit"]
    assert all(d.parameters == {"type": "object", "properties": {}} and d.required == () for d in counter)
    assert counter[0].parameters is not counter[1].parameters

    [guess] = GuessNumberEnv.tool_definitions()
    assert guess.name == "guess" and guess.required == ("number",)
    assert guess.parameters["properties"]["number"]["type"] == "integer"
    assert guess.as_openai()["function"]["name"] == "guess"

    assert WordleEnv.tool_definitions() == ()
    assert (CounterEnv.response_role, GuessNumberEnv.response_role, WordleEnv.response_role) == ("tool", "tool", "user")
