"""ElasticDL's zoo modules as published, through ``elasticps run`` and in one process (issue 39).

    python -m bench.elasticdl_zoo --elasticdl PATH [--records 10000] [--epochs 2] [--no_write]

``PATH`` is a copy of ElasticDL's repository (a work tree, or a bare git directory, whose ``HEAD``
is read). Its ``model_zoo/mnist`` and ``model_zoo/cifar10`` modules are copied into a temporary
folder with only their ``from elasticdl.python... import`` lines rewritten to
``from elasticps.elasticdl import ...`` (:func:`rewritten`; the count of lines changed is reported:
nothing else moves), and trained on data written here: ``--records`` MNIST training images from
``../shared/data/mnist`` (and 2,000 test images) in ElasticDL's TFRecord layout, and generated
32x32x3 images of 10 classes for cifar10 (a class's colour pattern under heavy noise; a
third as many records).

Each module: ``elasticps run`` with 2 PS and 2 workers, asynchronous (every worker's gradient is
one update, as one process's minibatch is), minibatch 64, ``--epochs`` epochs, the module on
``PYTHONPATH`` and named as ElasticDL's ``--model_def`` names it; then ``bench.one_process`` on
the same module and data for as many updates of 64 records as the job's model version (the
module's learning-rate schedule by update). Reported: each side's validation accuracy (as trained,
and with BatchNormalization's statistics recalibrated, ``bench/one_process.py``), the difference,
what the export holds (``loading.json``), and the learning rate the PS applied by model version
(the export's TensorBoard ``train/learning_rate``: cifar10's ``callbacks()`` drops it from 0.1 to
0.01 at version 5,000, so its run must pass that: ``--cifar_records 10000 --cifar_epochs 36``
trains 5,625 updates). Writes ``bench/results/elasticdl_zoo.json``, the ``elasticdl-zoo`` region
of ``docs/model-zoo.md`` and ``docs/img/elasticdl-zoo-schedule.png``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.doc_regions import write_region

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "elasticdl_zoo.json"
DOC = ROOT / "docs" / "model-zoo.md"
PLOT = ROOT / "docs" / "img" / "elasticdl-zoo-schedule.png"
MNIST = ROOT.parent / "shared" / "data" / "mnist"
PACKAGES = ("mnist", "cifar10", "deepfm_edl_embedding")
MODULES = {  # modelDef as ElasticDL names it: the data it trains on
    "model_zoo.mnist.mnist_functional_api.custom_model": "mnist",
    "model_zoo.mnist.mnist_subclass.CustomModel": "mnist",
    "model_zoo.cifar10.cifar10_functional_api.custom_model": "cifar10",
    "model_zoo.deepfm_edl_embedding.deepfm_edl_embedding.custom_model": "ctr",
}
CTR_FIELDS, CTR_VOCABULARY = 10, 5383  # deepfm_edl_embedding's: 10 ids a record, below its input_dim
VALIDATION = 2000
# One import statement from elasticdl.python (a name list, possibly parenthesised over lines).
IMPORT = re.compile(r"^from elasticdl\.python(?:\.\w+)* import (\([^)]*\)|[^\n]*)$", re.MULTILINE)


def rewritten(source: str) -> tuple[str, int]:
    """``source`` with each ``from elasticdl.python.X import names`` made ``from
    elasticps.elasticdl import names``, and how many lines changed."""
    changed = 0

    def one(match: re.Match[str]) -> str:
        nonlocal changed
        changed += match.group(0).count("\n") + 1
        return f"from elasticps.elasticdl import {match.group(1)}"

    return IMPORT.sub(one, source), changed


def copy_zoo(elasticdl: Path, into: Path) -> int:
    """The zoo's packages of :data:`PACKAGES`, rewritten into ``into/model_zoo``; lines changed."""
    bare = not (elasticdl / "model_zoo").is_dir()
    git = ["git", "--git-dir", str(elasticdl)] if bare else ["git", "-C", str(elasticdl)]
    names = subprocess.run([*git, "ls-tree", "-r", "--name-only", "HEAD", "model_zoo/"], check=True,
                           capture_output=True, text=True).stdout.split()  # fmt: skip
    changed = 0
    (into / "model_zoo").mkdir(parents=True, exist_ok=True)
    (into / "model_zoo" / "__init__.py").write_text("")
    for name in names:
        parts = name.split("/")
        if len(parts) != 3 or parts[1] not in PACKAGES or not name.endswith(".py"):
            continue
        text = subprocess.run([*git, "show", f"HEAD:{name}"], check=True, capture_output=True, text=True).stdout
        text, count = rewritten(text)
        changed += count
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        (into / name).write_text(text)
    return changed


