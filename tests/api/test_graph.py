"""The decentralized communication graph: its kinds, Metropolis-Hastings weights, and the checks that
refuse a graph which cannot train (not connected, no self-loop, not doubly stochastic)."""

from __future__ import annotations

import pytest

from elasticps.api.graph import Graph, GraphError, build


def _doubly_stochastic(g: Graph) -> bool:
    n = g.size
    return all(abs(sum(g.weights[i]) - 1) < 1e-12 and abs(sum(g.weights[j][i] for j in range(n)) - 1) < 1e-12 for i in range(n))


def test_ring_is_uniform_thirds() -> None:
    g = build("ring", 5)
    assert g.out_neighbours(0) == (1, 4) and g.in_neighbours(0) == (1, 4)
    assert all(abs(w - 1 / 3) < 1e-12 for row in g.weights for w in row if w > 0)
    assert g.distances(0) == [0, 1, 2, 2, 1]


def test_complete_is_all_reduce_with_uniform_weights() -> None:
    g = build("complete", 4)
    assert all(w == 0.25 for row in g.weights for w in row)
    assert g.in_neighbours(2) == (0, 1, 3)


def test_ring_based_adds_the_opposite_chord() -> None:
    g = build("ringBased", 8)
    assert g.out_neighbours(0) == (1, 4, 7) and g.out_neighbours(5) == (1, 4, 6)
    assert all(abs(w - 0.25) < 1e-12 for row in g.weights for w in row if w > 0)  # regular, degree 3
    assert max(g.distances(0)) == 2  # a plain ring of 8 needs 4
    assert max(build("ring", 8).distances(0)) == 4


def test_double_ring_joins_two_rings() -> None:
    g = build("doubleRing", 6)
    assert g.out_neighbours(0) == (1, 2, 3) and g.out_neighbours(4) == (1, 3, 5)
    assert _doubly_stochastic(g)


def test_metropolis_hastings_on_an_irregular_graph() -> None:
    # A path 0 - 1 - 2 plus 1 - 3: node 1 has degree 3, the others 1.
    g = build("explicit", 4, neighbours=[[1], [0, 2, 3], [1], [1]])
    assert g.weights[0][1] == 0.25 and g.weights[0][0] == 0.75
    assert g.weights[1][1] == pytest.approx(0.25)
    assert _doubly_stochastic(g)


def test_explicit_directed_graph_with_weights() -> None:
    g = build("explicit", 3, neighbours=[[1], [2], [0]], weights=[[0.5, 0.5, 0], [0, 0.5, 0.5], [0.5, 0, 0.5]])
    assert g.out_neighbours(0) == (1,) and g.in_neighbours(0) == (2,)
    assert g.distances(0) == [0, 1, 2]


def test_one_worker_is_its_own_graph() -> None:
    assert build("ring", 1).weights == ((1.0,),)


@pytest.mark.parametrize(
    ("kind", "n", "kwargs", "message"),
    [
        ("star", 4, {}, "unknown graph 'star'"),
        ("ring", 0, {}, "at least one worker"),
        ("ringBased", 5, {}, "even number of workers, at least 4"),
        ("doubleRing", 4, {}, "at least 6"),
        ("ring", 4, {"neighbours": [[1], [0], [3], [2]]}, "for the explicit graph"),
        ("explicit", 4, {"neighbours": [[1], [0], [3], [2]]}, "not connected"),
        ("explicit", 3, {"neighbours": [[1], [2]]}, "lists 2 nodes, the job has 3"),
        ("explicit", 3, {"neighbours": [[1], [7], [0]]}, "names 7, not a worker"),
        ("explicit", 3, {"neighbours": [[1], [2], [0]]}, "the edge 0 -> 1 has no edge 1 -> 0"),
        ("explicit", 2, {"neighbours": [[1], [0]], "weights": [[0, 1], [1, 0]]}, "worker 0 has no self-loop"),
        ("explicit", 2, {"neighbours": [[1], [0]], "weights": [[0.5, 0.5], [0.6, 0.4]]}, "column 0 sum to 1.1"),
        ("explicit", 2, {"neighbours": [[1], [0]], "weights": [[0.5, 0.6], [0.5, 0.4]]}, "row 0 sum to 1.1"),
        ("explicit", 2, {"neighbours": [[], [0]], "weights": [[0.5, 0.5], [0.5, 0.5]]}, "1 is not in neighbours[0]"),
        ("explicit", 2, {"neighbours": [[1], [0]], "weights": [[1, 0], [0, 1]]}, "names 1 but weights[0][1] is 0"),
        ("explicit", 2, {"neighbours": [[1], [0]], "weights": [[1.5, -0.5], [-0.5, 1.5]]}, "must be in [0, 1]"),
        ("explicit", 2, {"neighbours": [[1], [0]], "weights": [[1, 0]]}, "2 x 2 matrix"),
    ],
)
def test_graphs_that_cannot_train_are_refused_with_the_reason(kind: str, n: int, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(GraphError, match=message.replace("(", r"\(").replace("[", r"\[")):
        build(kind, n, **kwargs)  # type: ignore[arg-type]
