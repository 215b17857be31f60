"""The cold-read process: ``python -m automq_ref.io.storage.cold_read_child FD SETTINGS``.

The broker starts it (:mod:`automq_ref.io.storage.cold_read_process`) with ``FD``, this end of a
socket pair, and ``SETTINGS``, a ``ColdReadSettings`` as JSON. Before it imports the read path
(the store's libraries take most of a second of CPU) it lowers its own priority by the
settings' ``niceness``, so even its start yields to the broker; then
:mod:`automq_ref.io.storage.cold_read_server` serves. It ignores SIGINT: a Ctrl-C meant for the
broker reaches its whole process group, and the broker ends this process by closing the
connection (or by ``CLOSE``).
"""

from __future__ import annotations

import json
import os
import signal
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m automq_ref.io.storage.cold_read_child FD SETTINGS", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    niceness = int(json.loads(argv[1]).get("niceness", 0))
    if niceness:
        os.nice(niceness)
    from automq_ref.io.storage import cold_read_server

    cold_read_server.serve(int(argv[0]), argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
