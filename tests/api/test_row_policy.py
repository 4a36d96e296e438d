"""spec.training.embeddingPolicy: the text's grammar, each table's policy, refused parts named."""

from __future__ import annotations

import pytest

from elasticps.api.parsing import SpecError, parse_job
from elasticps.api.row_policy import Eviction, RowPolicies, RowPolicy, RowPolicyError
from job_builders import job_document


def test_a_default_and_a_tables_own_keys_over_it() -> None:
    policies = RowPolicies.parse(" admitAfter=2, ttl=100000 ; user_id:maxRows=5000000,evict=lfu;item:admitAfter=1")
    assert policies.default == RowPolicy(admit_after=2, ttl=100000)
    assert policies.of("user_id") == RowPolicy(admit_after=2, ttl=100000, max_rows=5000000, evict=Eviction.LFU)
    assert policies.of("item") == RowPolicy(admit_after=1, ttl=100000)
    assert policies.of("other") is policies.default
    assert RowPolicies.parse("") == RowPolicies() and not RowPolicies().default.bounded
    assert RowPolicies.parse("t:ttl=5").default == RowPolicy()  # a table's clause alone leaves the default


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("admit=2", "'admit=2': 'admit=2' is not one of admitAfter=..., ttl=..., maxRows=..., evict=..., filterWidth=..."),
        ("ttl=10,ttl=20", "'ttl=10,ttl=20': ttl is given twice"),
        ("ttl=-1", "'ttl=-1': ttl='-1' is not a whole number >= 0"),
        ("admitAfter=0", "'admitAfter=0': admitAfter must be in [1, 255], got 0"),
        ("admitAfter=256", "'admitAfter=256': admitAfter must be in [1, 255], got 256"),
        ("maxRows=3", "'maxRows=3': maxRows must be 0 (no cap) or at least 16, got 3"),
        ("filterWidth=8", "'filterWidth=8': filterWidth must be in [1024, 1073741824], got 8"),
        ("evict=fifo", "'evict=fifo': evict='fifo', expected lru or lfu"),
        ("ttl=1;maxRows=100", "'maxRows=100': a second clause for every table (name a table, or join them with ',')"),
        ("a b:ttl=1", "'a b:ttl=1': 'a b' is no table name"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_part(text: str, message: str) -> None:
    with pytest.raises(RowPolicyError) as raised:
        RowPolicies.parse(text)
    assert str(raised.value) == message
    with pytest.raises(SpecError) as refused:
        parse_job(job_document({"training": {"embeddingPolicy": text}}))
    assert str(refused.value) == f"spec.training.embeddingPolicy: {message}"


def test_the_job_takes_a_policy() -> None:
    job = parse_job(job_document({"training": {"embeddingPolicy": "admitAfter=2,ttl=1000"}}))
    assert RowPolicies.parse(job.spec.training.embedding_policy).default == RowPolicy(admit_after=2, ttl=1000)
