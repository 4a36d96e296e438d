"""Which rows an embedding table keeps (issue 38; ``api/row_policy.py``, ``ps/admission.py``,
``ps/eviction.py``, ``ps/embeddings.py``): admission after k sightings, eviction past a TTL and over
a cap (LRU, LFU), counted; evicted rows gone from memory and the checkpoint; an update staged
before an eviction moved the rows lands on the right ones; the counts in DescribeShard and on
the metrics port."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from elasticps.api.embedding import EmbeddingError, TableSpec, initial_rows
from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.optimizer import OptimizerConfig
from elasticps.api.row_policy import Eviction, RowPolicies, RowPolicy
from elasticps.proto import elasticps_pb2 as pb
from elasticps.ps.admission import AdmissionFilter
from elasticps.ps.embeddings import RowGradient, EmbeddingTable
from elasticps.ps.metrics import PSMetrics
from elasticps.ps.optimizers import make_optimizer
from elasticps.ps.servicer import ParameterServerServicer
from elasticps.ps.store import ParameterStore, StoreSettings

SPEC = TableSpec("t", 4, seed=5)
LR = 1.0


def table(**policy: object) -> EmbeddingTable:
    return EmbeddingTable(SPEC, make_optimizer(OptimizerConfig("sgd", {"learning_rate": LR})),
                          policy=RowPolicy(**policy))  # type: ignore[arg-type]  # fmt: skip


def ids(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def ones(n: int) -> np.ndarray:
    return np.ones((n, SPEC.dim), np.float32)


def test_the_filter_admits_an_id_on_its_kth_sighting_and_counts_a_minibatch_once() -> None:
    admission = AdmissionFilter(3, 1 << 12)
    a, b = ids(11), ids(12)
    assert not admission.count(a).any() and not admission.count(a).any()
    assert admission.count(a).all()  # the third
    assert not admission.admitted(b).any()
    for _ in range(300):
        admission.count(b)
    assert admission.admitted(b).all()  # the counters stop at 255, and stay admitted


def test_an_id_reads_its_first_values_and_drops_its_gradient_until_admitted() -> None:
    t = table(admit_after=3)
    x = ids(4, 8)
    first = initial_rows(SPEC, x)
    for sighting in (1, 2):
        np.testing.assert_array_equal(t.pull(x), first)
        t.push(x, ones(2), LR)  # dropped: no row yet
        assert t.rows_held == 0, sighting
    stats = t.stats()
    assert (stats.rowless_reads, stats.dropped_gradients, stats.made) == (4, 4, 0)
    np.testing.assert_array_equal(t.pull(x), first)  # the third sighting: admitted, made from its first values
    t.push(x, ones(2), LR)
    np.testing.assert_allclose(t.pull(x), first - 1.0, rtol=1e-6)
    assert (t.rows_held, t.stats().made, t.stats().dropped_gradients) == (2, 2, 4)


def test_rows_not_updated_within_the_ttl_go_and_come_back_from_their_first_values() -> None:
    t = table(ttl=8)
    hot, cold = ids(1, 2), ids(3)
    t.pull(np.concatenate([hot, cold]))
    t.push(cold, ones(1), LR)
    for _ in range(8):
        t.push(hot, ones(2), LR)
    assert t.rows_held == 3  # cold's last update is 8 updates ago: not past the TTL yet
    t.push(hot, ones(2), LR)
    assert t.rows_held == 2 and t.stats().evicted == 1
    assert set(t.state()["ids"].tolist()) == {1, 2}  # gone from the checkpoint too
    np.testing.assert_array_equal(t.pull(cold), initial_rows(SPEC, cold))  # made anew
    np.testing.assert_allclose(t.pull(hot), initial_rows(SPEC, hot) - 9.0, rtol=1e-6)


@pytest.mark.parametrize("rule", list(Eviction))
def test_a_capped_table_holds_at_most_its_cap_and_keeps_the_rows_its_rule_prefers(rule: Eviction) -> None:
    t = table(max_rows=100, evict=rule)
    often = ids(*range(20))  # updated at every step
    t.pull(often)
    rng = np.random.default_rng(0)
    seen = 0
    for step in range(60):
        passing = np.unique(rng.integers(1000, 10**9, 30)).astype(np.int64)  # new ids every step, updated once
        t.pull(np.concatenate([often, passing]))
        t.push(np.concatenate([often, passing]), ones(often.size + passing.size), LR)
        seen += passing.size
        assert t.rows_held <= 100, step
    held = set(t.state()["ids"].tolist())
    assert set(often.tolist()) <= held  # LRU: updated last; LFU: updated most
    assert t.stats().made == 20 + seen and t.stats().evicted == 20 + seen - t.rows_held
    np.testing.assert_allclose(t.pull(often), initial_rows(SPEC, often) - 60.0, rtol=1e-6)


def test_lfu_keeps_a_row_updated_often_long_ago_where_lru_does_not() -> None:
    kept = {}
    for rule in Eviction:
        t = table(max_rows=40, evict=rule)
        old = ids(7)
        t.pull(old)
        for _ in range(10):
            t.push(old, ones(1), LR)
        for k in range(8):
            fresh = np.arange(100 + 10 * k, 110 + 10 * k, dtype=np.int64)
            t.pull(fresh)
            t.push(fresh, ones(10), LR)
        kept[rule] = 7 in t.state()["ids"].tolist()
    assert kept == {Eviction.LFU: True, Eviction.LRU: False}


def test_a_request_asking_for_more_rows_than_the_cap_gets_rows_for_what_fits_and_first_values_past_it() -> None:
    t = table(max_rows=16)
    t.pull(ids(*range(10)))
    asked = ids(*range(20))
    rows = t.pull(asked)  # the 10 held stay, 6 new fit, 4 read first values
    np.testing.assert_array_equal(rows, initial_rows(SPEC, asked))
    assert t.rows_held == 16 and t.stats().rowless_reads == 4 and t.stats().evicted == 0
    t.push(asked, ones(20), LR)  # the 16 rows take it, 4 gradient rows dropped
    assert t.stats().dropped_gradients == 4
    held = dict(zip(t.state()["ids"].tolist(), t.state()["rows"]))
    assert len(held) == 16 and all(np.allclose(held[i], initial_rows(SPEC, ids(i))[0] - 1.0) for i in held)


def test_an_update_staged_before_an_eviction_moved_the_rows_lands_on_its_own_rows() -> None:
    t = table(max_rows=40)
    t.pull(ids(*range(20)))
    t.push(ids(*range(10, 20)), ones(10), LR)  # rows 10-19 more recent than 0-9
    update = t.stage(RowGradient(ids(*range(10, 20)), ones(10)), t._optimizer, LR)  # at positions 10-19
    t.pull(ids(*range(100, 126)))  # 46 rows > 40: down to 36, rows 0-9 go, 10-19 move to positions 0-9
    assert t.stats().evicted == 10 and t.rows_held == 36
    update.commit()
    held = dict(zip(t.state()["ids"].tolist(), t.state()["rows"]))
    for i in range(10, 20):
        np.testing.assert_allclose(held[i], initial_rows(SPEC, ids(i))[0] - 2.0, rtol=1e-6)
    for i in range(100, 126):
        np.testing.assert_array_equal(held[i], initial_rows(SPEC, ids(i))[0])  # untouched


def test_a_checkpoint_keeps_each_rows_last_update_and_one_over_the_cap_is_cut_at_load() -> None:
    t = table(ttl=100)
    t.pull(ids(*range(50)))
    for _ in range(3):
        t.push(ids(*range(25)), ones(25), LR)
    saved = t.state()
    assert saved["clock"].tolist() == [3] and sorted(set(saved["updated"].tolist())) == [1, 3]  # pulled, for update 1; updated 3
    again = table(ttl=100)
    again.load_state(saved)
    assert again.state()["updated"].tolist() == saved["updated"].tolist()
    older = {k: v for k, v in saved.items() if k not in ("updated", "clock")}  # a file from before policies
    table().load_state(older)
    capped = table(max_rows=20, evict=Eviction.LFU)
    capped.load_state(saved)
    assert capped.rows_held == 18 and set(capped.state()["ids"].tolist()) <= set(range(25))  # the updated ones
    with pytest.raises(EmbeddingError, match="saved state has"):
        table().load_state({**older, "clock": saved["clock"]})  # one of the two alone


def test_a_shard_says_its_rows_in_describe_shard_and_on_its_metrics() -> None:
    settings = StoreSettings(shard=0, mode=TrainingMode(rule=UpdateRule.ASYNC),
                             row_policies=RowPolicies.parse("admitAfter=2;t:maxRows=16"))  # fmt: skip
    store = ParameterStore(settings)
    store.initialize({"w": np.zeros(1, np.float32)}, OptimizerConfig("sgd", {"learning_rate": 0.1}), tables=[SPEC])
    store.pull_embeddings({"t": ids(*range(12))})  # seen once: none admitted
    store.pull_embeddings({"t": ids(*range(12))})  # twice: all made
    store.pull_embeddings({"t": ids(*range(100, 110))})  # once: read, not made
    store.pull_embeddings({"t": ids(*range(100, 110))})  # made: 22 > 16, the first 12 least recent
    registry = CollectorRegistry()
    metrics = PSMetrics(registry, 0)
    metrics.watch_rows(store.row_stats)
    state = ParameterServerServicer(store, metrics=metrics).DescribeShard(pb.DescribeRequest(), None)  # type: ignore[arg-type]
    assert (state.embedding_rows, state.embedding_rows_made, state.embedding_rows_evicted) == (10 + 4, 22, 8)
    assert state.embedding_rowless_reads == 22 and state.embedding_bytes > 0
    scraped = generate_latest(registry).decode()
    assert 'elasticps_ps_embedding_rows{shard="0",table="t"} 14.0' in scraped
    assert 'elasticps_ps_embedding_evicted_total{shard="0",table="t"} 8.0' in scraped
    assert 'elasticps_ps_embedding_made_total{shard="0",table="t"} 22.0' in scraped
