"""Entry point: `python open_instruct/grpo_fast.py [flags]` (flags compatible with open-instruct).

Parses and validates the configuration, refuses features that do not exist yet, loads the data,
builds the Ray-backed collaborators (`cluster.Stack`) and hands them to the training loop
(`orchestrator.TrainingLoop`). With neither --model_name_or_path nor --dataset_mixer_list it runs on
the embedded tiny default, so it works offline.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from open_instruct.config.core import Config

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None, engine_class=None) -> int:
    """`engine_class`: a GenerationActor subclass (tests and benchmarks shape or hold samples)."""
    from open_instruct.config.core import ConfigError
    from open_instruct.errors import UserError

    try:
        cfg = checked_config(argv)
    except ConfigError as error:
        print(f"grpo_fast.py: {error}", file=sys.stderr)
        return 2
    level = logging.DEBUG if cfg.run.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from open_instruct.config.derived import state_dir

    log = logging.getLogger("open_instruct")
    for line in cfg.compat.ignored():
        log.warning(line)
    if cfg.run.preflight:
        return preflight(cfg)
    stack_problem = check_stack(log)
    if stack_problem:
        print(f"grpo_fast.py: {stack_problem}", file=sys.stderr)
        return 2
    log.info(describe_sources(cfg))
    if state_dir(cfg) and not cfg.run.checkpoint_state_dir:
        log.info("resumable state: a save interval is set without --checkpoint_state_dir; saving to %s", state_dir(cfg))
    try:
        summary = run(cfg, engine_class)
    except KeyboardInterrupt:
        print("grpo_fast.py: interrupted; actors shut down", file=sys.stderr)
        return 130
    except UserError as error:  # a flag, path, row, name or service the user can fix: one line, no traceback
        if cfg.run.verbose:
            log.exception("run failed")
        print(f"grpo_fast.py: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # our bug: every actor is already shut down; the traceback, then why it ended
        log.exception("run failed")
        print(f"grpo_fast.py: run failed: {type(error).__name__}: {error}", file=sys.stderr)
        print(
            f"grpo_fast.py: {resume_hint(cfg, sys.argv if argv is None else ['grpo_fast.py', *argv])}", file=sys.stderr
        )
        return 1
    if summary["status"] == "completed":
        return 0
    # Stopped by a signal after saving state: the conventional 128 + signal number.
    return 130 if "SIGINT" in summary["status"] else 143


def checked_config(argv: list[str] | None) -> Config:
    """The parsed flags, also checked for what configuration cannot judge alone: values refused as not
    supported yet, and the names only our registries or an installed package know (`launch_problems`)."""
    from open_instruct.config.core import ConfigError, parse_config, unsupported_features

    cfg = parse_config(argv)
    problems = unsupported_features(cfg) + launch_problems(cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    return cfg


def launch_problems(cfg) -> list[str]:
    """Flag values only our registries or an installed package can judge (configuration imports none of them):
    seconds, before any data, model or actor is loaded."""
    from open_instruct.agents.tools import registry_problems
    from open_instruct.data.models import model_option_problems
    from open_instruct.extensions import ExtensionError, load_extensions
    from open_instruct.generation.engine_setup import attention_backend_problem

    try:
        load_extensions(cfg.run.extension_modules)  # before any name is looked up
    except ExtensionError as error:
        return [str(error)]

    problem = attention_backend_problem(cfg.generation.vllm_attention_backend)
    return ([problem] if problem else []) + model_option_problems(cfg.model) + registry_problems(cfg.tools)


def check_stack(log: logging.Logger) -> str | None:
    """A CPU torch/vLLM on a machine with GPUs, or a driver older than the torch build's CUDA: the one line
    that stops the run before Ray starts (stack_check.py), else None."""
    from open_instruct import stack_check

    if stack_check.skipped():
        return None
    found, description = stack_check.check()
    if found:
        return "; ".join(found)
    log.info("stack: %s", description)
    return None


def preflight(cfg) -> int:
    """--preflight: the report on standard output; 0 when every check passed, else 2."""
    from open_instruct.preflight import report, run_checks

    checks = run_checks(cfg)
    print(report(checks))
    return 0 if all(check.ok for check in checks) else 2


def resume_hint(cfg, argv: list[str]) -> str:
    """Where the run can pick up again: the same command resumes from --checkpoint_state_dir."""
    import shlex

    from open_instruct.checkpoints import latest_state
    from open_instruct.config.derived import state_dir

    saved = latest_state(cfg.run.resume_from_checkpoint or state_dir(cfg))
    if saved is None:
        return "no resumable state was saved (--checkpoint_state_freq N --checkpoint_state_dir DIR keep one)"
    path, state = saved
    command = shlex.join([sys.executable, *argv])
    return f"the last saved state is {path} (step {state.next_step}); resume with: {command}"


def describe_sources(cfg: Config) -> str:
    from open_instruct.config.data import EMBEDDED_DATASET_NAME
    from open_instruct.data.embedded_default import EMBEDDED_MODEL_NAME

    if cfg.uses_embedded_default:
        return (
            f"using the embedded default: model {EMBEDDED_MODEL_NAME} and dataset {EMBEDDED_DATASET_NAME} "
            "(no --model_name_or_path / --dataset_mixer_list given; built on first use)"
        )
    model = cfg.model.model_name_or_path or EMBEDDED_MODEL_NAME
    data = " ".join(cfg.data.dataset_mixer_list) or EMBEDDED_DATASET_NAME
    return f"model {model}; training mix {data}"


def note_small_dataset(cfg: Config, count: int) -> None:
    """A mix smaller than the lookahead is a valid run (open-instruct goes on into the next pass): prompts
    recur, reshuffled, under new ids (`<row>@<epoch>`), possibly while an earlier pass's copy still generates."""
    needed = (cfg.lookahead_max + 1) * cfg.generation.num_unique_prompts_rollout
    if count < needed:
        logger.info(
            "the training mix has %d prompts, fewer than the %d the lookahead may admit at once: later passes "
            "(epochs, reshuffled, counted in data/epoch) start while earlier ones are still generating",
            count,
            needed,
        )