def write_records(path: Path, images: np.ndarray, labels: np.ndarray) -> None:
    import tensorflow as tf

    from elasticps.backends.keras.zoo.mnist_functional import example

    with tf.io.TFRecordWriter(str(path)) as writer:
        for image, label in zip(images, labels):
            writer.write(example(image, int(label)))


def cifar_like(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` 32x32x3 images (pixel values 0-255) of 10 classes: each class a smooth colour
    pattern of its own (an 8x8 grid of colours, upsampled), shifted by up to 4 pixels, under noise."""
    patterns = np.random.default_rng(1234).uniform(0, 1, (10, 8, 8, 3)).repeat(4, axis=1).repeat(4, axis=2)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, count)
    shifts = rng.integers(-4, 5, (count, 2))
    images = np.stack([np.roll(patterns[c], tuple(s), axis=(0, 1)) for c, s in zip(labels, shifts)])
    images = 0.5 * images + rng.normal(0, 0.35, images.shape)
    return (np.clip(images, 0, 1) * 255).astype(np.float32), labels


def ctr_like(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` records of :data:`CTR_FIELDS` ids in [1, :data:`CTR_VOCABULARY`) (0 is the
    module's mask), Zipf-distributed as categorical features are, and a click drawn from a logistic
    model of a hidden weight per id: what DeepFM's first-order terms can learn."""
    weights = np.random.default_rng(4321).normal(0, 1.0, CTR_VOCABULARY)
    rng = np.random.default_rng(seed)
    ids = rng.zipf(1.2, (count, CTR_FIELDS)) % (CTR_VOCABULARY - 1) + 1
    logits = 2 * weights[ids].sum(axis=1) / np.sqrt(CTR_FIELDS)
    clicks = (rng.uniform(size=count) < 1 / (1 + np.exp(-logits))).astype(np.int64)
    return ids.astype(np.int64), clicks


def write_ctr_records(path: Path, ids: np.ndarray, clicks: np.ndarray) -> None:
    """ElasticDL's layout for its DeepFM: ``feature`` (the ids, int64) and ``label`` (int64)."""
    import tensorflow as tf

    def int64s(values: list[int]) -> tf.train.Feature:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    with tf.io.TFRecordWriter(str(path)) as writer:
        for row, click in zip(ids, clicks):
            features = tf.train.Features(feature={"feature": int64s(row.tolist()), "label": int64s([int(click)])})
            writer.write(tf.train.Example(features=features).SerializeToString())


def write_data(work: Path, records: int, cifar_records: int, ctr_records: int) -> dict[str, tuple[Path, Path]]:
    from elasticps.data.readers import IdxReader

    train, test = IdxReader(str(MNIST / "train")), IdxReader(str(MNIST / "t10k"))
    data = {"mnist": (work / "mnist-train.tfrecord", work / "mnist-test.tfrecord"),
            "cifar10": (work / "cifar-train.tfrecord", work / "cifar-test.tfrecord"),
            "ctr": (work / "ctr-train.tfrecord", work / "ctr-test.tfrecord")}  # fmt: skip
    write_records(data["mnist"][0], *train.read(0, records))
    write_records(data["mnist"][1], *test.read(0, VALIDATION))
    write_records(data["cifar10"][0], *cifar_like(cifar_records, seed=0))
    write_records(data["cifar10"][1], *cifar_like(VALIDATION, seed=1))
    write_ctr_records(data["ctr"][0], *ctr_like(ctr_records, seed=0))
    write_ctr_records(data["ctr"][1], *ctr_like(VALIDATION, seed=1))
    return data


def environment(zoo: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(zoo), os.environ.get("PYTHONPATH")]))}


