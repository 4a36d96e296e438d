"""The ElasticDL-style TFRecord example, measured: accuracy against one process, and a PS killed mid-run.

    python -m bench.zoo_tfrecord [--repeats 3] [--checkpoint_steps 20] [--seed 0] [--work /tmp/elasticps-zoo-tfrecord]

Needs MNIST as TFRecord files (``make mnist-tfrecord``). Runs ``examples/mnist-tfrecord.yaml``
(``elasticps.backends.keras.zoo.mnist_functional``: functional Keras with a dict input, BatchNormalization,
``dataset_fn`` over ``tf.train.Example``; 2 PS, 2 workers, sync, minibatch 64, 2 epochs) with
``elasticps run --run_dir --result_file``, from a copy of the example that only adds
``checkpointSteps`` (both jobs checkpoint alike):

* **no kill**: the job as it is; its test accuracy, final model version and exported model;
* **kill**: the same job; when its model version passes a random 40-60% of the first job's final
  version, both workers are frozen (SIGSTOP), PS 1 is killed with SIGKILL, and once the
  coordinator has rolled every shard and its ledger back to one checkpointed version, every
  shard's BatchNorm statistics are pulled with ``PSClient`` and compared with the ``state/<name>``
  arrays of that shard's checkpoint at that version (the killed shard serves what it restored, the
  surviving one what it rolled back to); then the workers go on and the job finishes. The workers
  are frozen only so that nothing moves on the shards between the rollback and the pull;
* **one process**: ``bench.one_process`` on the same module and data, for the first job's final
  version as ``--updates`` and 2 x 64 records a minibatch (a sync round averages both workers').

Each kind runs ``--repeats`` times (the jobs interleaved): one run's final accuracy varies by about
a point. Every model (each job's export, each one-process model) is also evaluated with its
BatchNorm statistics recalibrated on 10,000 training records (``bench.one_process``): the moving
statistics lag behind the weights by a different amount at each version, which swings one
evaluation by up to 2 points in one process as in a job, while the recalibrated accuracy measures
the weights. The report gives each kind's mean with a 95% confidence interval (Student's t over the
runs) and the differences of the means with Welch's interval, both ways. Writes ``bench/results/zoo_tfrecord.json`` and the "Measured" section of ``docs/model-zoo.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from elasticps.coordinator.client import CoordinatorClient
from elasticps.local.fleet import observer_token
from elasticps.ps import checkpoint
from elasticps.psclient.client import PSClient

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "mnist-tfrecord.yaml"
DOC = REPO / "docs" / "model-zoo.md"
SECTION = "## Measured: `examples/mnist-tfrecord.yaml`"
ROLLED_BACK = re.compile(r"every shard and the task ledger rolled back to version (\d+) \(incarnation (\d+)\)")
RESUMED = re.compile(r"PS 1 resumes at version (\d+)")
KILLED = 1  # the PS shard killed


def env() -> dict[str, str]:
    """This checkout's code in every process the bench starts."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": path}


def job(checkpoint_steps: int) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    document["spec"]["training"]["checkpointSteps"] = checkpoint_steps
    return document