def check_services(cfg: Config, prompts) -> None:
    """The services the data needs answer, before anything starts (a missing one is a user's error)."""
    from open_instruct.rewards.code_tests import CODE_VERIFIERS, check_code_service

    if any(name in CODE_VERIFIERS for prompt in prompts for name in prompt.verifier_names):
        check_code_service(cfg.reward.code_api_url)


def load_data(cfg: Config, tokenizer):
    """The training and evaluation prompts, with their reports logged; the services the training data needs
    are checked before the evaluation data loads. With no eval mix nothing is evaluated and no eval split is read
    (`Config.eval_data`): one line says so."""
    from open_instruct.data.dataset import load_split

    train = load_split(cfg, tokenizer, "train")
    logger.info("training data:\n%s", train.report.summary())
    note_small_dataset(cfg, len(train.prompts))
    if not cfg.data.cache_dataset_only:  # tokenizing needs no service (mason caches where none is reachable)
        check_services(cfg, train.prompts)
    logger.info(cfg.evaluation_line)
    evaluation = load_split(cfg, tokenizer, "eval")
    if cfg.eval_data is not None:
        logger.info("evaluation data:\n%s", evaluation.report.summary())
    return train, evaluation


def run(cfg: Config, engine_class=None, engine_args: tuple = ()) -> dict:
    """Load the data, build the Ray-backed collaborators, train; every actor is gone when this returns.
    `engine_class`/`engine_args`: a GenerationActor subclass (benchmarks and tests shape or force samples)."""
    from open_instruct.cluster import Stack
    from open_instruct.data.models import check_model_sources, load_tokenizer, packing_pad_id, resolve_model_path
    from open_instruct.extensions import load_extensions
    from open_instruct.launch.commands import CACHE_KEY_FLAGS, CACHE_KEYS_LINE
    from open_instruct.orchestrator import StopRequest

    load_extensions(cfg.run.extension_modules)  # (already done when main() checked the flags)
    check_model_sources(cfg.model)  # before anything starts: a bad name costs seconds
    model_path = resolve_model_path(cfg.model.model_name_or_path)
    if cfg.model.use_peft:  # a --lora_target_modules name the model lacks, named before anything starts
        from open_instruct import adapters

        logger.info("LoRA adapter: %s", adapters.describe(model_path, cfg.model))
    tokenizer = load_tokenizer(cfg.model)
    train, evaluation = load_data(cfg, tokenizer)
    if cfg.data.cache_dataset_only:
        keys = [(flag, data.report.mix_key) for flag, data in zip(CACHE_KEY_FLAGS, (train, evaluation))]
        print(CACHE_KEYS_LINE, *(token for flag, key in keys if key for token in (flag, key)))
        return {"status": "completed", "cached_only": True, "train_prompts": len(train.prompts)}
    stop = StopRequest()
    stack = None
    try:
        stack = Stack(cfg, model_path, packing_pad_id(tokenizer, model_path), engine_class, engine_args)
        stop.install()  # after ray.init, whose core worker installs its own (fatal) SIGTERM handler
        return training_loop(cfg, stack, tokenizer, train, evaluation, stop).run()
    finally:
        stop.uninstall()
        if stack is not None:
            stack.close()


def training_loop(cfg: Config, stack, tokenizer, train, evaluation, stop=None):
    """The training loop over a built `cluster.Stack` and the loaded data (what `run` trains with; checks that
    need the stack afterwards build theirs here too)."""
    from open_instruct.orchestrator import SystemClock, TrainingLoop
    from open_instruct.tracking import RunLog

    return TrainingLoop(
        cfg,
        engines=stack.pool,
        learners=stack.learners,
        weights=stack.sync,
        clock=SystemClock(),
        log=RunLog(cfg),
        train_rows=train.prompts,
        eval_rows=evaluation.prompts,
        tokenizer=tokenizer,
        stop=stop,
    )


if __name__ == "__main__":
    sys.exit(main())
