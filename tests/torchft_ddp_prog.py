"""One replica group (one rank) of tests/test_torchft.py's DDP run under torchft's Manager.

    python torchft_ddp_prog.py LIGHTHOUSE REPLICA_ID STEPS [HANG_AT]

Trains a small MLP with torchft's ``DistributedDataParallel`` and ``OptimizerWrapper`` over a
:class:`rustdist.torchft.ProcessGroupRustdist` that joins the replica groups, until the
Manager's step count reaches STEPS. LIGHTHOUSE is the lighthouse's ``http://host:port``.
The data are deterministic: step s of replica r trains on batch (s, r) of a fixed linear
teacher, so a replica that recovers at step s replays what an undisturbed run does.

Prints one JSON object a line (flushed): ``{"step": s, "committed": bool, "participants": n,
"quorum": id, "loss": x, "error": str or null}`` per attempt of a step (s is the Manager's
step when the attempt started; a committed attempt moves it to s + 1; error is what the
Manager recorded), then ``{"done": true, "step": STEPS, "final_loss": x,
"batches_committed": n}``, the final loss being the model's on a fixed held-out batch.

With HANG_AT the replica hangs in step HANG_AT once its quorum is formed, before its
forward pass, after printing ``{"step": HANG_AT, "hung": true}``: its peers block in that
step's allreduce until the driver kills it.
"""

from __future__ import annotations

import json
import sys
import threading
from datetime import timedelta
from typing import Any

import torch
from torch import nn
from torch.distributed import TCPStore
from torchft import Manager
from torchft.ddp import DistributedDataParallel
from torchft.optim import OptimizerWrapper

from rustdist.torchft import ProcessGroupRustdist

IN, HIDDEN, OUT, BATCH = 8, 16, 2, 32


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of a fixed linear teacher (plus a little noise), from ``seed``."""
    teacher = torch.Generator().manual_seed(1234)
    w = torch.randn(IN, OUT, generator=teacher)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, IN, generator=g)
    return x, x @ w + 0.01 * torch.randn(BATCH, OUT, generator=g)


def main() -> None:
    lighthouse, replica_id, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    hang_at = int(sys.argv[4]) if len(sys.argv) > 4 else None
    torch.set_num_threads(1)  # two replicas (and a restart) share a 2-core machine
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT))
    inner = torch.optim.SGD(model.parameters(), lr=0.05)

    def load_state_dict(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    # The Manager's store for this replica group (one rank: this process is its master).
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    pg = ProcessGroupRustdist(timeout=timedelta(seconds=10))
    manager = Manager(
        pg=pg,
        # Recovery needs a quorum of the survivor and the restarted replica: with 2, the
        # survivor waits for it instead of training on alone, and every step has 2 batches.
        min_replica_size=2,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=str(replica_id),
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse,
        hostname="127.0.0.1",
        timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=60),
        connect_timeout=timedelta(seconds=10),
        # Synchronous quorum: a recovering replica loads the checkpoint before its forward
        # pass, so it trains the step it recovered at on the recovered weights.
        use_async_quorum=False,
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = OptimizerWrapper(manager, inner)
    loss_fn = nn.MSELoss()
    while manager.current_step() < steps:
        optimizer.zero_grad()  # the quorum (and recovery) of this step
        step = manager.current_step()
        if step == hang_at:
            say(step=step, hung=True)
            threading.Event().wait()
        x, y = batch(step * 100 + replica_id)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        optimizer.step()  # commits when every replica's allreduce went through
        error = manager.errored()
        say(step=step, committed=manager.current_step() == step + 1,
            participants=manager.num_participants(), quorum=manager._quorum_id,
            loss=loss.item(), error=None if error is None else str(error))
    with torch.no_grad():
        x, y = batch(999_999)
        final = loss_fn(model(x), y).item()
    say(done=True, step=manager.current_step(), final_loss=final,
        batches_committed=manager.batches_committed())
    manager.shutdown(wait=False)
    pg.shutdown()


if __name__ == "__main__":
    main()
