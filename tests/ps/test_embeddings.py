"""A PS shard's embedding rows (``ps/embeddings.py``) and what a table is (``api/embedding.py``).

Against Keras to 1e-5 where lazy and dense semantics coincide (every row in every push), against a
hand-written lazy reference where they do not, and counted: rows held, each row's update count,
rows a refused push left alone.
"""

from __future__ import annotations

import os
import threading
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from elasticps.api.embedding import EmbeddingError, TableSpec, hash_ids, initial_rows, shard_of  # noqa: E402
from elasticps.api.optimizer import OptimizerConfig  # noqa: E402
from elasticps.ps.embeddings import EmbeddingTable  # noqa: E402
from elasticps.ps.optimizers import make_optimizer  # noqa: E402

IDS = np.array([5, -3, 17, 2**40, 0, 123456789], dtype=np.int64)
STEPS = 15

CASES: dict[str, tuple[str, dict[str, float], Any, dict[str, Any]]] = {
    "sgd": ("sgd", {"learning_rate": 0.05}, keras.optimizers.SGD, {"learning_rate": 0.05}),
    "sgd-momentum": ("sgd", {"learning_rate": 0.05, "momentum": 0.9}, keras.optimizers.SGD,
                     {"learning_rate": 0.05, "momentum": 0.9}),
    "adagrad": ("adagrad", {"learning_rate": 0.1}, keras.optimizers.Adagrad, {"learning_rate": 0.1}),
    "adam": ("adam", {"learning_rate": 0.01, "beta_1": 0.85, "beta_2": 0.99}, keras.optimizers.Adam,
             {"learning_rate": 0.01, "beta_1": 0.85, "beta_2": 0.99}),
    "rmsprop": ("rmsprop", {"learning_rate": 0.01}, keras.optimizers.RMSprop, {"learning_rate": 0.01}),
}


