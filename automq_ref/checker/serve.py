"""``python -m automq_ref.checker.serve [--broken MODE ...] [--override NAME=VALUE ...]``: the
broker as ``automq-ref serve`` runs it, for the checker and the tests.

The broker processes of the checker and of the tests start here (``BrokerProcess``). A
``--broken`` mode (:mod:`automq_ref.checker.broken`) is handed to the node as its seams: the
broker's own modules never import the fault code, and the user's configuration has no test-only
switch to set by mistake.
"""

from __future__ import annotations

import argparse
import logging
import sys

from automq_ref.checker.broken import MODES, decision_seam, seams_for
from automq_ref.config import ConfigError, load_config
from automq_ref.node import Seams, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m automq_ref.checker.serve",
        description="automq-ref serve, optionally broken on purpose for the checker",
    )
    parser.add_argument("--broken", action="append", default=[], choices=sorted(MODES))
    parser.add_argument("--override", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument(
        "--log-level", default="info", type=str.lower, choices=("debug", "info", "warning", "error")
    )
    arguments = parser.parse_args(argv)
    logging.basicConfig(
        level=arguments.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(None, arguments.override)
    except ConfigError as error:
        for problem in error.problems:
            print(f"automq_ref.checker.serve: {problem}", file=sys.stderr)
        return 2
    modes = set(arguments.broken)
    open_wal, before_open = seams_for(modes)
    return run(
        config,
        Seams(open_wal=open_wal, before_open=before_open, before_decision=decision_seam(modes)),
    )


if __name__ == "__main__":
    sys.exit(main())
