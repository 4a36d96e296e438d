"""The training mode derived from spec.training: its label (the MODE column) and the combinations refused."""

from __future__ import annotations

from typing import Any

import pytest
from job_builders import job_document

from elasticps.api.modes import TrainingMode, UpdateRule
from elasticps.api.parsing import SpecError, parse_job
from elasticps.api.spec import TrainingSpec


@pytest.mark.parametrize(
    "training, rule, label",
    [
        ({}, UpdateRule.SYNC, "Sync"),
        ({"use_async": True}, UpdateRule.ASYNC, "Async"),
        ({"use_async": True, "lr_staleness_modulation": True}, UpdateRule.ASYNC, "Async+StalenessLR"),
        ({"use_async": True, "get_model_frequency": 4}, UpdateRule.ASYNC, "Async+SSP4"),
        (
            {"use_async": True, "lr_staleness_modulation": True, "get_model_frequency": 2},
            UpdateRule.ASYNC,
            "Async+StalenessLR+SSP2",
        ),
    ],
)
def test_mode_of_training(training: dict[str, Any], rule: UpdateRule, label: str) -> None:
    mode = TrainingMode.of(TrainingSpec(**training))
    assert mode.rule is rule
    assert mode.label == label
    assert mode.problems() == []


def test_locking_and_overlap_are_carried() -> None:
    assert TrainingMode.of(TrainingSpec(use_async=True, use_locking=True)).use_locking
    assert TrainingMode.of(TrainingSpec(use_async=True, overlap_pull=True)).overlap_pull
    assert not TrainingMode.of(TrainingSpec(use_async=True)).overlap_pull


def test_staleness_lr_without_async_is_a_problem_naming_the_field() -> None:
    mode = TrainingMode.of(TrainingSpec(lr_staleness_modulation=True))
    assert mode.problems() == [("lrStalenessModulation", "needs useAsync: true")]
    with pytest.raises(SpecError, match=r"^spec\.training\.lrStalenessModulation: needs useAsync: true$"):
        parse_job(job_document({"training": {"lrStalenessModulation": True}}))


@pytest.mark.parametrize(
    ("training", "field", "why"),
    [
        ({"useLocking": True}, "useLocking", "needs useAsync: true (sync already applies one update at a time)"),
        (
            {"overlapPull": True},
            "overlapPull",
            "needs useAsync: true (a sync worker always starts its pull as the round commits)",
        ),
        (
            {"getModelFrequency": 4},
            "getModelFrequency",
            "needs useAsync: true (local steps between pulls are asynchronous SGD)",
        ),
        (
            {"useAsync": False, "getModelFrequency": 2},
            "getModelFrequency",
            "needs useAsync: true (local steps between pulls are asynchronous SGD)",
        ),
    ],
)
def test_async_only_settings_are_refused_in_sync_mode(training: dict[str, Any], field: str, why: str) -> None:
    # They used to be ignored while the MODE column said e.g. Sync+SSP4.
    with pytest.raises(SpecError) as raised:
        parse_job(job_document({"training": training}))
    assert str(raised.value) == f"spec.training.{field}: {why}"


def test_every_refused_combination_is_named() -> None:
    spec = TrainingSpec(lr_staleness_modulation=True, use_locking=True, overlap_pull=True, get_model_frequency=3)
    assert [field for field, _ in TrainingMode.of(spec).problems()] == [
        "lrStalenessModulation",
        "useLocking",
        "overlapPull",
        "getModelFrequency",
    ]
    assert TrainingMode.of(TrainingSpec(get_model_frequency=1)).problems() == []


def test_strategy_defaults_to_parameter_server_and_is_checked() -> None:
    assert parse_job(job_document()).uses_ps
    assert parse_job(job_document({"strategy": "parameterServer"})).uses_ps
    with pytest.raises(SpecError, match=r"^spec\.strategy: must be one of parameterServer, got 'allReduce'$"):
        parse_job(job_document({"strategy": "allReduce"}))
