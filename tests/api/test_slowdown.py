"""spec.training.slowdown: the text's grammar, refused parts named, and each worker's factor."""

from __future__ import annotations

import pytest

from elasticps.api.parsing import SpecError, parse_job
from elasticps.api.slowdown import Slowdown, SlowdownError
from job_builders import job_document


def test_a_fixed_straggler_and_the_random_protocol_parse() -> None:
    slowdown = Slowdown.parse("0:4, 3:2.5,random:6:0.25")
    assert dict(slowdown.fixed) == {0: 4.0, 3: 2.5}
    assert (slowdown.random_factor, slowdown.random_probability) == (6.0, 0.25)
    assert slowdown.active
    assert not Slowdown.parse("").active and not Slowdown.parse("1:1").active


@pytest.mark.parametrize(
    ("worker", "draw", "factor"),
    [
        (0, 0.9, 4.0),  # always slow
        (0, 0.1, 6.0),  # drew the random slowdown: the larger
        (1, 0.9, 1.0),
        (1, 0.1, 6.0),
        (1, 0.25, 1.0),  # the probability is exclusive: draws in [0, 0.25) are slow
    ],
)
def test_each_workers_factor_for_a_step(worker: int, draw: float, factor: float) -> None:
    assert Slowdown.parse("0:4,random:6:0.25").factor(worker, draw) == factor


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("w0:4", "'w0:4': expected <worker>:<factor> or random:<factor>:<probability>"),
        ("0:4:1", "'0:4:1': expected <worker>:<factor> or random:<factor>:<probability>"),
        ("-1:4", "'-1:4': expected <worker>:<factor> or random:<factor>:<probability>"),
        ("0:fast", "'0:fast': the factor 'fast' is not a number"),
        ("0:0.5", "'0:0.5': the factor must be in [1, 1000], got 0.5"),
        ("0:nan", "'0:nan': the factor must be finite, got nan"),
        ("0:1e9", "'0:1e9': the factor must be in [1, 1000], got 1e9"),
        ("random:6", "'random:6': expected random:<factor>:<probability>"),
        ("random:6:2", "'random:6:2': the probability must be in [0, 1], got 2"),
        ("0:4,0:2", "'0:2': worker 0 is named twice"),
    ],
)
def test_a_bad_slowdown_is_refused_naming_the_part(text: str, message: str) -> None:
    with pytest.raises(SlowdownError) as raised:
        Slowdown.parse(text)
    assert str(raised.value) == message
    with pytest.raises(SpecError) as refused:
        parse_job(job_document({"training": {"slowdown": text}}))
    assert str(refused.value) == f"spec.training.slowdown: {message}"


def test_the_job_takes_a_slowdown() -> None:
    job = parse_job(job_document({"training": {"slowdown": "0:4"}}))
    assert job.spec.training.slowdown == "0:4"
