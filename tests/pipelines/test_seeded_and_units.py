"""A seeded run is not private in every field a program reads (its kind, a null epsilon and delta,
``private: false``), while the budget ledger still charges it what the configuration would cost
unseeded; and a privacy-unit value of only whitespace is no unit (its rows are dead-lettered,
not merged into one "person").

The end-to-end tests run the commands: collect and estimate record
``ldp_beam.privacy.ledger_cost`` (not the seeded guarantee's null epsilon) in the budget ledger."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from ldp_beam.core import PrivacyGuarantee
from ldp_beam.privacy import (LDP, NONE, SEEDED_KIND, SEEDED_TEXT, is_seeded_guarantee,
                              ledger_cost, run_guarantee)
from ldp_beam.registry import get_registry
from ldp_beam.transforms.sinks import tidy_bytes, tidy_output, tidy_rows
from ldp_beam.bounding import MISSING_UNIT_REASON, unit_column

from ldp_beam_test_helpers import bounded_run, read_jsonl, run_cli

GRR = ("-m", "grr", "--epsilon", "2", "-p", "domain=a,b,c")

#: the end-to-end tests that need collect/estimate to record ledger_cost(guarantee) in the ledger


def _grr(eps=2.0):
    return get_registry().build("grr", {"epsilon": eps, "domain": ["a", "b", "c"]})


# --------------------------------------------------------------------------- run_guarantee
def test_a_seeded_guarantee_promises_nothing_in_every_field():
    g = run_guarantee(_grr().guarantee, seeded=True)
    assert g["kind"] == SEEDED_KIND == "none (seeded: not private)"
    assert g["epsilon"] is None and g["delta"] is None
    assert g["private"] is False and g["seeded"] is True
    assert g["unseeded"] == {"kind": LDP, "epsilon": 2.0, "delta": 0.0}
    assert g["summary"].startswith(SEEDED_TEXT) and "not private" in g["summary"]
    assert g["unseeded_summary"].startswith("LDP with epsilon=2")
    assert is_seeded_guarantee(g)
    json.dumps(g, allow_nan=False)  # strict JSON


def test_an_unseeded_guarantee_is_private_and_has_no_unseeded_part():
    g = run_guarantee(_grr().guarantee)
    assert (g["kind"], g["epsilon"], g["delta"], g["private"], g["seeded"]) == \
        (LDP, 2.0, 0.0, True, False)
    assert "unseeded" not in g and "unseeded_summary" not in g
    assert not is_seeded_guarantee(g)


def test_a_seeded_per_unit_guarantee_keeps_the_units_epsilon_unseeded():
    g = run_guarantee(_grr().guarantee, seeded=True, unit="uid", bounds=3)
    assert g["epsilon"] is None and g["kind"] == SEEDED_KIND and g["unit"] == "uid"
    assert g["unseeded"]["epsilon"] == 6.0 and "per privacy unit 'uid'" in g["unseeded_summary"]


# --------------------------------------------------------------------------- ledger_cost
def test_ledger_cost_charges_a_seeded_run_its_unseeded_cost():
    assert ledger_cost(run_guarantee(_grr().guarantee)) == (2.0, 0.0, LDP)
    assert ledger_cost(run_guarantee(_grr().guarantee, seeded=True)) == (2.0, 0.0, SEEDED_KIND)
    assert ledger_cost(run_guarantee(_grr().guarantee, seeded=True, unit="uid", bounds=3)) == \
        (6.0, 0.0, SEEDED_KIND)
    eps_delta = PrivacyGuarantee("central-DP", 1.5, 1e-6)
    assert ledger_cost(run_guarantee(eps_delta, seeded=True)) == (1.5, 1e-6, SEEDED_KIND)


def test_ledger_cost_of_no_finite_guarantee_is_infinite_seeded_or_not():
    for g in (PrivacyGuarantee(NONE, math.inf), PrivacyGuarantee(LDP, math.inf)):
        for seeded in (False, True):
            eps, delta, kind = ledger_cost(run_guarantee(g, seeded=seeded))
            assert math.isinf(eps) and delta == 0.0
            assert kind == (SEEDED_KIND if seeded else g.kind)
    # a seeded dict without its unseeded part (not built by run_guarantee): never cheaper
    eps, _, kind = ledger_cost({"kind": SEEDED_KIND, "epsilon": None, "delta": None,
                                "seeded": True})
    assert math.isinf(eps) and kind == SEEDED_KIND


# --------------------------------------------------------------------------- tidy rows
def _estimate(g):
    return {"mechanism": "grr", "n_reports": 10, "params": {"domain": ["a", "b", "c"]},
            "guarantee": g,
            "statistics": {"frequency": {"value": [0.2, 0.3, 0.5], "stderr": [0.1] * 3}}}


def test_tidy_rows_of_a_seeded_run_have_null_epsilon_and_the_seeded_kind(tmp_path):
    g = run_guarantee(_grr().guarantee, seeded=True)
    rows = tidy_output({"guarantee": g, "seeded": True, "estimate": _estimate(g)})
    assert len(rows) == 3
    for r in rows:
        assert (r["guarantee_kind"], r["epsilon"], r["delta"], r["seeded"]) == \
            (SEEDED_KIND, None, None, True)
        assert "not private" in r["guarantee"]
    # the files: null epsilon/delta, the seeded kind
    for fmt in ("csv", "parquet"):
        path = tmp_path / f"t.{fmt}"
        path.write_bytes(tidy_bytes(rows, fmt))
        t = (pacsv.read_csv(path) if fmt == "csv" else pq.read_table(path)).to_pylist()
        assert {(r["guarantee_kind"], r["epsilon"], r["delta"], r["seeded"]) for r in t} == \
            {(SEEDED_KIND, None, None, True)}


def test_tidy_rows_say_seeded_whatever_shape_the_guarantee_has():
    """An estimate that says seeded beside a guarantee of the old shape (kind LDP, epsilon 2), or
    a guarantee given as text: still the seeded kind and null epsilon in every row."""
    old = {"kind": "LDP", "epsilon": 2.0, "delta": 0.0, "summary": "seeded run: ...",
           "seeded": True}
    for est, kw in ((_estimate(old), {}), (_estimate(dict(old, seeded=False)), {"seeded": True}),
                    (_estimate("seeded run: not private"), {"seeded": True})):
        for r in tidy_rows(est, **kw):
            assert (r["guarantee_kind"], r["epsilon"], r["delta"], r["seeded"]) == \
                (SEEDED_KIND, None, None, True)
    unseeded = run_guarantee(_grr().guarantee)
    r = tidy_rows(_estimate(unseeded))[0]
    assert (r["guarantee_kind"], r["epsilon"], r["delta"], r["seeded"]) == (LDP, 2.0, 0.0, False)


# --------------------------------------------------------------------------- seeded, end to end
def _table(path, n=3000):
    rng = np.random.default_rng(5)
    pq.write_table(pa.table({"v": rng.choice(list("abc"), n)}), path)
    return str(path)


def _not_private(g):
    assert g["kind"] == SEEDED_KIND and g["epsilon"] is None and g["delta"] is None, g
    assert g["private"] is False and g["seeded"] is True, g


def test_a_seeded_collect_and_estimate_say_not_private_in_machine_readable_fields(tmp_path):
    src = _table(tmp_path / "t.parquet")
    led = f"sqlite:///{tmp_path / 'l.db'}"
    rep = tmp_path / "r.parquet"
    code, so, se = run_cli("collect", "-i", src, "-c", "v", *GRR, "--seed", "42",
                           "--ledger", led, "-o", str(rep))
    assert code == 0, se
    assert "not private" in so
    man = json.loads((tmp_path / "r.parquet.manifest.json").read_text())
    _not_private(man["guarantee"])
    assert man["guarantee"]["unseeded"] == {"kind": "LDP", "epsilon": 2.0, "delta": 0.0}
    meta = json.loads(pq.read_schema(rep).metadata[b"ldp_beam"])
    _not_private(meta["guarantee"])
    # the estimate: JSON, tidy CSV and tidy Parquet
    for name in ("e.json", "e.csv", "e.parquet"):
        code, so, se = run_cli("estimate", "-i", str(rep), "--ledger", led,
                               "-o", str(tmp_path / name))
        assert code == 0, se
    est = json.loads((tmp_path / "e.json").read_text())
    _not_private(est["guarantee"])
    _not_private(est["estimate"]["guarantee"])
    assert est["seeded"]
    for tidy in (pacsv.read_csv(tmp_path / "e.csv").to_pylist(),
                 pq.read_table(tmp_path / "e.parquet").to_pylist()):
        assert tidy and {(r["guarantee_kind"], r["epsilon"], r["delta"], r["seeded"])
                         for r in tidy} == {(SEEDED_KIND, None, None, True)}
    # the ledger still charges the collection its unseeded cost (conservatively)
    code, so, _ = run_cli("ledger", "--ledger", led, "--json")
    assert code == 0
    (entry,) = [e for e in json.loads(so)["entries"]
                if e["status"] == "committed" and e["command"] == "collect"]
    assert entry["epsilon"] == 2.0 and entry["delta"] == 0.0 and entry["seeded"]
    assert entry["kind"] == SEEDED_KIND


def test_a_seeded_central_release_says_not_private_and_is_charged(tmp_path):
    src = _table(tmp_path / "t.parquet")
    led = f"sqlite:///{tmp_path / 'l.db'}"
    code, _, se = run_cli("estimate", "-i", src, "-c", "v", "-m", "laplace-histogram",
                          "--epsilon", "1", "-p", "categories=a,b,c", "--seed", "7",
                          "--ledger", led, "-o", str(tmp_path / "h.csv"))
    assert code == 0, se
    rows = pacsv.read_csv(tmp_path / "h.csv").to_pylist()
    assert rows and {(r["guarantee_kind"], r["epsilon"], r["seeded"]) for r in rows} == \
        {(SEEDED_KIND, None, True)}
    code, so, _ = run_cli("ledger", "--ledger", led, "--json")
    (entry,) = [e for e in json.loads(so)["entries"] if e["status"] == "committed"]
    assert entry["epsilon"] == 1.0 and entry["kind"] == SEEDED_KIND and entry["seeded"]


# --------------------------------------------------------------------------- whitespace units
def test_unit_column_counts_whitespace_only_text_as_missing():
    vals = ["u1", "   ", "\t", "", None, "\u00a0\u3000", " u2 ", "\n\r", "x y", "\u2003"]
    want = [False, True, True, True, True, True, False, True, False, True]
    for typ in (pa.string(), pa.large_string()):
        _, missing = unit_column(pa.array(vals, typ), "uid")
        assert missing.tolist() == want, typ
    _, missing = unit_column(pa.array(vals).dictionary_encode(), "uid")
    assert missing.tolist() == want
    _, missing = unit_column(pa.chunked_array([pa.array(vals[:5]), pa.array(vals[5:])]), "uid")
    assert missing.tolist() == want
    b = [None if v is None else v.encode() for v in vals]
    _, missing = unit_column(pa.array(b, pa.binary()), "uid")
    assert missing.tolist() == want
    # bytes that are not UTF-8: ASCII whitespace
    _, missing = unit_column(pa.array([b"\xff", b" \t", b"", b"a", None], pa.binary()), "uid")
    assert missing.tolist() == [False, True, True, False, True]
    _, missing = unit_column(pa.array([1, None, 0]), "uid")
    assert missing.tolist() == [False, True, False]
    _, missing = unit_column(pa.array([1.0, float("nan"), None]), "uid")
    assert missing.tolist() == [False, True, True]


def _whitespace_table(path):
    """10 rows of "   ", one of "\\t", one of no-break spaces; units u1 (3 rows), u2, " u3 "."""
    uid = ["   "] * 10 + ["\t", "\u00a0\u3000", "u1", "u1", "u1", "u2", " u3 "]
    order = np.random.default_rng(1).permutation(len(uid))
    pq.write_table(pa.table({"uid": [uid[i] for i in order],
                             "v": np.array(list("abc"))[np.arange(len(uid)) % 3][order]}), path)
    return len(uid)


def test_whitespace_units_are_dead_lettered_not_one_unit(tmp_path):
    from ldp_beam.rng import RunKey

    n = _whitespace_table(tmp_path / "t.parquet")
    kept, deads, n_dropped = bounded_run(tmp_path / "t.parquet", RunKey.new(), tmp_path,
                                         batch_rows=4)
    n_kept = len(kept)
    assert n_kept == 3  # u1, u2 and " u3 " (text around its spaces: a unit)
    assert len(deads) == 12 and n_dropped == 2  # u1's two other rows
    assert n_kept + len(deads) + n_dropped == n
    reason = MISSING_UNIT_REASON.format(col="uid")
    assert reason == "missing privacy unit: column 'uid' is null, empty or only whitespace"
    assert {d["reason"] for d in deads} == {reason}


def test_a_collect_dead_letters_whitespace_units_and_reconciles(tmp_path):
    n = _whitespace_table(tmp_path / "t.parquet")
    code, _, se = run_cli("collect", "-i", str(tmp_path / "t.parquet"), "-c", "v", *GRR,
                          "--privacy-unit", "uid", "-o", str(tmp_path / "r.parquet"))
    assert code == 0, se
    man = json.loads((tmp_path / "r.parquet.manifest.json").read_text())
    rec = man["records"]
    assert (rec["input"], rec["reported"], rec["dead_lettered"], rec["bounded_out"]) == \
        (n, 3, 12, 2)
    assert rec["reconciles"]
    dead = read_jsonl(os.path.join(tmp_path, "r.parquet.deadletter.jsonl"))
    assert len(dead) == 12 and {d["reason"] for d in dead} == \
        {"missing privacy unit: column 'uid' is null, empty or only whitespace"}


def test_stream_units_of_only_whitespace_are_no_unit():
    """The streaming path decides a unit's missingness on its own (one record at a time): a
    unit of only whitespace is refused there too, and the spool's dead letter says why without
    showing the value."""
    from ldp_beam.longitudinal import unit_text
    from ldp_beam.transforms.spool import pseudonymize

    for blank in ("", "   ", "\t", "\u00a0\u2003"):
        with pytest.raises(ValueError, match="empty or only whitespace"):
            unit_text(blank)
    assert unit_text(" u3 ") == " u3 " and unit_text(7.0) == "7"

    def hasher(v):
        return "h:" + unit_text(v)

    rec = {"uid": "  ", "v": 1}
    reason = pseudonymize(rec, "uid", hasher)
    assert reason is not None and "empty or only whitespace" in reason
    assert rec["uid"] == "<withheld>"