def start(work: Path, document: dict[str, Any]) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """``elasticps run`` of ``document`` in ``work`` (its output folder, relative, lands there too)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "job.yaml").write_text(yaml.safe_dump(document))
    run_dir, result = work / "run", work / "result.json"
    command = [sys.executable, "-m", "elasticps", "run", "job.yaml", "--run_dir", "run", "--result_file", "result.json"]
    with open(work / "run.out", "wb") as out:
        process = subprocess.Popen(command, cwd=work, env=env(), stdout=out, stderr=subprocess.STDOUT)
    return process, run_dir, result


def finish(process: subprocess.Popen[bytes], work: Path, what: str) -> dict[str, Any]:
    if process.wait() != 0:
        tail = (work / "run.out").read_text(errors="replace")[-3000:]
        raise SystemExit(f"the {what} job failed (exit {process.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads((work / "result.json").read_text())
    return result


def summary(result: dict[str, Any]) -> dict[str, Any]:
    keys = ("metrics", "model_version", "shard_versions", "epoch_records", "restarts", "tasks_requeued", "elapsed_s")
    return {key: result[key] for key in keys}


def no_kill(work: Path, checkpoint_steps: int) -> dict[str, Any]:
    process, _, _ = start(work, job(checkpoint_steps))
    result = finish(process, work, "no-kill")
    exported = work / result["export_path"] if result.get("export_path") else None  # relative to the run's cwd
    return {
        **summary(result),
        "export_path": str(exported) if exported else None,
        "exported_model": bool(exported and (exported / "model.keras").is_file()),
    }


def wait_for(predicate: Any, timeout: float, what: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the job ended while waiting for {what}")
        try:
            if predicate():
                return
        except Exception:  # PS 0 still starting, or back from a restart
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def statistics(values: dict[str, np.ndarray]) -> dict[str, Any]:
    return {name: {"mean": float(np.mean(v)), "min": float(np.min(v)), "max": float(np.max(v))} for name, v in values.items()}


def kill(work: Path, checkpoint_steps: int, moment: int) -> dict[str, Any]:
    document = job(checkpoint_steps)
    name, shards = document["metadata"]["name"], int(document["spec"]["ps"]["replicas"])
    workers = int(document["spec"]["worker"]["replicas"])
    process, run_dir, _ = start(work, document)
    wait_for(lambda: all((run_dir / f"ps-{i}.port").exists() for i in range(shards)), 120, "the PS to serve", process)
    addresses = [f"127.0.0.1:{int((run_dir / f'ps-{i}.port').read_text())}" for i in range(shards)]
    coordinator = CoordinatorClient(addresses[0], worker="bench", token=observer_token(run_dir))
    wait_for(lambda: coordinator.status().model_version >= moment, 900, f"version {moment}", process)

    pids = [int((run_dir / f"{name}-worker-{i}.pid").read_text()) for i in range(workers)]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    observer = PSClient(addresses, worker="bench-observer", deadline_s=120.0, timeout_s=60.0, token=observer_token(run_dir))
    try:
        before = observer.pull([-1] * shards)
        ps0_log = run_dir / f"{name}-ps-0.log"
        os.kill(int((run_dir / f"{name}-ps-{KILLED}.pid").read_text()), signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(lambda: ROLLED_BACK.search(ps0_log.read_text()) is not None, 300, "the rollback", process)
        rollback_s = time.monotonic() - killed_at
        version, incarnation = (int(g) for g in ROLLED_BACK.findall(ps0_log.read_text())[-1])
        after = observer.pull([-1] * shards)
        saved = {s: checkpoint.load(checkpoint.path_of(run_dir / "checkpoints" / f"ps-{s}", version)) for s in range(shards)}
    finally:
        observer.close()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    checks = []
    for tensor in sorted(after.state):
        shard = next(s for s in range(shards) if f"state/{tensor}" in saved[s].arrays)  # placed by size
        stored = saved[shard].arrays[f"state/{tensor}"]
        served = after.state[tensor]
        initial = 0.0 if tensor.endswith("moving_mean") else 1.0
        checks.append(
            {
                "tensor": tensor,
                "shard": shard,
                "restored_by": "restart from its checkpoint" if shard == KILLED else "rollback of a live shard",
                "shape": list(served.shape),
                "equal_to_checkpoint": bool(served.shape == stored.shape and np.array_equal(served, stored)),
                "initial": initial,
                "not_initial": not bool(np.allclose(served, initial, atol=1e-3)),
                "served_mean": float(np.mean(served)),
                "checkpoint_mean": float(np.mean(stored)),
                "before_kill_mean": float(np.mean(before.state[tensor])) if tensor in before.state else None,
            }
        )
    resumed = RESUMED.findall((run_dir / f"{name}-ps-{KILLED}.log").read_text())
    result = finish(process, work, "kill")
    exported = work / result["export_path"] if result.get("export_path") else None
    return {
        "killed_shard": KILLED,
        "killed_at_version": max(before.versions),
        "rolled_back_to": version,
        "incarnation": incarnation,
        "killed_shard_resumed_at": int(resumed[-1]) if resumed else None,
        "served_versions": after.versions,
        "rollback_seconds": round(rollback_s, 1),
        "bn_statistics": checks,
        "bn_ok": bool(checks) and all(c["equal_to_checkpoint"] and c["not_initial"] for c in checks)
        and after.versions == [version] * shards,
        **summary(result),
        "export_path": str(exported) if exported else None,
    }


def recalibrated(work: Path, run: dict[str, Any], what: str) -> dict[str, Any]:
    """``run`` with ``metrics_recalibrated``: its exported model with BatchNorm statistics estimated
    anew from training records (``bench.one_process --exported``)."""
    if not run.get("export_path"):
        return run
    result_file = work / f"recalibrated-{what}.json"
    command = [
        sys.executable, "-m", "bench.one_process", "--model_def", "elasticps.backends.keras.zoo.mnist_functional",
        "--exported", run["export_path"], "--minibatch", "128", "--result_file", str(result_file),
    ]  # fmt: skip
    subprocess.run(command, cwd=REPO, env=env(), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = json.loads(result_file.read_text())
    return {**run, "metrics_recalibrated": result.get("metrics_recalibrated")}


def one_process(work: Path, updates: int, minibatch: int, seed: int) -> dict[str, Any]:
    result_file = work / f"one-process-{seed}.json"
    work.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "bench.one_process", "--model_def", "elasticps.backends.keras.zoo.mnist_functional",
        "--updates", str(updates), "--minibatch", str(minibatch), "--seed", str(seed), "--result_file", str(result_file),
    ]  # fmt: skip
    subprocess.run(command, cwd=REPO, env=env(), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result: dict[str, Any] = json.loads(result_file.read_text())
    return result


def accuracies(runs: list[dict[str, Any]], metrics: str = "metrics") -> list[float]:
    return [float(run[metrics]["accuracy"]) for run in runs if run.get(metrics)]


# Student's t, two-sided 95%, by degrees of freedom (1-30; beyond, 1.96 is close enough).
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
       2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]  # fmt: skip


def t95(df: float) -> float:
    return T95[min(len(T95), max(1, int(df))) - 1] if df < 31 else 1.96


def interval(values: list[float]) -> dict[str, Any]:
    """Mean and its 95% confidence half-width, in points (None with fewer than 2 runs)."""
    n = len(values)
    if n < 2:
        return {"n": n, "mean": round(100 * mean(values), 2) if values else None, "half_width": None}
    sd = float(np.std(values, ddof=1))
    return {"n": n, "mean": round(100 * mean(values), 2), "half_width": round(100 * t95(n - 1) * sd / n**0.5, 2)}


def difference(a: list[float], b: list[float]) -> dict[str, Any]:
    """mean(a) - mean(b) in points, with Welch's 95% confidence half-width."""
    if len(a) < 2 or len(b) < 2:
        return {"difference": points(mean(a), mean(b)) if a and b else None, "half_width": None}
    va, vb = float(np.var(a, ddof=1)) / len(a), float(np.var(b, ddof=1)) / len(b)
    se = (va + vb) ** 0.5
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if se > 0 else len(a) + len(b) - 2
    return {"difference": points(mean(a), mean(b)), "half_width": round(100 * t95(df) * se, 2)}


