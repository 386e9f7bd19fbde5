"""A tensor-parallel rank that rank 0 started (`python -m tachyon.tp_worker`, tachyon.distributed.Workers): its
arguments come pickled on stdin, whose end is also how it learns that rank 0's process is gone."""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading

from tachyon.build import build_runner
from tachyon.distributed import join_group


def _exit_when_parent_gone() -> None:
    try:
        sys.stdin.buffer.read()  # returns when rank 0 closes its end, or its process ends (a SIGKILL too)
    finally:
        os._exit(0)


def main() -> None:
    """Join the group, build this shard's runner, serve rank 0's steps until it says stop."""
    args, rank, size, init_method = pickle.load(sys.stdin.buffer)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches every process of the terminal: rank 0 decides
    threading.Thread(target=_exit_when_parent_gone, daemon=True).start()
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s tp-rank{rank} %(levelname)s %(message)s")
    build_runner(args, join_group(args, rank, init_method))  # returns only on rank 0


if __name__ == "__main__":
    main()
