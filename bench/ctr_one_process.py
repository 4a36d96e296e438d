"""DeepFM on the Criteo sample in one plain process: the comparison for the PS-served job (issue 17).

    python -m bench.ctr_one_process [--data PATH] [--epochs 2] [--no_write]

No elasticps processes: the ``criteo`` reader, ``elasticps.backends.keras.zoo.deepfm`` (its embedding tables
local, ``elasticps.backends.keras.layers.Embedding``) and ``model.fit``, on the first 8,000 records, evaluated on
the last 2,000 after each epoch: AUC (``deepfm.auc``) and log loss. Writes
``bench/results/ctr_one_process.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from elasticps.data.criteo import CriteoReader  # noqa: E402
from elasticps.backends.keras.zoo import deepfm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "criteo" / "criteo_train_head10k.txt"
RESULTS = ROOT / "bench" / "results" / "ctr_one_process.json"
TRAIN = 8000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--minibatch", type=int, default=256)
    parser.add_argument("--no_write", action="store_true")
    args = parser.parse_args()
    reader = CriteoReader(args.data)
    x, y = reader.read(0, reader.num_records)
    train, test = (x[:TRAIN], y[:TRAIN]), (x[TRAIN:], y[TRAIN:])
    keras.utils.set_random_seed(0)
    model = deepfm.custom_model()
    model.compile(optimizer=deepfm.optimizer(), loss=deepfm.loss)
    epochs = []
    began = time.monotonic()
    for epoch in range(1, args.epochs + 1):
        model.fit(train[0], train[1], batch_size=args.minibatch, epochs=1, shuffle=True, verbose=0)
        logits = model.predict(test[0], batch_size=2048, verbose=0)
        row = {"epoch": epoch, "auc": deepfm.auc(test[1], logits), "log_loss": deepfm.log_loss(test[1], logits),
               "seconds": round(time.monotonic() - began, 1)}
        epochs.append(row)
        print(f"epoch {epoch}: test AUC {row['auc']:.4f}, log loss {row['log_loss']:.4f} ({row['seconds']} s)", flush=True)
    result = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "data": Path(args.data).name, "train_records": TRAIN, "test_records": int(test[1].size),
              "minibatch": args.minibatch, "clicks_in_test": float(np.mean(test[1])), "epochs": epochs}
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