def table(optimizer: str = "adam", params: dict[str, float] | None = None, dim: int = 4, **spec: Any) -> EmbeddingTable:
    opt = make_optimizer(OptimizerConfig(optimizer, params or {"learning_rate": 0.01}))
    return EmbeddingTable(TableSpec("emb", dim, **spec), opt)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_row_every_step_matches_keras(case: str) -> None:
    name, params, cls, kwargs = CASES[case]
    ours = table(name, params)
    start = ours.pull(IDS)
    variable = keras.Variable(start.copy())
    theirs = cls(**kwargs)
    rng = np.random.default_rng(3)
    for _ in range(STEPS):
        grads = rng.standard_normal(start.shape).astype(np.float32)
        order = rng.permutation(IDS.size)  # a push names its rows in any order
        ours.push(IDS[order], grads[order], ours._optimizer.learning_rate)
        theirs.apply_gradients([(grads, variable)])
    np.testing.assert_allclose(ours.pull(IDS), variable.numpy(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(ours.pull(IDS), start)
    assert ours.state()["steps"].tolist() == [STEPS] * IDS.size


def _lazy_adam(p: np.ndarray, pushes: list[tuple[list[int], np.ndarray]], lr: float, b1: float, b2: float,
               eps: float) -> np.ndarray:
    """Lazy Adam, one row at a time in float64: a row's moments and count move only when pushed."""
    out = p.astype(np.float64).copy()
    m, v, t = np.zeros_like(out), np.zeros_like(out), np.zeros(len(out))
    for rows, grads in pushes:
        for r, g in zip(rows, grads.astype(np.float64)):
            t[r] += 1
            m[r] = b1 * m[r] + (1 - b1) * g
            v[r] = b2 * v[r] + (1 - b2) * g * g
            alpha = lr * np.sqrt(1 - b2 ** t[r]) / (1 - b1 ** t[r])
            out[r] -= alpha * m[r] / (np.sqrt(v[r]) + eps)
    return out


def _lazy_momentum(p: np.ndarray, pushes: list[tuple[list[int], np.ndarray]], lr: float, momentum: float) -> np.ndarray:
    out, velocity = p.astype(np.float64).copy(), np.zeros(p.shape)
    for rows, grads in pushes:
        for r, g in zip(rows, grads.astype(np.float64)):
            velocity[r] = momentum * velocity[r] - lr * g
            out[r] += velocity[r]
    return out


@pytest.mark.parametrize("which", ["adam", "sgd-momentum"])
def test_rows_not_pushed_are_not_touched_lazy_semantics(which: str) -> None:
    """Each push names a random subset: a row's slots decay and its count grows only when it is
    in a push (TensorFlow's lazy Adam), unlike a dense update with zero gradients."""
    params = {"learning_rate": 0.01, "beta_1": 0.8, "beta_2": 0.95, "epsilon": 1e-7} if which == "adam" else \
        {"learning_rate": 0.05, "momentum": 0.9}
    ours = table("adam" if which == "adam" else "sgd", params, dim=3)
    start = ours.pull(IDS)
    rng = np.random.default_rng(7)
    pushes = []
    for _ in range(25):
        rows = sorted(rng.choice(IDS.size, size=int(rng.integers(1, IDS.size)), replace=False).tolist())
        grads = rng.standard_normal((len(rows), 3)).astype(np.float32)
        ours.push(IDS[rows], grads, params["learning_rate"])
        pushes.append((rows, grads))
    if which == "adam":
        expected = _lazy_adam(start, pushes, params["learning_rate"], params["beta_1"], params["beta_2"], params["epsilon"])
    else:
        expected = _lazy_momentum(start, pushes, params["learning_rate"], params["momentum"])
    np.testing.assert_allclose(ours.pull(IDS), expected, rtol=1e-5, atol=1e-6)
    counts = np.zeros(IDS.size, int)
    for rows, _ in pushes:
        counts[rows] += 1
    state = ours.state()
    assert dict(zip(state["ids"].tolist(), state["steps"].tolist())) == dict(zip(IDS.tolist(), counts.tolist()))
    untouched = table("adam" if which == "adam" else "sgd", params, dim=3)
    untouched.pull(IDS)
    untouched.push(IDS[:1], np.ones((1, 3), np.float32), params["learning_rate"])
    np.testing.assert_array_equal(untouched.pull(IDS[1:]), start[1:])  # bit for bit: never pushed


def test_rows_are_made_on_first_use_the_same_wherever_and_whenever() -> None:
    spec = TableSpec("users", 8, seed=42)
    one = EmbeddingTable(spec, make_optimizer(OptimizerConfig("sgd", {})))
    ids = np.array([9, 4, -7, 2**62, 9], dtype=np.int64)
    rows = one.pull(ids)
    assert one.rows_held == 4  # 9 twice: one row
    np.testing.assert_array_equal(rows[0], rows[4])
    # Two shards, ids in another order: each shard makes its own, equal to the one table's.
    shards = [EmbeddingTable(spec, make_optimizer(OptimizerConfig("sgd", {}))) for _ in range(2)]
    for s in range(2):
        mine = ids[shard_of(ids, 2) == s][::-1]
        np.testing.assert_array_equal(shards[s].pull(mine), one.pull(mine))
    np.testing.assert_array_equal(initial_rows(spec, ids), rows)
    assert np.all(np.abs(rows) <= 0.05) and rows.dtype == np.float32
    assert not np.array_equal(initial_rows(TableSpec("users", 8, seed=43), ids), rows)
    assert not np.array_equal(initial_rows(TableSpec("items", 8, seed=42), ids), rows)
    many = initial_rows(TableSpec("t", 16, initializer="normal", scale=0.1), np.arange(20_000, dtype=np.int64))
    assert abs(float(many.std()) - 0.1) < 0.002 and abs(float(many.mean())) < 0.002
    uniform = initial_rows(TableSpec("t", 16), np.arange(20_000, dtype=np.int64))
    assert abs(float(uniform.std()) - 0.05 / np.sqrt(3)) < 0.001
    assert not initial_rows(TableSpec("t", 4, initializer="zeros"), ids).any()


def test_a_table_of_ten_million_ids_holds_only_the_rows_touched() -> None:
    t = table("adagrad", {"learning_rate": 0.1}, dim=16)
    rng = np.random.default_rng(0)
    seen: set[int] = set()
    for _ in range(5):
        batch = np.unique(np.minimum(rng.zipf(1.2, 4096), 10_000_000) - 1).astype(np.int64)
        t.pull(batch)
        t.push(batch, np.ones((batch.size, 16), np.float32), 0.1)
        seen.update(batch.tolist())
    assert t.rows_held == len(seen) < 20_000
    per_row = (1 + 1) * 16 * 4 + 8 + 8  # row, accumulator, count, id
    assert t.nbytes() >= t.rows_held * per_row
    assert t.nbytes() < 3 * t.rows_held * per_row + 200 * t.rows_held  # growth room and the dict, no more


def test_a_bad_push_is_refused_with_a_message_and_changes_nothing() -> None:
    t = table("sgd", {"learning_rate": 0.1})
    t.pull(IDS)
    before = t.state()
    cases = [
        (IDS[:2], np.ones((3, 4), np.float32), "gradient is [3, 4], expected [2, 4]"),
        (IDS[:2], np.ones((2, 5), np.float32), "gradient is [2, 5]"),
        (np.array([5, 5]), np.ones((2, 4), np.float32), "ids repeat in one push"),
        (IDS[:2], np.full((2, 4), np.nan, np.float32), "NaN or infinity"),
        (IDS[:2], np.ones((2, 4), np.int32), "not floating-point"),
        (np.array([1.5, 2.0]), np.ones((2, 4), np.float32), "must be integers"),
        (np.array([["a"]]), np.ones((1, 4), np.float32), "must be integers"),
        (IDS[:2], np.full((2, 4), 3e38, np.float32), "would make a row or its optimizer state NaN or infinite"),
    ]
    for ids, grads, message in cases:
        with pytest.raises(EmbeddingError, match=message.replace("[", r"\[")):
            t.push(ids, grads, 10.0)
    after = t.state()
    assert set(after) == set(before) and all(np.array_equal(after[k], before[k]) for k in before)


def test_state_round_trip_holds_every_row_and_goes_on_identically() -> None:
    params = {"learning_rate": 0.01, "amsgrad": 1.0}
    a = table("adam", params, dim=5)
    rng = np.random.default_rng(1)
    for _ in range(4):
        ids = np.unique(rng.integers(-50, 50, 30)).astype(np.int64)
        a.push(ids, rng.standard_normal((ids.size, 5)).astype(np.float32), 0.01)
    for _ in range(1100):  # more than the first capacity: a restore must grow
        a.pull(np.array([10_000 + _], np.int64))
    b = table("adam", params, dim=5)
    b.pull(np.array([999_999], np.int64))  # whatever it held before is replaced
    b.load_state(a.state())
    assert b.rows_held == a.rows_held > 1100
    held = a.state()["ids"]
    np.testing.assert_array_equal(b.pull(held), a.pull(held))
    grads = rng.standard_normal((held.size, 5)).astype(np.float32)
    a.push(held, grads, 0.01)
    b.push(held, grads, 0.01)
    np.testing.assert_array_equal(b.pull(held), a.pull(held))


def test_a_saved_state_that_does_not_fit_is_refused_and_changes_nothing() -> None:
    a = table("adam", dim=3)
    a.pull(IDS)
    good = a.state()
    b = table("adam", dim=3)
    b.pull(np.array([1], np.int64))
    kept = b.state()
    broken = [
        ({k: v for k, v in good.items() if k != "slot/m"}, "saved state has"),
        ({**good, "rows": good["rows"][:, :2]}, "saved rows is float32"),
        ({**good, "slot/v": np.full_like(good["slot/v"], np.inf)}, "expected finite"),
        ({**good, "steps": -good["steps"] - 1}, "counts >= 0"),
        ({**good, "ids": np.zeros_like(good["ids"])}, "ids repeat"),
        ({**good, "ids": good["ids"].astype(np.float64)}, "must be integers"),
    ]
    for state, message in broken:
        with pytest.raises(EmbeddingError, match=message):
            b.load_state(state)
    assert all(np.array_equal(b.state()[k], kept[k]) for k in kept)
    with pytest.raises(EmbeddingError, match="saved state has"):
        table("sgd", dim=3).load_state(good)  # another optimizer's slots


def test_concurrent_pushes_count_every_update() -> None:
    t = table("sgd", {"learning_rate": 1.0}, dim=2, initializer="zeros")
    ids = np.arange(-20, 20, dtype=np.int64)

    def pusher(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(50):
            chosen = rng.permutation(ids)[:10]
            t.push(chosen, np.ones((10, 2), np.float32), 1.0)

    threads = [threading.Thread(target=pusher, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    state = t.state()
    assert int(state["steps"].sum()) == 4 * 50 * 10
    np.testing.assert_array_equal(state["rows"][:, 0], -state["steps"].astype(np.float32))  # each push: -1


def test_table_specs_and_ids_are_checked_at_the_edge() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"name": "", "dim": 4}, "name"),
        ({"name": "a b", "dim": 4}, "name"),
        ({"name": "t", "dim": 0}, "dim 0"),
        ({"name": "t", "dim": True}, "dim True"),
        ({"name": "t", "dim": 4, "initializer": "glorot"}, "not one of uniform, normal, zeros"),
        ({"name": "t", "dim": 4, "scale": float("nan")}, "scale nan"),
        ({"name": "t", "dim": 4, "seed": -1}, "seed -1"),
    ]
    for kwargs, message in cases:
        with pytest.raises(EmbeddingError, match=message):
            TableSpec(**kwargs)
    assert hash_ids(["68fd1e64", b"68fd1e64"]).tolist() == [hash_ids(["68fd1e64"])[0]] * 2
    assert hash_ids(["a"]).tolist() == [3405396810240292928]  # stable across processes and versions
    assert shard_of(np.array([-3, -1, 0, 4, 2**62], np.int64), 3).tolist() == [0, 2, 0, 1, 1]


def test_the_id_index_agrees_with_a_dict_across_merges() -> None:
    from elasticps.ps.embeddings import IdIndex

    rng = np.random.default_rng(5)
    index, reference = IdIndex(), {}
    for _ in range(60):  # batches of new ids, so the pending level is merged into the main one several times
        fresh = np.setdiff1d(np.unique(rng.integers(-(2**62), 2**62, 700)), np.array(list(reference), np.int64))
        positions = np.arange(len(reference), len(reference) + fresh.size, dtype=np.intp)
        index.add(fresh, positions)
        reference.update(zip(fresh.tolist(), positions.tolist()))
        probe = np.concatenate([rng.choice(np.array(list(reference), np.int64), 300), rng.integers(0, 2**40, 50)])
        expected = [reference.get(i, -1) for i in probe.tolist()]
        np.testing.assert_array_equal(index.find(probe), expected)
    assert len(index) == len(reference) > 4096
