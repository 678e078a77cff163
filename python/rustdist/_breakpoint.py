"""``breakpoint``: a debugger on one rank while the others wait (torch.distributed's)."""

from __future__ import annotations

import pdb
import sys
import traceback
from datetime import timedelta
from typing import Any, Optional

from ._debug import logger
from .distributed_c10d import barrier, get_rank

_breakpoint_cache: dict[int, int] = {}


class _DistributedPdb(pdb.Pdb):
    """Pdb that reads the terminal (``/dev/stdin``) even when the rank's stdin is not."""

    def interaction(self, *args: Any, **kwargs: Any) -> None:
        saved = sys.stdin
        try:
            with open("/dev/stdin") as stdin:
                sys.stdin = stdin
                pdb.Pdb.interaction(self, *args, **kwargs)
        finally:
            sys.stdin = saved


def breakpoint(  # noqa: A001 - torch's name
    rank: int = 0, skip: int = 0, timeout_s: Optional[float] = 3600
) -> None:
    """Set a breakpoint, but only on a single rank. All other ranks will wait for you to be
    done with the breakpoint before continuing.

    Args:
        rank: Which rank to break on. Default: ``0``.
        skip: Skip the first ``skip`` calls to this breakpoint. Default: ``0``.
        timeout_s: How long the other ranks wait at the closing barrier (None: the group's
            timeout).
    """
    if skip > 0:
        key = hash(str(traceback.format_exc()))
        counter = _breakpoint_cache.get(key, 0) + 1
        _breakpoint_cache[key] = counter
        if counter <= skip:
            logger.warning("Skip the breakpoint, counter=%d", counter)
            return
    if get_rank() == rank:
        debugger = _DistributedPdb()
        debugger.message(
            "\n!!! ATTENTION !!!\n\n"
            f"Type 'up' to get to the frame that called dist.breakpoint(rank={rank})\n"
        )
        debugger.set_trace(sys._getframe().f_back)
    barrier(timeout=None if timeout_s is None else timedelta(seconds=timeout_s))


__all__ = ["breakpoint"]
