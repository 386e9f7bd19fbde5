"""Tensor parallelism's processes: start the other ranks, join their group, watch them, let them go.

    --distributed-executor-backend mp (default)        --distributed-executor-backend external_launcher
    ───────────────────────────────────────────        ───────────────────────────────────────────────
    rank 0 (the engine's process) starts ranks          torchrun (or any launcher setting RANK, WORLD_SIZE,
    1..N-1 as `python -m tachyon.tp_worker`, their    MASTER_ADDR, MASTER_PORT, LOCAL_RANK) starts every
    arguments pickled on stdin; rendezvous over         rank with the same command; rank 0 becomes the engine,
    tcp://127.0.0.1                                     the others serve its steps and exit when it stops

Each rank builds its runner over its shard (tachyon.build.build_runner), then the others loop in
`ModelRunner.serve_steps` until rank 0 sends None. The activations travel over NCCL on GPUs and gloo on the CPU;
the per-step messages over a gloo group whose timeout is a year (a server may sit idle for long).

No orphans: a spawned rank reads its stdin to the end in a thread and exits when it closes, which happens when
rank 0's process ends however it ends (a SIGKILL included); it ignores Ctrl-C (the terminal sends it to every
process of the group: rank 0 decides). Rank 0 watches its ranks' processes: one that exits while serving sets
`Workers.fault`, which the engine reads between steps and on the next submit (tachyon.interface.RunnerFault):
the engine stops, and `tachyon serve` answers /health with 503 and fails every open request with the cause.
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from tachyon.layers.parallel import TensorParallel

logger = logging.getLogger("tachyon")

MESSAGE_TIMEOUT = timedelta(days=365)  # the step messages' group: an idle server waits this long for the next
START_TIMEOUT = timedelta(minutes=10)  # the activations' group: start-up (loading) may differ this much by rank


class Workers:
    """Rank 0's handle on the processes of ranks 1..N-1 it started: their exit is a fault; `close` ends them."""

    def __init__(self, procs: list[subprocess.Popen]):
        self.procs = procs
        self.fault: str | None = None
        self._stopping = False
        threading.Thread(target=self._watch, daemon=True, name="tachyon-tp-watchdog").start()
        atexit.register(self.close, timeout=5.0)

    @classmethod
    def spawn(cls, args, size: int, init_method: str) -> Workers:
        procs = []
        for rank in range(1, size):
            p = subprocess.Popen([sys.executable, "-m", "tachyon.tp_worker"], stdin=subprocess.PIPE)
            p.stdin.write(pickle.dumps((args, rank, size, init_method)))
            p.stdin.flush()  # and kept open: its end is rank `rank`'s sign that this process is gone
            procs.append(p)
        return cls(procs)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _watch(self) -> None:
        while not self._stopping:
            for rank, p in enumerate(self.procs, start=1):
                code = p.poll()
                if code is not None and not self._stopping:
                    self.fault = (f"tensor-parallel worker rank {rank} (pid {p.pid}) exited with code {code}"
                                  + (f" (signal {signal.Signals(-code).name})" if code < 0 else ""))
                    logger.error("%s: the engine stops", self.fault)
                    return
            time.sleep(0.1)

    def wait_for_fault(self, timeout: float) -> str | None:
        """The fault, waiting up to `timeout` for the watchdog to see a worker's exit (a collective failed)."""
        deadline = time.monotonic() + timeout
        while self.fault is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.fault

    def close(self, timeout: float = 10.0) -> None:
        """Close the ranks' stdin (a rank still running exits on it), wait for them; kill what is still there.
        ModelRunner.shutdown sends them None first, so they exit on their own."""
        self._stopping = True
        for p in self.procs:
            if p.stdin is not None and not p.stdin.closed:
                try:
                    p.stdin.close()
                except OSError:
                    pass
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


def join_group(args, rank: int = 0, init_method: str | None = None) -> tuple[TensorParallel, Workers | None]:
    """This process's place in the tensor-parallel group of args.tensor_parallel_size ranks. Rank 0 under `mp`
    starts the others first (and gets their Workers); `external_launcher` reads the launcher's rendezvous."""
    size = args.tensor_parallel_size
    device = args.resolve_device()
    backend = "nccl" if device.type == "cuda" else "gloo"
    workers = None
    if args.distributed_executor_backend == "external_launcher":
        dist.init_process_group(backend, init_method="env://", timeout=START_TIMEOUT)
        if dist.get_world_size() != size:
            raise ValueError(f"the launcher started {dist.get_world_size()} ranks, tensor_parallel_size is {size}: "
                             f"make them equal (torchrun --nproc-per-node x --nnodes)")
        rank = dist.get_rank()
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
    else:
        if init_method is None:  # rank 0: start the others, then meet them
            init_method = f"tcp://127.0.0.1:{_free_port()}"
            workers = Workers.spawn(args, size, init_method)
        try:
            dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size,
                                    timeout=START_TIMEOUT)
        except BaseException:
            if workers is not None:
                workers.close()
            raise
        local_rank = rank
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)
    else:  # the ranks share this host's cores: more threads than cores make every collective wait for a core
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    cpu_group = dist.new_group(backend="gloo", timeout=MESSAGE_TIMEOUT)
    return TensorParallel(rank, size, group=dist.group.WORLD, cpu_group=cpu_group, local_rank=local_rank), workers


def launcher_rank(args) -> int:
    """This process's rank as an external launcher (torchrun) set it; 0 without one."""
    if args.tensor_parallel_size == 1 or args.distributed_executor_backend != "external_launcher":
        return 0
    return int(os.environ.get("RANK", "0"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
