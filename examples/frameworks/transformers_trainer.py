"""The Hugging Face transformers Trainer on the rustdist backend, on CPU: a tiny GPT-2 made
from a config (no download) trained on random token ids.

    torchrun --nproc-per-node 2 examples/frameworks/transformers_trainer.py [--backend gloo]

The Trainer hands ``ddp_backend`` to accelerate, which in a multi-CPU run refuses any name but
gloo or mpi ("Your assigned backend rustdist is not available, please use gloo";
TrainingArguments' own list of choices has no "rustdist" either), but keeps a process group
that is already there: initialise it first and leave ``ddp_backend`` unset. ``use_cpu=True``
makes it a multi-CPU run; without it, on a machine with no GPU, each process trains alone.
Each rank prints its losses and a digest of the final parameters (tests/test_frameworks.py
compares them with gloo's run of this program).
"""

import argparse
import tempfile
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import rustdist  # noqa: F401 - registers the backend (torch 2.14+ finds it without this)
from result import report  # this folder's: the line the test reads


class RandomTokens(torch.utils.data.Dataset):
    """64 sequences of 16 random token ids, the same on every rank (the Trainer shards them)."""

    def __init__(self) -> None:
        self.ids = torch.randint(0, 64, (64, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class LossRecordingTrainer(Trainer):
    """The Trainer, keeping this rank's loss of every step (its logs hold the ranks' mean)."""

    losses: list[float] = []

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any], *args: Any,
                     **kwargs: Any) -> Any:
        out = super().compute_loss(model, inputs, *args, **kwargs)
        self.losses.append((out[0] if isinstance(out, tuple) else out).item())
        return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="rustdist")
    args = parser.parse_args()
    dist.init_process_group(args.backend)  # before the Trainer; ddp_backend stays unset
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    with tempfile.TemporaryDirectory() as out:
        training_args = TrainingArguments(
            output_dir=out, use_cpu=True, per_device_train_batch_size=8, max_steps=4,
            learning_rate=1e-3, seed=0, report_to=[], save_strategy="no",
            logging_strategy="no", disable_tqdm=True, ddp_find_unused_parameters=False)
        trainer = LossRecordingTrainer(model=model, args=training_args,
                                       train_dataset=RandomTokens())
        trainer.train()
    report(training_args.process_index, trainer.losses, model)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
