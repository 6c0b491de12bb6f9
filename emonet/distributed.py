"""This process's place in a ``torchrun`` job, the same for collections, evaluation and training: its rank,
the job's size, its GPU, and the few collective steps they need (gather, barrier, close)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class Distributed:
    """A process of a torchrun job (world 1 when run plainly; then every step here does nothing)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    group: bool = False  # a process group was started (and is closed by :meth:`close`)

    @property
    def main(self) -> bool:
        """True on the process that reports and writes."""
        return self.rank == 0

    def device(self, asked: Optional[str]) -> Optional[str]:
        """The device this process works on: its own GPU (``cuda:LOCAL_RANK``) in a job on GPUs, else ``asked``."""
        if self.world > 1 and (asked is None or asked.startswith("cuda")):
            import torch
            if torch.cuda.is_available():
                return f"cuda:{self.local_rank}"
        return asked

    def gather(self, value: Any) -> list:
        """Every rank's ``value`` (picklable), on every rank, in rank order."""
        if not self.group:
            return [value]
        import torch.distributed as dist

        out: list = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def barrier(self) -> None:
        """Wait until every process is here."""
        if self.group:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        """Leave the job's process group."""
        if self.group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self.group = False


def join(asked_device: Optional[str]) -> Distributed:
    """Join the torchrun job there is (from its environment: RANK, WORLD_SIZE, LOCAL_RANK): NCCL where this
    process works on a GPU (that GPU made the current one, so work placed on "cuda" goes there), gloo on the
    CPU; a plain run is a job of one."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Distributed()
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    gpu = (asked_device is None or asked_device.startswith("cuda")) and torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if gpu else "gloo", device_id=torch.device(f"cuda:{local}") if gpu else None)
    return Distributed(dist.get_rank(), dist.get_world_size(), local, group=True)
