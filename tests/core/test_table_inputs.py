"""Python API parity (issue 26): a DataFrame or Arrow table with many columns is mapped by role
(it used to fail with "operands could not be broadcast together"), and `perturb` can return
the dead letters instead of raising for one bad row, with every input row accounted for."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from ldp_beam.errors import InvalidRecordsError, ParameterError
from ldp_beam.registry import get_registry


@pytest.fixture
def grr():
    return get_registry().build("grr", {"epsilon": 1.0, "domain": "a,b,c"})


def _frame(n=30000):
    rng = np.random.default_rng(3)
    return pd.DataFrame({"id": np.arange(n), "value": rng.choice(list("abc"), n),
                         "age": rng.integers(18, 90, n), "region": "north"})


def test_a_four_column_frame_is_mapped_by_role(grr):
    df = _frame()
    a = grr.perturb(df, rng=5)["v"]
    b = grr.perturb(df["value"].to_numpy(), rng=5)["v"]
    assert np.array_equal(a, b)  # the same reports as the column alone
    t = pa.Table.from_pandas(df.rename(columns={"value": "answer"}))
    c = grr.perturb(t, rng=5, roles={"value": "answer"})["v"]
    assert np.array_equal(a, c)


def test_a_frame_without_the_role_column_names_the_columns(grr):
    with pytest.raises(ParameterError, match=r"roles=\{'value': COLUMN\}.*'id', 'age', 'region'"):
        grr.perturb(_frame(10).drop(columns=["value"]))
    with pytest.raises(ParameterError, match="columns of the table"):
        grr.perturb(_frame(10), roles={"value": "nope"})
    with pytest.raises(ParameterError, match="a mapping for a table input"):
        grr.perturb(np.array(["a"]), roles={"value": "x"})


def test_on_invalid_return_keeps_going_and_accounts_for_every_row(grr):
    df = _frame(20000)
    bad_rows = [3, 17, 19999]
    df.loc[bad_rows, "value"] = ["zz", None, "q"]
    with pytest.raises(InvalidRecordsError):
        grr.perturb(df)
    reports, dead = grr.perturb(df, on_invalid="return")
    assert sorted(dead) == bad_rows and "'zz' is not in the declared domain" in dead[3]
    assert reports["v"].size + len(dead) == len(df)
    # the valid rows' reports are GRR's: P(report = truth) = e / (e + 2) for each, within 4 SE
    truth = pd.Series(df["value"]).drop(index=bad_rows).map({"a": 0, "b": 1, "c": 2}).to_numpy()
    p, n = np.e / (np.e + 2), truth.size
    kept = float(np.mean(reports["v"] == truth))
    assert abs(kept - p) < 4 * np.sqrt(p * (1 - p) / n)
    with pytest.raises(ParameterError, match="on_invalid"):
        grr.perturb(df, on_invalid="drop")
    reports, dead = grr.perturb(pd.DataFrame({"value": ["zz"]}), on_invalid="return")
    assert reports["v"].size == 0 and list(dead) == [0]
