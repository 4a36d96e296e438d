"""``spec.strategy: decentralized`` and ``spec.decentralized``: every setting Hop cannot honour is
refused when the job is parsed, with one line naming the field; the mode label names the rule."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from elasticps.api.graph import GraphError
from elasticps.api.modes import mode_label
from elasticps.api.parsing import SpecError, parse_job
from elasticps.api.spec import DecentralizedSpec, Strategy, float_rows, int_rows
from job_builders import job_document


def _job(decentralized: dict[str, Any] | None = None, workers: int = 4, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"strategy": "decentralized", "worker": {"replicas": workers}, **extra}
    if decentralized is not None:
        spec["decentralized"] = decentralized
    return job_document(spec)


def _refused(document: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as err:
        parse_job(document)
    return str(err.value)


@pytest.mark.parametrize(
    "decentralized",
    [
        {},
        {"graph": "complete"},
        {"graph": "ringBased", "backupWorkers": 1, "skipMaxJump": 3, "maxIterationGap": 4},
        {"staleness": 5, "skipMaxJump": 10, "maxIterationGap": 11},
        {"graph": "explicit", "neighbours": "1,3;0,2;1,3;0,2"},
        {"graph": "explicit", "neighbours": "1;2;3;0", "weights": "0.5,0.5,0,0;0,0.5,0.5,0;0,0,0.5,0.5;0.5,0,0,0.5"},
    ],
)
def test_a_valid_decentralized_job_passes_every_check(decentralized: dict[str, Any]) -> None:
    job = parse_job(_job(decentralized))
    assert not job.uses_ps and mode_label(job.spec).startswith("Decentralized")


@pytest.mark.parametrize(
    ("decentralized", "workers", "extra", "message"),
    [
        ({"graph": "star"}, 4, {}, "spec.decentralized.graph: must be one of ring, ringBased, doubleRing, complete, explicit, got 'star'"),
        ({"graph": "ringBased"}, 5, {}, "spec.decentralized.graph: a ringBased graph needs an even number of workers, at least 4; got 5 (5 workers)"),
        ({"graph": "explicit", "neighbours": "1;0;3;2"}, 4, {}, "spec.decentralized.neighbours: the graph is not connected: no path from worker 0 to worker 2 (4 workers)"),
        ({"graph": "explicit", "neighbours": "1;0;x"}, 3, {}, "spec.decentralized.neighbours: must be each worker's out-neighbours"),
        ({"graph": "explicit", "neighbours": "1;0", "weights": "0.5,0.6;0.5,0.4"}, 2, {}, "spec.decentralized.weights: the weights of row 0 sum to 1.1, not 1"),
        ({"graph": "explicit", "neighbours": "1;0", "weights": "1,a"}, 2, {}, "spec.decentralized.weights: must be a matrix of numbers"),
        ({"graph": "ring", "neighbours": "1;0"}, 2, {}, "spec.decentralized.neighbours: neighbours and weights are for the explicit graph"),
        ({}, 0, {}, "spec.decentralized.graph: a graph needs at least one worker, got 0 (0 workers)"),
        ({"backupWorkers": 1, "staleness": 2}, 4, {}, "spec.decentralized.backupWorkers: backup workers and staleness are two rules"),
        ({"backupWorkers": 2}, 4, {}, "spec.decentralized.backupWorkers: must be less than the fewest in-neighbours of a worker (2 in this graph), got 2"),
        ({"skipMaxJump": 3}, 4, {}, "spec.decentralized.skipMaxJump: needs backupWorkers or staleness"),
        ({"backupWorkers": 1, "skipMaxJump": 3, "skipTrigger": 5}, 4, {}, "spec.decentralized.skipTrigger: a neighbour is never more than maxIterationGap (4)"),
        ({"maxIterationGap": 0}, 4, {}, "spec.decentralized.maxIterationGap: must be >= 1, got 0"),
        ({"skipTrigger": 1}, 4, {}, "spec.decentralized.skipTrigger: must be >= 2, got 1"),
        ({"sideways": 1}, 4, {}, "spec.decentralized.sideways: unknown field"),
        ({}, 4, {"training": {"useAsync": True}}, "spec.training.useAsync: a setting of the parameter servers; spec.strategy decentralized has none"),
        ({}, 4, {"training": {"localSGDSteps": 4}}, "spec.training.localSGDSteps: a setting of the parameter servers"),
        ({}, 4, {"training": {"gradsToWait": 3}}, "spec.training.gradsToWait: a setting of the parameter servers"),
    ],
)
def test_what_hop_cannot_honour_is_refused_naming_the_field(
    decentralized: dict[str, Any], workers: int, extra: dict[str, Any], message: str
) -> None:
    assert _refused(_job(decentralized, workers, **extra)).startswith(message)


def test_a_decentralized_job_needs_no_ps() -> None:
    # spec.ps.replicas: 0 is refused under the PS strategy only.
    assert not parse_job(_job({}, ps={"replicas": 0})).uses_ps
    assert _refused(job_document({"ps": {"replicas": 0}})) == "spec.ps.replicas: must be >= 1, got 0"
    # PS settings in a decentralized job would be silently ignored: refused instead.
    for ps in ({"replicas": 2}, {"resources": {"requests": {"cpu": "2"}}}, {"restartPolicy": "Never"}):
        assert _refused(_job({}, ps=ps)) == "spec.ps: spec.strategy decentralized runs no parameter servers; remove spec.ps"
    assert parse_job(_job({}, ps={"replicas": 1})).spec.strategy is Strategy.DECENTRALIZED  # the default said again


def test_labels_name_the_rule() -> None:
    assert DecentralizedSpec().label == "Decentralized"
    assert DecentralizedSpec(backup_workers=1, skip_max_jump=10).label == "Decentralized-backup1-skip10"
    assert DecentralizedSpec(staleness=5).label == "Decentralized-stale5"
    spec = parse_job(job_document()).spec
    assert mode_label(spec) == "Sync"
    assert mode_label(replace(spec, strategy=Strategy.DECENTRALIZED, decentralized=DecentralizedSpec(staleness=5))) == "Decentralized-stale5"


def test_graph_for_builds_the_graph_of_the_workers() -> None:
    graph = DecentralizedSpec(graph="explicit", neighbours="1,2; 0 ,2;0,1").graph_for(3)
    assert graph.in_neighbours(0) == (1, 2)
    with pytest.raises(GraphError):
        DecentralizedSpec(graph="ringBased").graph_for(3)
    assert int_rows("1,2;;0") == [[1, 2], [], [0]]
    assert float_rows("0.5, .5") == [[0.5, 0.5]]
