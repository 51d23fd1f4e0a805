"""Entry point: `python open_instruct/grpo_fast.py [flags]` (flags compatible with open-instruct).

Parses and validates the configuration, refuses features that do not exist yet, then hands
over to the orchestrator. No logic lives here. With neither --model_name_or_path nor
--dataset_mixer_list it runs on the embedded tiny default, so it works offline.
"""

from __future__ import annotations

import logging
import sys


def main(argv: list[str] | None = None) -> int:
    from open_instruct.config import ConfigError, parse_config, unsupported_features
    from open_instruct.errors import UserError

    try:
        cfg = parse_config(argv)
    except ConfigError as error:
        print(f"grpo_fast.py: {error}", file=sys.stderr)
        return 2
    level = logging.DEBUG if cfg.logging.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    missing = unsupported_features(cfg)
    if missing:
        print("grpo_fast.py: " + "; ".join(missing), file=sys.stderr)
        return 2

    from open_instruct import orchestrator
    from open_instruct.config_parity import ignored_values, state_dir

    log = logging.getLogger("open_instruct")
    for line in ignored_values([getattr(cfg, name) for name in cfg.group_names]):
        log.warning(line)
    if cfg.experiment.preflight:
        return preflight(cfg)
    log.info(orchestrator.describe_sources(cfg))
    if state_dir(cfg) and not cfg.experiment.checkpoint_state_dir:
        log.info("resumable state: a save interval is set without --checkpoint_state_dir; saving to %s", state_dir(cfg))
    try:
        summary = orchestrator.run(cfg)
    except KeyboardInterrupt:
        print("grpo_fast.py: interrupted; actors shut down", file=sys.stderr)
        return 130
    except UserError as error:  # a flag, path, row, name or service the user can fix: one line, no traceback
        if cfg.logging.verbose:
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
    from open_instruct.config_parity import state_dir

    saved = latest_state(cfg.schedule.resume_from_checkpoint or state_dir(cfg))
    if saved is None:
        return "no resumable state was saved (--checkpoint_state_freq N --checkpoint_state_dir DIR keep one)"
    path, state = saved
    command = shlex.join([sys.executable, *argv])
    return f"the last saved state is {path} (step {state.next_step}); resume with: {command}"


if __name__ == "__main__":
    sys.exit(main())