def comparisons(plain: list[dict[str, Any]], killed: list[dict[str, Any]], alone: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind of evaluation (as trained; BatchNorm recalibrated): each kind's mean with its 95%
    interval, and both differences of means with theirs."""
    out: dict[str, Any] = {}
    for metrics in ("metrics", "metrics_recalibrated"):
        a, k, o = accuracies(plain, metrics), accuracies(killed, metrics), accuracies(alone, metrics)
        out[metrics] = {
            "no_kill": interval(a),
            "kill": interval(k),
            "one_process": interval(o),
            "no_kill_minus_one_process": difference(a, o),
            "kill_minus_no_kill": difference(k, a),
        }
    return out


def settles(d: dict[str, Any]) -> str:
    """Whether a difference with its interval settles "within 1 point" either way."""
    if d["half_width"] is None:
        return "one run: no interval"
    low, high = d["difference"] - d["half_width"], d["difference"] + d["half_width"]
    if -1 <= low and high <= 1:
        return "within 1 point"
    if high < -1 or low > 1:
        return "NOT within 1 point"
    return "not settled by these runs"


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def points(a: float, b: float) -> float:
    return round(100 * (a - b), 2)


def within(difference: float) -> str:
    return "within 1 point" if abs(difference) <= 1 else "NOT within 1 point"


def report(results: dict[str, Any]) -> str:
    plain, killed, alone = results["no_kill"], results["kill"], results["one_process"]
    d, m = results["differences_points"], results["accuracy_mean"]
    n = len(plain)
    lines = [
        SECTION,
        "",
        f"Measured by `python -m bench.zoo_tfrecord --repeats {n} --checkpoint_steps {results['checkpoint_steps']} "
        f"--seed {results['seed']}` on this project's",
        "2-core machine (busy with other jobs), MNIST as TFRecord files as above, each of the following",
        f"{n} times, interleaved: the example as it is (2 PS, 2 workers, sync, minibatch 64, 2 epochs) with",
        f"`checkpointSteps: {results['checkpoint_steps']}` added; the same job with PS 1 killed (SIGKILL) when its "
        "model version passed a random",
        f"40-60% of the first job's; and `bench.one_process` (seeds {results['seed']}..{results['seed'] + n - 1}) on "
        f"{alone[0]['updates']} updates of {alone[0]['minibatch']} records (the jobs' final",
        "version without a kill, 2 workers x 64 records).",
        "",
        "| run | test accuracy | BatchNorm recalibrated | loss | final model version | records per epoch | replicas replaced | rolled back to | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def again(run: dict[str, Any]) -> str:
        return f"{run['metrics_recalibrated']['accuracy']:.4f}" if run.get("metrics_recalibrated") else "-"

    for i, run in enumerate(plain, 1):
        lines.append(
            f"| job {i}, no kill | {run['metrics']['accuracy']:.4f} | {again(run)} | {run['metrics']['loss']:.4f} | {run['model_version']} "
            f"| {run['epoch_records']} | {run['restarts']} | - | {run['elapsed_s']:.0f} |"
        )
    for i, run in enumerate(killed, 1):
        lines.append(
            f"| job {i}, PS 1 killed at version {run['killed_at_version']} | {run['metrics']['accuracy']:.4f} | {again(run)} "
            f"| {run['metrics']['loss']:.4f} | {run['model_version']} | {run['epoch_records']} | {run['restarts']} "
            f"| {run['rolled_back_to']} | {run['elapsed_s']:.0f} |"
        )
    for run in alone:
        lines.append(
            f"| one process, seed {run['seed']} | {run['metrics']['accuracy']:.4f} | {again(run)} | {run['metrics']['loss']:.4f} "
            f"| {run['updates']} updates | - | - | - | {run['train_seconds']:.0f} (training) |"
        )
    lines += [
        "",
        f"Mean test accuracy: {m['no_kill']:.4f} without the kill, {m['kill']:.4f} with it, {m['one_process']:.4f} "
        "in one process.",
        "",
        f"- Jobs without the kill minus one process: {d['no_kill_minus_one_process']:+.2f} points on the means "
        f"({within(d['no_kill_minus_one_process'])}); run by run against the mean of one process: "
        + ", ".join(f"{x:+.2f}" for x in d["each_no_kill_minus_one_process"])
        + ".",
        f"- Jobs with the kill minus jobs without: {d['kill_minus_no_kill']:+.2f} points on the means "
        f"({within(d['kill_minus_no_kill'])}); run by run against the mean without the kill: "
        + ", ".join(f"{x:+.2f}" for x in d["each_kill_minus_no_kill"])
        + f". Final accuracies of jobs without a kill alone span {d['spread_no_kill']:.2f} points.",
    ]
    for metrics, what in (("metrics", "as trained"), ("metrics_recalibrated", "BatchNorm recalibrated")):
        c = results.get("comparisons", {}).get(metrics)
        if not c or c["no_kill"]["half_width"] is None:
            continue
        kinds = ", ".join(
            f"{label} {c[key]['mean']:.2f} +- {c[key]['half_width']:.2f}"
            for key, label in (("no_kill", "without the kill"), ("kill", "with it"), ("one_process", "one process"))
            if c[key]["half_width"] is not None
        )
        lines.append(
            f"- Test accuracy {what}, means in points with 95% intervals: {kinds}. Jobs without the kill minus one "
            f"process {c['no_kill_minus_one_process']['difference']:+.2f} +- {c['no_kill_minus_one_process']['half_width']:.2f} "
            f"({settles(c['no_kill_minus_one_process'])}); with the kill minus without "
            f"{c['kill_minus_no_kill']['difference']:+.2f} +- {c['kill_minus_no_kill']['half_width']:.2f} "
            f"({settles(c['kill_minus_no_kill'])})."
        )
    lines += [
        "- Each rollback (every shard and the task ledger back to one checkpointed version): "
        + "; ".join(
            f"killed at {k['killed_at_version']}, rolled back to {k['rolled_back_to']} (killed shard resumed at "
            f"{k['killed_shard_resumed_at']}), {k['rollback_seconds']} s after the kill"
            for k in killed
        )
        + ".",
        "- Every job without a kill exported its model (`model.keras` under `spec.output`): "
        + ("yes." if all(run["exported_model"] for run in plain) else "NO."),
        "",
        "BatchNorm statistics served by the shards right after each rollback (workers frozen from just",
        "before the kill until the pull), against the `state/<name>` arrays of each shard's checkpoint at",
        "the version rolled back to:",
        "",
        "| kill run | rolled back to | tensor | shard | restored by | equal to the checkpoint | mean served | mean in the checkpoint | initial value | mean before the kill |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, run in enumerate(killed, 1):
        for c in run["bn_statistics"]:
            before = "-" if c["before_kill_mean"] is None else f"{c['before_kill_mean']:.4f}"
            lines.append(
                f"| {i} | {run['rolled_back_to']} | `{c['tensor']}` ({c['shape'][0]}) | {c['shard']} | {c['restored_by']} | "
                f"{'yes' if c['equal_to_checkpoint'] else 'NO'} | {c['served_mean']:.4f} | {c['checkpoint_mean']:.4f} "
                f"| {c['initial']:g} | {before} |"
            )
    if any(abs(d[key]) > 1 for key in ("no_kill_minus_one_process", "kill_minus_no_kill")):
        spread_one = points(max(accuracies(alone)), min(accuracies(alone)))
        lines += [
            "",
            f"Read with care: the final accuracy of one run is noisy here (identical jobs without a kill span "
            f"{d['spread_no_kill']:.2f} points, one process over {n} seeds {spread_one:.2f}; the model is evaluated "
            "once, after the last update of SGD at a constant learning rate 0.1, with BatchNorm's moving "
            f"statistics), so {n} runs a kind do not settle a 1-point criterion either way.",
        ]
    lines += [
        "",
        "In every kill run the statistics came back bit for bit from the checkpoint, not as the initial 0 and 1."
        if all(run["bn_ok"] for run in killed)
        else "The BatchNorm check FAILED in at least one run: see `bench/results/zoo_tfrecord.json`.",
    ]
    return "\n".join(lines) + "\n"


def write_doc(section: str) -> None:
    text = DOC.read_text()
    head = text.split(SECTION)[0].rstrip()
    DOC.write_text(head + "\n\n" + section)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each kind (final accuracies vary by about a point)")
    parser.add_argument("--checkpoint_steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0, help="picks the moments of the kills; the first one-process seed")
    parser.add_argument("--work", type=Path, default=Path("/tmp/elasticps-zoo-tfrecord"))
    parser.add_argument("--report_only", action="store_true", help="rewrite the doc from bench/results/zoo_tfrecord.json")
    args = parser.parse_args()
    if args.report_only:
        write_doc(report(json.loads((REPO / "bench" / "results" / "zoo_tfrecord.json").read_text())))
        return
    example = yaml.safe_load(EXAMPLE.read_text())["spec"]
    minibatch = int(example["training"]["minibatchSize"]) * int(example["worker"]["replicas"])
    rng = random.Random(args.seed)

    plain: list[dict[str, Any]] = []
    killed: list[dict[str, Any]] = []
    for i in range(args.repeats):
        print(f"run {i + 1}: the example, no kill ...", flush=True)
        plain.append(recalibrated(args.work, no_kill(args.work / f"no-kill-{i}", args.checkpoint_steps), f"no-kill-{i}"))
        print(plain[-1], flush=True)
        fraction = rng.uniform(0.4, 0.6)
        moment = int(fraction * plain[0]["model_version"])
        print(f"run {i + 1}: the example, PS {KILLED} killed at version {moment} ...", flush=True)
        killed_run = kill(args.work / f"kill-{i}", args.checkpoint_steps, moment)
        killed.append({"kill_fraction": round(fraction, 3), **recalibrated(args.work, killed_run, f"kill-{i}")})
        print(killed[-1], flush=True)
    updates = plain[0]["model_version"]
    alone = []
    for seed in range(args.seed, args.seed + args.repeats):
        print(f"one process, {updates} updates of {minibatch}, seed {seed} ...", flush=True)
        alone.append({"seed": seed, **one_process(args.work, updates, minibatch, seed)})
        print(alone[-1], flush=True)

    means = {"no_kill": mean(accuracies(plain)), "kill": mean(accuracies(killed)), "one_process": mean(accuracies(alone))}
    results = {
        "job": "examples/mnist-tfrecord.yaml",
        "repeats": args.repeats,
        "checkpoint_steps": args.checkpoint_steps,
        "seed": args.seed,
        "accuracy_mean": {k: round(v, 5) for k, v in means.items()},
        "differences_points": {
            "no_kill_minus_one_process": points(means["no_kill"], means["one_process"]),
            "kill_minus_no_kill": points(means["kill"], means["no_kill"]),
            "each_no_kill_minus_one_process": [points(a, means["one_process"]) for a in accuracies(plain)],
            "each_kill_minus_no_kill": [points(a, means["no_kill"]) for a in accuracies(killed)],
            "spread_no_kill": points(max(accuracies(plain)), min(accuracies(plain))),
        },
        "comparisons": comparisons(plain, killed, alone),
        "bn_ok": all(run["bn_ok"] for run in killed),
        "no_kill": plain,
        "kill": killed,
        "one_process": alone,
    }
    (REPO / "bench" / "results").mkdir(exist_ok=True)
    (REPO / "bench" / "results" / "zoo_tfrecord.json").write_text(json.dumps(results, indent=1) + "\n")
    section = report(results)
    write_doc(section)
    print(section)


if __name__ == "__main__":
    main()
