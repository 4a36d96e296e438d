"""One rank of PyTorch DistributedDataParallel (gloo) training a job's torch model: the peer of
``bench.torch_peer``.

    python -m bench.ddp_mnist JOB.yaml --rank R --world W --port P --out RESULT.json [--allreduce]

Every rank builds the job's model (``spec.model``, its ``feed``), reads the job's training records,
and trains ``numEpochs`` epochs with the module's optimizer at the job's learning rate: each epoch
one permutation shared by the ranks, rank ``r`` taking every ``W``-th record, minibatches of
``minibatchSize`` per rank (DDP averages the ranks' gradients: an update of ``W x minibatchSize``
records, as a sync elasticps round of ``W`` workers). Rank 0 times the last epoch between two
barriers and scores the validation records at the end; it writes the JSON result.

With ``--allreduce``, no DDP wrapper: seed 001's all-reduce SSGD. Rank 0's initial parameters are
broadcast once; after each ``backward()`` every parameter's gradient is summed by its own
``all_reduce`` and divided by ``W``, then the optimizer steps.

Each rank runs ``local.fleet.worker_threads(cpus, W)`` intra-op threads, as ``elasticps run`` gives
each of its ``W`` workers.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from elasticps.api.parsing import load_job_file
from elasticps.backends.pytorch import trainer as torch_trainer
from elasticps.backends.pytorch.model_loading import load_torch_module
from elasticps.data.readers import ReaderOptions, open_reader
from elasticps.local.fleet import worker_threads
from elasticps.worker.cpu import available_cpus


def read(reader: str, path: str, options: ReaderOptions) -> tuple[np.ndarray, np.ndarray]:
    source = open_reader(reader, path, options)
    x, y = source.read(0, source.num_records)
    return np.asarray(x), np.asarray(y)


def average_gradients(model: torch.nn.Module, world: int) -> None:
    """Seed 001's SSGD step: one all_reduce (sum) per parameter's gradient, then / ``world``."""
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("job", type=Path)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--allreduce", action="store_true", help="seed 001's all-reduce SSGD instead of DDP")
    args = parser.parse_args(argv)
    job = load_job_file(args.job)
    spec, training = job.spec, job.spec.training
    torch_trainer.configure_threads(worker_threads(available_cpus(), args.world))
    torch_trainer.seed_everything(training.seed or 1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
    module = load_torch_module(spec.model.model_def)
    model = module.model(**spec.model.params)
    net: torch.nn.Module
    if args.allreduce:
        for p in model.parameters():  # the ranks start from rank 0's parameters, as DDP's do
            dist.broadcast(p.data, src=0)
        net = model
    else:
        net = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = module.optimizer(net.parameters())
    if training.learning_rate > 0:
        for group in optimizer.param_groups:
            group["lr"] = training.learning_rate
    options = ReaderOptions.of(spec.data)
    features, labels = read(spec.data.reader, spec.data.training, options)
    assert module.feed is not None, "the peer feeds records through the module's feed()"
    x, y = module.feed(features, labels, "training")
    batch = training.minibatch_size
    timed_s = 0.0
    for epoch in range(training.num_epochs):
        order = torch.from_numpy(np.random.default_rng(epoch).permutation(len(y)))[args.rank :: args.world]
        dist.barrier()
        started = time.perf_counter()
        net.train()
        for start in range(0, len(order), batch):
            index = order[start : start + batch]
            optimizer.zero_grad(set_to_none=True)
            loss = torch.mean(module.loss(net(x[index]), y[index]))
            loss.backward()  # type: ignore[no-untyped-call]
            if args.allreduce:
                average_gradients(model, args.world)
            optimizer.step()
        dist.barrier()
        timed_s = time.perf_counter() - started
    if args.rank == 0:
        vx, vy = module.feed(*read(spec.data.reader, spec.data.validation, options), "evaluation")
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(vx[i : i + 1000]).argmax(-1) == vy[i : i + 1000]).sum()) for i in range(0, len(vy), 1000))
        args.out.write_text(json.dumps({
            "examples_per_s_last_epoch": len(y) / timed_s, "last_epoch_s": timed_s,
            "test_accuracy": correct / len(vy), "examples": len(y) * training.num_epochs,
        }))  # fmt: skip
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
