"""Fixtures shared by the core tests (the session-wide ones are in tests/conftest.py)."""
from __future__ import annotations

import pytest

from ldp_beam.pipelines.datasets import dataset_identity


@pytest.fixture
def data(tmp_path):
    """A CSV dataset and its identity (the ledger tests; a module may define its own)."""
    p = tmp_path / "data" / "survey.csv"
    p.parent.mkdir()
    p.write_text("uid,age\n" + "".join(f"{i},{20 + i % 50}\n" for i in range(200)))
    return dataset_identity(str(p))