def job(work: Path, zoo: Path, model_def: str, data: tuple[Path, Path], epochs: int) -> dict[str, Any]:
    name = model_def.split(".")[2].replace("_", "-")
    spec = {"apiVersion": "elasticps.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": {"model": {"modelDef": model_def}, "output": str(work / f"export-{name}"),
                     "data": {"reader": "tfrecord", "training": str(data[0]), "validation": str(data[1])},
                     "training": {"useAsync": True, "minibatchSize": 64, "numEpochs": epochs, "recordsPerTask": 1024},
                     "ps": {"replicas": 2}, "worker": {"replicas": 2}, "runPolicy": {"backoffLimit": 3}}}  # fmt: skip
    path, result = work / f"{name}.yaml", work / f"{name}.result.json"
    path.write_text(yaml.safe_dump(spec))
    done = subprocess.run([sys.executable, "-m", "elasticps", "run", str(path), "--run_dir", str(work / f"run-{name}"),
                           "--result_file", str(result)], cwd=work, env=environment(zoo), capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode != 0:
        return {"succeeded": False, "error": done.stderr[-2000:]}
    found = json.loads(result.read_text())
    loading = work / f"export-{name}" / "loading.json"
    return {"succeeded": bool(found["succeeded"]), "accuracy": found["metrics"].get("accuracy"),
            "auc": found["metrics"].get("auc"),
            "model_version": found["model_version"], "seconds": found["elapsed_s"],
            "export": export_summary(json.loads(loading.read_text()) if loading.exists() else {}),
            "learning_rates": curve(work / f"export-{name}" / "tensorboard", "train/learning_rate")}  # fmt: skip


def curve(folder: Path, tag: str) -> list[list[float]]:
    """``[[model version, value], ...]`` of one scalar curve in the export's TensorBoard events."""
    import tensorflow as tf

    points = []
    for events in sorted(folder.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            points += [[int(event.step), float(v.simple_value)] for v in event.summary.value if v.tag == tag]
    return points


def rate_segments(points: list[list[float]]) -> list[dict[str, float]]:
    """The learning-rate curve as runs of one rate: ``{"rate", "first", "last"}`` (model versions
    of its first and last point), in version order. Pure."""
    segments: list[dict[str, float]] = []
    for version, rate in sorted(points):
        if segments and abs(segments[-1]["rate"] - rate) <= 1e-9 * max(abs(rate), 1e-12):
            segments[-1]["last"] = version
        else:
            segments.append({"rate": rate, "first": version, "last": version})
    return segments


def schedule_summary(points: list[list[float]]) -> str:
    """``0.1 (v12-v4990), 0.01 (v5010-v5620)``: the rates the PS applied and when. Pure."""
    if not points:
        return "-"
    return ", ".join(f"{s['rate']:g} (v{s['first']:.0f}-v{s['last']:.0f})" for s in rate_segments(points))


def export_summary(loading: dict[str, Any]) -> str:
    """What ``loading.json`` says of ``model.keras`` in a few words."""
    keras_file = loading.get("model.keras")
    if keras_file is None:
        return f"`model.keras` left out ({loading.get('reason', 'no loading.json')}); `saved_model/`"
    if not keras_file.get("keras.models.load_model"):
        return f"`model.keras` unproven ({keras_file.get('reason')})"
    needs, twin = keras_file.get("needs", []), keras_file.get("functional_twin_of")
    what = f"`model.keras` (the functional twin of `{twin}`)" if twin else "`model.keras`"
    custom = keras_file.get("custom_objects", [])
    given = f" with `custom_objects` {', '.join(f'`{c}`' for c in custom)}" if custom else ""
    return f"{what} loads with Keras alone" if not needs else f"{what} loads after `{'; '.join(needs)}`{given}"


def one_process(work: Path, zoo: Path, model_def: str, data: tuple[Path, Path], updates: int) -> dict[str, Any]:
    result = work / f"one-{model_def}.json"
    done = subprocess.run([sys.executable, "-m", "bench.one_process", "--model_def", model_def, "--updates", str(updates),
                           "--minibatch", "64", "--training", str(data[0]), "--validation", str(data[1]),
                           "--result_file", str(result)], cwd=ROOT, env=environment(zoo), capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{model_def} in one process: {done.stderr[-2000:]}")
    found: dict[str, Any] = json.loads(result.read_text())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elasticdl", type=Path, required=True, help="ElasticDL's repository (work tree or git dir)")
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--cifar_records", type=int, default=0, help="cifar10's training records (default: a third of --records)")
    parser.add_argument("--cifar_epochs", type=int, default=0, help="cifar10's epochs (default: --epochs)")
    parser.add_argument("--ctr_records", type=int, default=20_000, help="deepfm's training records (generated clicks)")
    parser.add_argument("--no_write", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="elasticps-edl-zoo-") as folder:
        work = Path(folder)
        zoo = work / "zoo"
        changed = copy_zoo(args.elasticdl, zoo)
        cifar_records = args.cifar_records or args.records // 3
        epochs = {"mnist": args.epochs, "cifar10": args.cifar_epochs or args.epochs, "ctr": args.epochs}
        data = write_data(work, args.records, cifar_records, args.ctr_records)
        for model_def, kind in MODULES.items():
            ran = job(work, zoo, model_def, data[kind], epochs[kind])
            row: dict[str, Any] = {"model_def": model_def, "data": kind, "epochs": epochs[kind], "job": ran}
            if ran["succeeded"]:
                alone = one_process(work, zoo, model_def, data[kind], int(ran["model_version"]))
                row["one_process"] = {"accuracy": alone["metrics"]["accuracy"], "updates": alone["updates"],
                                      "auc": alone["metrics"].get("auc"),
                                      "recalibrated": alone.get("metrics_recalibrated", {}).get("accuracy")}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "import_lines_changed": changed, "records": args.records, "epochs": args.epochs,
              "cifar_records": cifar_records, "cifar_epochs": epochs["cifar10"], "ctr_records": args.ctr_records,
              "packages": list(PACKAGES), "rows": rows}  # fmt: skip
    if args.no_write:
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, PLOT)
    write_region(DOC, "elasticdl-zoo", report(result))


def report(result: dict[str, Any]) -> str:
    cifar = (f" --cifar_records {result['cifar_records']} --cifar_epochs {result['cifar_epochs']}"
             if "cifar_records" in result else "")
    if "ctr_records" in result:
        cifar += f" --ctr_records {result['ctr_records']}"
    lines = [
        f"Written by `python -m bench.elasticdl_zoo --records {result['records']} --epochs {result['epochs']}{cifar}` on "
        f"{result['when']} (`bench/results/elasticdl_zoo.json`): {result['import_lines_changed']} import lines "
        f"changed in the zoo's {', '.join(result.get('packages', ['mnist', 'cifar10']))} packages, nothing else. 2 PS + 2 workers, async, minibatch 64; one "
        "process: the same module for as many updates of 64 records as the job's model version, and the same "
        "with BatchNormalization's moving statistics recalibrated on training data at the end.",
        "",
        "| module (`modelDef`) | data, epochs | elasticps | one process | difference (points) | "
        "one process, BatchNormalization recalibrated | difference (points) | export | "
        "the PS's learning rate by model version (TensorBoard) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["rows"]:
        ran = row["job"]
        data = f"{row['data']}, {row.get('epochs', result['epochs'])}"
        if not ran["succeeded"]:
            lines.append(f"| `{row['model_def']}` | {data} | failed | - | - | - | - | - | - |")
            continue
        alone = row["one_process"]
        recalibrated = alone.get("recalibrated")
        again = (f"{recalibrated:.4f} | {100 * (ran['accuracy'] - recalibrated):+.1f}" if recalibrated is not None
                 else "- | -")  # fmt: skip
        auc = (f", AUC {ran['auc']:.4f}", f", AUC {alone['auc']:.4f}") if ran.get("auc") and alone.get("auc") else ("", "")
        lines.append(f"| `{row['model_def']}` | {data} | {ran['accuracy']:.4f}{auc[0]} ({ran['model_version']} updates) | "
                     f"{alone['accuracy']:.4f}{auc[1]} | {100 * (ran['accuracy'] - alone['accuracy']):+.1f} | {again} | "
                     f"{ran['export']} | {schedule_summary(ran.get('learning_rates', []))} |")  # fmt: skip
    if any(len(rate_segments(row["job"].get("learning_rates", []))) > 1 for row in result["rows"]):
        lines += ["", f"![the PS's learning rate by model version]({PLOT.relative_to(DOC.parent)})"]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """The learning rate each module's PS applied against the model version, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    for row in result["rows"]:
        points = sorted(row["job"].get("learning_rates", []))
        if points:
            ax.step([v for v, _ in points], [r for _, r in points], where="post", label=row["model_def"].split(".")[-2])
    ax.set_yscale("log")
    ax.set_xlabel("model version")
    ax.set_ylabel("learning rate (PS)")
    ax.set_title("ElasticDL zoo modules' callbacks() schedules, applied by the PS")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
