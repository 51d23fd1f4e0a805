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

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = parse_config(argv)
    except ConfigError as error:
        print(f"grpo_fast.py: {error}", file=sys.stderr)
        return 2
    missing = unsupported_features(cfg)
    if missing:
        print("grpo_fast.py: " + "; ".join(missing), file=sys.stderr)
        return 2

    from open_instruct import orchestrator

    logging.getLogger("open_instruct").info(orchestrator.describe_sources(cfg))
    orchestrator.run(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
