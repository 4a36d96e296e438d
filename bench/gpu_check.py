"""``python -m bench.gpu_check``: issue 36's GPU figure, one script for a lent GPU machine (under
8 minutes): ResNet-50 (``bench.resnet50``) on synthetic ImageNet-size batches.

1. **alone**: the model on the GPU in a plain torch loop (SGD, momentum), no PS: steps per second.
2. **elasticps**: ``elasticps run`` of a job with 2 PS + 1 torch worker on this machine, the worker
   on the GPU, once per mode (``--modes``: ``sync``, every step's gradients pushed and the model
   pulled back; ``localsgd8``, the model averaged on the PS every 8 local steps). Steps per second
   from the coordinator's count of records trained over a window after a warm-up; the run is then
   stopped (SIGINT, as Ctrl-C).

For each: GPU busy % (``nvidia-smi``'s ``utilization.gpu`` sampled every 200 ms over the window),
and for elasticps the PS data path's share of a step, ``1 - alone step time / elasticps step
time`` (what the step spends beyond the GPU's own work: pulls, pushes, waits). The compass goal is
>= 60 % busy. Writes ``--out`` (JSON; default ``$OUT/gpu_check.json`` when ``$OUT`` is set) and
prints a table.

    python -m bench.gpu_check [--batch 128] [--window 40] [--modes sync,localsgd8] [--out FILE]

``--small`` runs the same plumbing with a 32-pixel input and a short window (a check on a CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
MODES: dict[str, dict[str, Any]] = {"sync": {}, "localsgd8": {"localSGDSteps": 8}, "async": {"useAsync": True}}
CLASSES = 1000


class Synthetic:
    """A reader of ``N`` synthetic records (the path's last part is ``N``): each an index and a label."""

    def __init__(self, path: str, options: object = None) -> None:
        del options
        self.num_records = int(path.rsplit("/", 1)[-1])

    def read(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        index = np.arange(start, end, dtype=np.int64)
        return index[:, None], (index * 7919) % CLASSES


class GpuSampler:
    """``nvidia-smi``'s GPU utilisation every 200 ms while running (no samples without nvidia-smi)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._process: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        if shutil.which("nvidia-smi"):
            self._process = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
            self._thread = threading.Thread(target=self._read, daemon=True)
            self._thread.start()
        return self

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            try:
                self.samples.append(float(line.split(",")[0]))
            except ValueError:
                continue

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)

    def busy(self) -> float | None:
        return round(float(np.mean(self.samples)), 1) if self.samples else None


def alone(batch: int, window: float) -> dict[str, Any]:
    """Steps per second of the model trained alone on the device (no PS), and the GPU's busy %."""
    import torch

    from bench import resnet50

    device = resnet50.device()
    model = resnet50.model().to(device)
    optimizer = resnet50.optimizer(model.parameters())
    x = resnet50.images(batch)
    y = torch.randint(0, CLASSES, (batch,), device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        resnet50.loss(model(x), y).backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    for _ in range(5):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    steps, started = 0, time.perf_counter()
    with GpuSampler() as sampler:
        while time.perf_counter() - started < window:
            step()
            steps += 1
            if device.type == "cuda" and steps % 10 == 0:
                torch.cuda.synchronize()
        if device.type == "cuda":
            torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return {"steps_per_s": steps / seconds, "steps": steps, "seconds": seconds, "gpu_busy_percent": sampler.busy(),
            "device": str(device), "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None}  # fmt: skip


def job_document(name: str, batch: int, records: int, training: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "elasticps.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"framework": "torch", "modelDef": "bench.resnet50", "params": {}},
            "data": {"reader": "bench.gpu_check:Synthetic", "training": f"synthetic/{records}",
                     "validation": f"synthetic/{batch}"},  # fmt: skip
            "training": {"minibatchSize": batch, "numEpochs": 1, "recordsPerTask": batch * 8, "evaluationSteps": 0,
                         "learningRate": 0.1, **training},  # fmt: skip
            "ps": {"replicas": 2},
            "worker": {"replicas": 1},
        },
    }


def records_done(run_dir: Path) -> int | None:
    from elasticps.coordinator.client import CoordinatorClient
    from elasticps.local.fleet import observer_token

    port_file = run_dir / "ps-0.port"
    if not port_file.exists():
        return None
    client = CoordinatorClient(f"127.0.0.1:{int(port_file.read_text())}", worker="gpu-check", token=observer_token(run_dir))
    try:
        return int(client.status(timeout_s=2.0).records_done)
    except Exception:  # noqa: BLE001 - not up yet, or gone
        return None
    finally:
        client.close()


def elasticps_run(mode: str, batch: int, window: float, warmup: float, folder: Path) -> dict[str, Any]:
    """Steps per second of 2 PS + 1 torch worker in ``mode``, from the records the coordinator
    counts over ``window`` seconds once ``warmup`` seconds of training have passed."""
    records = batch * 8 * 2000  # more than the window trains: the run is stopped after it
    job = folder / f"{mode}.yaml"
    job.write_text(yaml.safe_dump(job_document(f"gpu-{mode}", batch, records, MODES[mode])))
    run_dir = folder / f"run-{mode}"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    log = (folder / f"{mode}.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "elasticps", "run", str(job), "--run_dir", str(run_dir)],
                               cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while (records_done(run_dir) or 0) <= 0:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{mode}: no record trained ({(folder / f'{mode}.log').read_text()[-3000:]})")
            time.sleep(0.5)
        time.sleep(warmup)
        # The count moves a task (8 minibatches) at a time: the rate is taken between the first and
        # the last moment it moved inside the window, both on a task's boundary.
        changes: list[tuple[float, int]] = []
        ends = time.monotonic() + window
        with GpuSampler() as sampler:
            while time.monotonic() < ends:
                done = records_done(run_dir)
                if done is not None and (not changes or done != changes[-1][1]):
                    changes.append((time.monotonic(), done))
                time.sleep(0.1)
        if len(changes) < 3:
            raise RuntimeError(f"{mode}: the records trained moved {len(changes) - 1} times in {window} s: a longer --window")
        (t1, r1), (t2, r2) = changes[1], changes[-1]  # changes[0]: the count as the window opened
        steps = (r2 - r1) / batch
        return {"steps_per_s": steps / (t2 - t1), "steps": steps, "seconds": t2 - t1, "gpu_busy_percent": sampler.busy()}
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
        log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--window", type=float, default=40.0, help="seconds measured per system")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds of an elasticps run before its window")
    parser.add_argument("--modes", default="sync,localsgd8")
    parser.add_argument("--small", action="store_true", help="32-pixel inputs: the plumbing, on a CPU")
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else None)
    args = parser.parse_args(argv)
    if args.small:
        os.environ["ELASTICPS_GPU_CHECK_SMALL"] = "1"  # before bench.resnet50 is imported, here and in the workers
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; known: {sorted(MODES)}")
    t0 = time.monotonic()
    result: dict[str, Any] = {"batch": args.batch, "window_s": args.window, "small": args.small}
    result["alone"] = alone(args.batch, args.window)
    print(f"alone: {result['alone']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        for mode in modes:
            measured = elasticps_run(mode, args.batch, args.window, args.warmup, Path(scratch))
            measured["vs_alone"] = measured["steps_per_s"] / result["alone"]["steps_per_s"]
            # 1 - alone's step time / this step time: what a step spends beyond the GPU's work.
            measured["ps_data_path_share"] = max(0.0, 1.0 - measured["vs_alone"])
            result[mode] = measured
            print(f"{mode}: {measured}", flush=True)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    print(f"\nResNet-50, batch {args.batch}, {result['alone']['device']} {result['alone'].get('gpu') or ''}")
    print(f"{'system':<22}{'steps/s':>10}{'vs alone':>10}{'GPU busy %':>12}{'PS share':>10}")
    for key in ["alone", *modes]:
        row = result[key]
        print(f"{key:<22}{row['steps_per_s']:>10.2f}{row.get('vs_alone', 1.0):>10.2f}"
              f"{str(row['gpu_busy_percent']):>12}{row.get('ps_data_path_share', 0.0):>10.2f}")  # fmt: skip
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
