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
    from open_instruct.config_parity import ignored_values

    log = logging.getLogger("open_instruct")
    for line in ignored_values([getattr(cfg, name) for name in cfg.group_names]):
        log.warning(line)
    log.info(orchestrator.describe_sources(cfg))
    try:
        summary = orchestrator.run(cfg)
    except KeyboardInterrupt:
        print("grpo_fast.py: interrupted; actors shut down", file=sys.stderr)
        return 130
    except ConfigError as error:  # found only once the cluster is known (e.g. too few GPUs): still a user error
        print(f"grpo_fast.py: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # every actor is already shut down; say why the run ended
        log.exception("run failed")
        print(f"grpo_fast.py: run failed: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    if summary["status"] == "completed":
        return 0
    # Stopped by a signal after saving state: the conventional 128 + signal number.
    return 130 if "SIGINT" in summary["status"] else 143


if __name__ == "__main__":
    sys.exit(main())
