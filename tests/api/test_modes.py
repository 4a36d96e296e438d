"""The training mode derived from spec.training: its label (the MODE column) and the combinations refused."""

from __future__ import annotations

from typing import Any

import pytest
from job_builders import job_document

from elasticps.api.modes import LOCAL_SGD_ONLY, LOCAL_SGD_SYNC, LocalSGD, TrainingMode, UpdateRule
from elasticps.api.parsing import SpecError, parse_job
from elasticps.api.spec import StalenessCompensation, TrainingSpec


@pytest.mark.parametrize(
    "training, rule, label",
    [
        ({}, UpdateRule.SYNC, "Sync"),
        ({"use_async": True}, UpdateRule.ASYNC, "Async"),
        ({"use_async": True, "lr_staleness_modulation": True}, UpdateRule.ASYNC, "Async+StalenessLR"),
        ({"use_async": True, "get_model_frequency": 4}, UpdateRule.ASYNC, "Async+SSP4"),
        (
            {"use_async": True, "staleness_compensation": StalenessCompensation.NONE, "get_model_frequency": 4},
            UpdateRule.ASYNC,
            "Async+Uncompensated+SSP4",
        ),
        (
            {"use_async": True, "lr_staleness_modulation": True, "get_model_frequency": 2},
            UpdateRule.ASYNC,
            "Async+StalenessLR+SSP2",
        ),
        ({"local_sgd_steps": 4}, UpdateRule.LOCAL_SGD, "LocalSGD4"),
        ({"local_sgd_steps": 4, "local_sgd_warmup_steps": 100}, UpdateRule.LOCAL_SGD, "LocalSGD4"),
        ({"local_sgd_steps": 8, "adaptive_local_sgd": True, "local_sgd_inf_loss": 0.6}, UpdateRule.LOCAL_SGD, "LocalSGDAdaptive"),
        ({"local_sgd_steps": 2, "grads_to_wait": 3}, UpdateRule.LOCAL_SGD, "LocalSGD2"),
    ],
)
def test_mode_of_training(training: dict[str, Any], rule: UpdateRule, label: str) -> None:
    mode = TrainingMode.of(TrainingSpec(**training))
    assert mode.rule is rule
    assert mode.label == label
    assert mode.problems() == []


def test_async_compensates_staleness_by_momentum_correction_unless_told() -> None:
    assert TrainingMode.of(TrainingSpec(use_async=True)).compensation is StalenessCompensation.MOMENTUM_CORRECTION
    spec = parse_job(job_document({"training": {"useAsync": True, "stalenessCompensation": "none"}})).spec
    assert TrainingMode.of(spec.training).compensation is StalenessCompensation.NONE
    # the default, spelled out, is no problem in sync
    assert parse_job(job_document({"training": {"stalenessCompensation": "momentumCorrection"}})).spec
    with pytest.raises(SpecError, match=r"^spec\.training\.stalenessCompensation: must be one of none, momentumCorrection"):
        parse_job(job_document({"training": {"useAsync": True, "stalenessCompensation": "dcasgd"}}))


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
            {"stalenessCompensation": "none"},
            "stalenessCompensation",
            "needs useAsync: true (a round's gradients are never stale)",
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
    with pytest.raises(SpecError, match=r"^spec\.strategy: must be one of parameterServer, decentralized, got 'allReduce'$"):
        parse_job(job_document({"strategy": "allReduce"}))


def test_localsgd_carries_its_period_settings() -> None:
    mode = TrainingMode.of(
        TrainingSpec(local_sgd_steps=8, local_sgd_warmup_steps=50, adaptive_local_sgd=True, local_sgd_inf_loss=0.5)
    )
    assert mode.local_sgd == LocalSGD(steps=8, warmup_steps=50, adaptive=True, inf_loss=0.5)
    assert mode.rounds and TrainingMode().rounds and not TrainingMode(rule=UpdateRule.ASYNC).rounds


@pytest.mark.parametrize(
    ("training", "field", "why"),
    [
        ({"localSGDSteps": 4, "useAsync": True}, "localSGDSteps", LOCAL_SGD_SYNC),
        ({"localSGDSteps": 4, "lrStalenessModulation": True}, "lrStalenessModulation", "needs useAsync: true"),
        (
            {"localSGDSteps": 4, "getModelFrequency": 2},
            "getModelFrequency",
            "needs useAsync: true (local steps between pulls are asynchronous SGD)",
        ),
        ({"localSGDWarmupSteps": 10}, "localSGDWarmupSteps", LOCAL_SGD_ONLY),
        ({"adaptiveLocalSGD": True}, "adaptiveLocalSGD", LOCAL_SGD_ONLY),
        ({"localSGDInfLoss": 0.6, "useAsync": True}, "localSGDInfLoss", LOCAL_SGD_ONLY),
    ],
)
def test_localsgd_combinations_that_cannot_run_are_refused_naming_the_field(
    training: dict[str, Any], field: str, why: str
) -> None:
    with pytest.raises(SpecError) as raised:
        parse_job(job_document({"training": training}))
    assert str(raised.value) == f"spec.training.{field}: {why}"


def test_localsgd_fields_are_spelled_as_the_issue_names_them() -> None:
    job = parse_job(
        job_document(
            {"training": {"localSGDSteps": 4, "localSGDWarmupSteps": 8, "adaptiveLocalSGD": True, "localSGDInfLoss": 0.1}}
        )
    )
    training = job.spec.training
    assert TrainingMode.of(training).label == "LocalSGDAdaptive"
    assert (training.local_sgd_steps, training.local_sgd_warmup_steps) == (4, 8)
    assert training.adaptive_local_sgd and training.local_sgd_inf_loss == 0.1


def test_adaptive_localsgd_needs_an_sgd_optimizer() -> None:
    adaptive = TrainingMode.of(TrainingSpec(local_sgd_steps=4, adaptive_local_sgd=True))
    assert adaptive.optimizer_problem("sgd") is None
    assert adaptive.optimizer_problem("adam") == (
        "adaptiveLocalSGD needs an SGD optimizer (K follows its learning rate), the model's is adam"
    )
    assert TrainingMode.of(TrainingSpec(local_sgd_steps=4)).optimizer_problem("adam") is None  # its own, between averagings


def test_tables_served_from_the_ps_are_refused_by_local_sgd_only() -> None:
    local = TrainingMode.of(TrainingSpec(local_sgd_steps=4))
    assert "LocalSGD" in (local.tables_problem(True) or "")
    assert local.tables_problem(False) is None
    for spec in (TrainingSpec(), TrainingSpec(use_async=True), TrainingSpec(use_async=True, get_model_frequency=4)):
        assert TrainingMode.of(spec).tables_problem(True) is None, spec
