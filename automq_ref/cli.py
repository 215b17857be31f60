"""The ``automq-ref`` command."""

from __future__ import annotations

import argparse
import sys

from automq_ref import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="automq-ref", description=__doc__)
    parser.add_argument("--version", action="version", version=f"automq-ref {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="run the broker on its embedded default")
    arguments = parser.parse_args(argv)
    if arguments.command == "serve":
        print(
            "automq-ref serve: the Kafka protocol server is not built yet "
            "(it arrives with the single-node broker milestone)",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
