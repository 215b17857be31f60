"""``python -m automq_ref.checker.serve [--broken MODE ...] [serve options]``: ``automq-ref
serve`` for the checker and the tests.

The broker processes of the checker and of the tests start here (``BrokerProcess``). A
``--broken`` mode (:mod:`automq_ref.checker.broken`) is handed to the node as its seams: the
broker's own modules never import the fault code, and the user's configuration has no test-only
switch to set by mistake.
"""

from __future__ import annotations

import argparse
import sys

from automq_ref import cli
from automq_ref.checker.broken import MODES, seams_for
from automq_ref.node import Seams


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m automq_ref.checker.serve",
        description="automq-ref serve, optionally broken on purpose for the checker",
    )
    parser.add_argument("--broken", action="append", default=[], choices=sorted(MODES))
    own, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    open_wal, before_open = seams_for(set(own.broken))
    return cli.main(["serve", *rest], seams=Seams(open_wal=open_wal, before_open=before_open))


if __name__ == "__main__":
    sys.exit(main())
