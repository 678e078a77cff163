"""How the example programs start: under torchrun (which sets the rank variables), or as
``python examples/<program>.py --world N``, which starts N ranks with ``mp.spawn`` on this
host. Either way ``main(args)`` runs once per rank with MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE and LOCAL_RANK set, as torch.distributed's ``env://`` expects."""

import argparse
import os
import socket
from typing import Callable

import torch.multiprocessing as mp

Main = Callable[[argparse.Namespace], None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned(rank: int, main: Main, args: argparse.Namespace, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(args.world), LOCAL_RANK=str(rank))
    main(args)


def run(main: Main, description: str,
        arguments: Callable[[argparse.ArgumentParser], None] = lambda parser: None) -> None:
    """Parses ``--world``, ``--save-dir`` and what ``arguments`` adds to the parser, and runs
    ``main`` on every rank."""
    parser = argparse.ArgumentParser(description=description)
    arguments(parser)
    parser.add_argument("--world", type=int, default=2,
                        help="ranks to start with mp.spawn (ignored under torchrun)")
    parser.add_argument("--save-dir", default=None,
                        help="where each rank saves its final parameters")
    args = parser.parse_args()
    if "TORCHELASTIC_RUN_ID" in os.environ:
        main(args)
    else:
        mp.spawn(_spawned, args=(main, args, _free_port()), nprocs=args.world)
