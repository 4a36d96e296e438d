"""The communication graph of decentralized training (``spec.decentralized.graph``, seed 004). Pure.

Worker ``i`` sends its model to its out-neighbours and averages what it receives from its
in-neighbours; ``weights[i][j]`` is the weight of ``i``'s model in ``j``'s average (the edge
``i -> j``), ``weights[i][i]`` the weight of its own (the self-loop). For the average to converge the
graph must be strongly connected, every node must keep a part of its own model (a self-loop) and the
matrix must be doubly stochastic (every row and every column sums to one).

Kinds, for ``n`` workers (node ``i`` of ``0 .. n-1``):

* ``ring``: ``i`` with ``i - 1`` and ``i + 1``;
* ``ringBased``: the ring plus a chord from every node to the one opposite (``i + n/2``), so any two
  nodes are at most about ``n/4`` hops apart instead of ``n/2`` (our reading of the seed's
  "ring-based" graph, whose figure the seed does not carry); needs an even ``n >= 4``;
* ``doubleRing``: two rings of ``n/2`` nodes, node ``i`` of the first joined to node ``i`` of the
  second (our reading of "double ring"); needs an even ``n >= 6``;
* ``complete``: everyone with everyone, uniform weights ``1/n`` (all-reduce averaging, the baseline of
  seed 001);
* ``explicit``: an adjacency list given by the user (``neighbours[i]``: the nodes ``i`` sends to), with
  optional explicit weights.

Weights default to Metropolis-Hastings: ``w_ij = 1 / (1 + max(d_i, d_j))`` on an edge (``d`` counts the
other nodes a node is joined to) and the rest on the self-loop. On an undirected graph they are
symmetric, hence doubly stochastic, and uniform (``1/(d+1)``) on a regular one. A directed graph needs
explicit weights, which are checked instead.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

KINDS = ("ring", "ringBased", "doubleRing", "complete", "explicit")
TOLERANCE = 1e-6  # how far a row or column sum of explicit weights may be from 1


class GraphError(ValueError):
    """A graph that cannot drive decentralized training; the message says why."""


@dataclass(frozen=True)
class Graph:
    weights: tuple[tuple[float, ...], ...]  # weights[i][j]: i's model in j's average

    @property
    def size(self) -> int:
        return len(self.weights)

    def out_neighbours(self, node: int) -> tuple[int, ...]:
        """Whom ``node`` sends its model to (not itself)."""
        return tuple(j for j, w in enumerate(self.weights[node]) if w > 0 and j != node)

    def in_neighbours(self, node: int) -> tuple[int, ...]:
        """Whose models ``node`` averages (not itself)."""
        return tuple(i for i, row in enumerate(self.weights) if row[node] > 0 and i != node)

    def distances(self, source: int) -> list[int]:
        """Hops along directed edges from ``source`` to every node (-1: unreachable)."""
        found = [-1] * self.size
        found[source] = 0
        todo = deque([source])
        while todo:
            node = todo.popleft()
            for nxt in self.out_neighbours(node):
                if found[nxt] < 0:
                    found[nxt] = found[node] + 1
                    todo.append(nxt)
        return found


def build(kind: str, workers: int, neighbours: Sequence[Sequence[int]] = (),
          weights: Sequence[Sequence[float]] = ()) -> Graph:
    """The graph of ``kind`` over ``workers`` nodes, checked; :class:`GraphError` if it cannot train."""
    if workers < 1:
        raise GraphError(f"a graph needs at least one worker, got {workers}")
    if kind not in KINDS:
        raise GraphError(f"unknown graph {kind!r}; one of {', '.join(KINDS)}")
    if kind != "explicit" and (neighbours or weights):
        raise GraphError(f"neighbours and weights are for the explicit graph, not {kind!r}")
    if kind == "explicit":
        edges = _explicit_edges(workers, neighbours)
    else:
        edges = _edges(kind, workers)
    if weights:
        matrix = _explicit_weights(workers, edges, weights)
    else:
        asymmetric = sorted((i, j) for i, j in edges if (j, i) not in edges)
        if asymmetric:
            i, j = asymmetric[0]
            raise GraphError(
                f"the edge {i} -> {j} has no edge {j} -> {i}: default (Metropolis-Hastings) weights need an "
                "undirected graph; give explicit doubly stochastic weights for a directed one"
            )
        matrix = metropolis_hastings(workers, edges)
    graph = Graph(tuple(tuple(row) for row in matrix))
    problem = _problem(graph)
    if problem:
        raise GraphError(problem)
    return graph


def _edges(kind: str, n: int) -> set[tuple[int, int]]:
    pairs: set[tuple[int, int]] = set()
    if kind == "ring":
        pairs = {(i, (i + 1) % n) for i in range(n)}
    elif kind == "ringBased":
        if n < 4 or n % 2:
            raise GraphError(f"a ringBased graph needs an even number of workers, at least 4; got {n}")
        pairs = {(i, (i + 1) % n) for i in range(n)} | {(i, i + n // 2) for i in range(n // 2)}
    elif kind == "doubleRing":
        if n < 6 or n % 2:
            raise GraphError(f"a doubleRing graph needs an even number of workers, at least 6; got {n}")
        half = n // 2
        pairs = {(i, (i + 1) % half) for i in range(half)}
        pairs |= {(half + i, half + (i + 1) % half) for i in range(half)}
        pairs |= {(i, half + i) for i in range(half)}
    elif kind == "complete":
        pairs = {(i, j) for i in range(n) for j in range(n)}
    undirected = pairs | {(j, i) for i, j in pairs}
    return {(i, j) for i, j in undirected if i != j}


def _explicit_edges(n: int, neighbours: Sequence[Sequence[int]]) -> set[tuple[int, int]]:
    if len(neighbours) != n:
        raise GraphError(f"neighbours lists {len(neighbours)} nodes, the job has {n} workers")
    edges: set[tuple[int, int]] = set()
    for i, outs in enumerate(neighbours):
        for j in outs:
            if not isinstance(j, int) or isinstance(j, bool) or not 0 <= j < n:
                raise GraphError(f"neighbours[{i}] names {j!r}, not a worker of 0..{n - 1}")
            if j != i:
                edges.add((i, j))
    return edges


def _explicit_weights(n: int, edges: set[tuple[int, int]], weights: Sequence[Sequence[float]]) -> list[list[float]]:
    if len(weights) != n or any(len(row) != n for row in weights):
        raise GraphError(f"weights must be a {n} x {n} matrix (one row per worker)")
    matrix = [[float(w) for w in row] for row in weights]
    for i in range(n):
        for j in range(n):
            w = matrix[i][j]
            if not 0.0 <= w <= 1.0:
                raise GraphError(f"weights[{i}][{j}] = {weights[i][j]!r}: a weight must be in [0, 1]")
            if i != j and w > 0 and (i, j) not in edges:
                raise GraphError(f"weights[{i}][{j}] > 0 but {j} is not in neighbours[{i}]")
            if i != j and w == 0 and (i, j) in edges:
                raise GraphError(f"neighbours[{i}] names {j} but weights[{i}][{j}] is 0")
    return matrix


def metropolis_hastings(n: int, edges: set[tuple[int, int]]) -> list[list[float]]:
    """Metropolis-Hastings weights of an undirected graph (``edges`` both ways, no self-loops)."""
    degree = [sum(1 for i, _ in edges if i == node) for node in range(n)]
    matrix = [[0.0] * n for _ in range(n)]
    for i, j in edges:
        matrix[i][j] = 1.0 / (1 + max(degree[i], degree[j]))
    for i in range(n):
        matrix[i][i] = 1.0 - sum(matrix[i][j] for j in range(n) if j != i)
    return matrix


def _problem(graph: Graph) -> str | None:
    n = graph.size
    for i in range(n):
        if graph.weights[i][i] <= 0:
            return f"worker {i} has no self-loop (weights[{i}][{i}] must be > 0: a worker keeps part of its model)"
    for i in range(n):
        row = sum(graph.weights[i])
        if abs(row - 1.0) > TOLERANCE:
            return f"the weights of row {i} sum to {row:.6g}, not 1 (the matrix must be doubly stochastic)"
        column = sum(graph.weights[j][i] for j in range(n))
        if abs(column - 1.0) > TOLERANCE:
            return f"the weights of column {i} sum to {column:.6g}, not 1 (the matrix must be doubly stochastic)"
    for i in range(n):
        unreachable = [j for j, d in enumerate(graph.distances(i)) if d < 0]
        if unreachable:
            return f"the graph is not connected: no path from worker {i} to worker {unreachable[0]}"
    return None
