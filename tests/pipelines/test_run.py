"""The Run engine (issue 25): one lifecycle for every batch command, and what it makes true for
all of them at once: a re-run of an identical central release (global or per key) publishes the
recorded release again and spends nothing; central releases are their own type."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam.core import CentralRelease, Configured, Mechanism
from ldp_beam.errors import InvalidRecordsError
from ldp_beam.registry import get_registry
from ldp_beam_test_helpers import run_cli

HIST = ("-m", "laplace-histogram", "--epsilon", "1", "-p", "categories=a,b,c")


def _table(path):
    uid = np.repeat(np.arange(600), 3)
    v = np.random.default_rng(1).choice(list("abc"), uid.size)
    region = np.where(uid < 400, "north", "south").astype(object)
    pq.write_table(pa.table({"uid": uid.astype(str), "v": v, "region": region}), path)


def _committed_epsilon(ledger_url):
    code, so, se = run_cli("ledger", "--ledger", ledger_url, "--json")
    assert code == 0, se
    entries = [e for e in json.loads(so)["entries"] if e["status"] == "committed"]
    return len(entries), sum(e["epsilon"] for e in entries)


@pytest.mark.parametrize("per_key", [False, True], ids=["global", "per-key"])
def test_rerun_of_an_identical_release_republishes_and_spends_nothing(tmp_path, per_key):
    _table(tmp_path / "t.parquet")
    led = f"sqlite:///{tmp_path / 'ledger.db'}"
    args = ["estimate", "-i", str(tmp_path / "t.parquet"), "-c", "v", *HIST,
            "--privacy-unit", "uid", "--ledger", led, "--force"]
    if per_key:
        args += ["--by", "region", "--partition-selection", "1,1e-6"]
    outs = []
    for i in range(2):
        code, so, se = run_cli(*args, "-o", str(tmp_path / f"h{i}.json"))
        assert code == 0, se
        outs.append(json.loads((tmp_path / f"h{i}.json").read_text()))
    stats = "estimates" if per_key else "estimate"
    assert outs[0][stats] == outs[1][stats]  # the same numbers: no second draw
    cur = json.loads((tmp_path / "h1.json.curator.json").read_text())
    assert cur["republished_from"]
    # two runs recorded, spent once: epsilon 1 (+1 for the key selection), not twice
    assert _committed_epsilon(led) == (2, pytest.approx(2.0 if per_key else 1.0))


def test_a_release_from_a_database_table_is_computed_again_not_republished(tmp_path):
    """A table's identity is its name, not its content: an identical request on it may see
    other rows, so it is never answered with the recorded release."""
    import duckdb

    db = tmp_path / "w.db"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE t AS SELECT CAST(i AS VARCHAR) AS uid, "
                    "['a', 'b', 'c'][1 + i % 3] AS v FROM range(300) r(i)")
    led = f"sqlite:///{tmp_path / 'ledger.db'}"
    args = ["estimate", "-i", f"duckdb://{db}?table=t", "-c", "v", *HIST,
            "--privacy-unit", "uid", "--ledger", led, "--force"]
    for i in range(2):
        code, _, se = run_cli(*args, "-o", str(tmp_path / f"h{i}.json"))
        assert code == 0, se
        if i == 0:  # the table grows between the two runs
            with duckdb.connect(str(db)) as con:
                con.execute("INSERT INTO t SELECT CAST(i AS VARCHAR), 'a' FROM range(300, 900) "
                            "r(i)")
    assert "republished_from" not in json.loads((tmp_path / "h1.json.curator.json").read_text())
    assert _committed_epsilon(led) == (2, pytest.approx(2.0))


def test_a_release_read_with_other_null_values_is_another_request(tmp_path):
    """--null-values changes the rows read (CSV): a re-run with others is not identical."""
    import pyarrow.csv as pacsv

    _table(tmp_path / "t.parquet")
    pacsv.write_csv(pq.read_table(tmp_path / "t.parquet"), tmp_path / "t.csv")
    led = f"sqlite:///{tmp_path / 'ledger.db'}"
    args = ["estimate", "-i", str(tmp_path / "t.csv"), "-c", "v", *HIST,
            "--privacy-unit", "uid", "--ledger", led, "--force"]
    for i, extra in enumerate(((), ("--null-values", "a"))):
        code, _, se = run_cli(*args, *extra, "-o", str(tmp_path / f"h{i}.json"))
        assert code == 0, se
    assert "republished_from" not in json.loads((tmp_path / "h1.json.curator.json").read_text())
    assert _committed_epsilon(led) == (2, pytest.approx(2.0))


def test_central_releases_are_not_mechanisms():
    reg = get_registry()
    for name in reg.names():
        cls = reg.get(name).mechanism
        assert issubclass(cls, Configured)
        assert issubclass(cls, CentralRelease) != issubclass(cls, Mechanism), name
        if issubclass(cls, CentralRelease):
            assert not hasattr(cls, "randomize") and not hasattr(cls, "perturb"), name
            assert not hasattr(cls, "publish"), name


def test_a_central_release_checks_and_encodes_records_without_noise():
    m = get_registry().build("laplace-histogram", {"epsilon": 1.0, "categories": "a,b,c"})
    assert isinstance(m, CentralRelease) and m.draws == 0
    rec = m.records(np.array(["c", "a", "a"], dtype=object))
    assert rec["bucket"].tolist() == [2, 0, 0]  # true values, encoded: the noise comes once
    with pytest.raises(InvalidRecordsError):
        m.records(np.array(["a", "zzz"], dtype=object))
    est = m.estimator(seed=3)
    acc = est.add(est.create(), rec)
    e = est.finalize(acc)
    assert e.n_reports is None and e["histogram"].value.shape == (3,)
    # exact discrete Laplace of scale 1 (sensitivity 1, epsilon 1): variance
    # 2 e^-1 / (1 - e^-1)^2 = 1.841, not the continuous Laplace's 2
    assert e["histogram"].stderr == pytest.approx(np.sqrt(2 * np.exp(-1) / (1 - np.exp(-1)) ** 2),
                                                  rel=1e-6)


def test_an_interrupt_inside_beams_ipython_check_is_not_lost(monkeypatch):
    """Beam's is_in_ipython (called while a pipeline is built) re-raises only KeyboardInterrupt
    and SystemExit from its bare except: a SIGTERM arriving while it imports IPython was
    swallowed and the run committed. Interrupted is a KeyboardInterrupt, so it propagates."""
    import builtins
    import signal

    from apache_beam.utils import interactive_utils

    from ldp_beam.pipelines.lifecycle import Interrupted

    real = builtins.__import__

    def importing(name, *args, **kwargs):
        if name == "IPython":
            raise Interrupted(signal.SIGTERM)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", importing)
    with pytest.raises(Interrupted) as caught:
        interactive_utils.is_in_ipython()
    assert caught.value.exit_code == 143


def test_a_release_with_no_valid_row_is_noise_alone_not_a_fixed_error(tmp_path):
    """Every row dead-lettered: the release is a noisy empty histogram, as for any input (a
    fixed error for no rows, where one person's valid row gives a noisy histogram, would tell
    the two apart with certainty)."""
    pq.write_table(pa.table({"v": ["z"] * 50}), tmp_path / "t.parquet")
    code, _, se = run_cli("estimate", "-i", str(tmp_path / "t.parquet"), "-c", "v", *HIST,
                          "-o", str(tmp_path / "h.json"))
    assert code == 0, se
    out = json.loads((tmp_path / "h.json").read_text())
    assert "error" not in out["estimate"]
    assert len(out["estimate"]["statistics"]["histogram"]["value"]) == 3
    cur = json.loads((tmp_path / "h.json.curator.json").read_text())["records"]
    assert cur["released_from"] == 0 and cur["dead_lettered"] == 50 and cur["reconciles"]
