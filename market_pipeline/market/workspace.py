"""Reusable (N, M) work buffers, and a small pool of them shared by successive solves.

Allocating a fresh 25 MB tensor costs several times more than the arithmetic on it (page
faults), so the follower and derivative kernels write into named buffers. A solve borrows a
workspace from the pool (exclusively, so concurrent solves never share one) and returns it:
the next tick's solve, with a population of any size up to the buffers' capacity, reuses the
memory. Follower states live in one of two *slots*, so that the current point and a trial
point never share buffers; everything else is scratch, valid until the next call using it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

POOL_SIZE = 2  # idle workspaces kept (the memory of one solve each)


class Workspace:
    SLOTS = 2

    def __init__(self, cols: int, device: torch.device, dtype: torch.dtype = torch.float64) -> None:
        self.cols = cols
        self.device = device
        self.dtype = dtype
        self._buffers: dict[str, torch.Tensor] = {}

    def take(self, name: str, count: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A contiguous (count, M) buffer (a prefix of one sized for the largest request)."""
        dtype = dtype or self.dtype
        key = f"{name}:{dtype}"
        held = self._buffers.get(key)
        if held is None or held.shape[0] < count:
            held = torch.empty((count, self.cols), dtype=dtype, device=self.device)
            self._buffers[key] = held
        return held[:count]

    @property
    def nbytes(self) -> int:
        """Memory the buffers hold (they grow to the largest population solved)."""
        return sum(t.element_size() * t.nelement() for t in self._buffers.values())

    def slot(self, index: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(effective price, demand) buffers of follower slot ``index``."""
        if not 0 <= index < self.SLOTS:
            raise ValueError(f"workspace slot {index} out of range")
        return self.take(f"y{index}", count), self.take(f"d{index}", count)


_POOL: list[Workspace] = []
_LOCK = threading.Lock()


@contextlib.contextmanager
def borrowed(cols: int, device: torch.device) -> Iterator[Workspace]:
    """A workspace for M = ``cols`` on ``device``, exclusively for the ``with`` block."""
    with _LOCK:
        fits = [w for w in _POOL if w.cols == cols and w.device == device]
        workspace = fits[-1] if fits else Workspace(cols, device)
        if fits:
            _POOL.remove(workspace)
    try:
        yield workspace
    finally:
        with _LOCK:
            _POOL.append(workspace)
            del _POOL[:-POOL_SIZE]


def pooled_bytes(cols: int, device: torch.device) -> int:
    """The largest idle workspace for M = ``cols`` on ``device`` (0 when none is pooled): the
    (N, M) working memory the last solves of that shape needed."""
    with _LOCK:
        return max((w.nbytes for w in _POOL if w.cols == cols and w.device == device), default=0)
