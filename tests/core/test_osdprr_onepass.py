"""OsdpRR's one-pass release (issue 16): each record's Bernoulli(q) keep decision drawn where the
row is read, from a uniform addressed by the row's identity; the estimator keeps four integers
(users, released records, exact S, exact Q in units of 2^-1074); the release draws nothing.

Checked here: the exact summation (against rational arithmetic and math.fsum; the same integers
for any split); the one-pass release equals the in-memory release bit for bit for the same
draws, and the former floating-point formulas within rounding; keep frequencies match q within
binomial standard errors (and sensitive records are never kept); seeded releases are
bit-identical across batch sizes and runners; unseeded runs sample differently; counts
reconcile; the accumulator does not grow with users, and the rows cap no longer applies."""
from __future__ import annotations

import math
import pickle
import tracemalloc
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam.central.osdprr import OsdpRR, OsdpRREstimator, exact_sum_units, from_exact_units
from ldp_beam.central.ospdprr import QUERIES, query_answer
from ldp_beam.errors import ParameterError
from ldp_beam.rng import RandomSource, RunKey
from ldp_beam_test_helpers import (emitted_rows, release_on_two_runners, release_pipeline,
                                   sampling_table)

Z = 4.5  # standard errors allowed for a binomial count (two-sided p ~ 7e-6 per check)
U = dict(lower=0.0, upper=100.0)
MULTI = ["--runner=DirectRunner", "--direct_num_workers=2",
         "--direct_running_mode=multi_processing"]


def _kw(query):
    return dict(lower=1.0, upper=100.0) if query == "cv" else U


# --------------------------------------------------------------------------- exact sums
def test_exact_sum_is_the_rational_sum_and_rounds_like_fsum():
    """Mixed magnitudes (1e-320 .. 1e300, subnormals, signed zeros, cancellation): the integer
    is the exact rational sum in units of 2^-1074, it rounds to math.fsum's correctly rounded
    float, and any split of the values adds up to the same integer."""
    g = np.random.default_rng(1)
    special = np.array([5e-324, -5e-324, 2.2250738585072014e-308, 1e-310, 0.0, -0.0, 1e300,
                        -1e300, 0.1, 0.2, 0.3])
    for trial in range(300):
        n = int(g.integers(0, 400))
        kind = trial % 3
        if kind == 0:
            x = g.uniform(-100, 100, n)
        elif kind == 1:
            x = g.standard_normal(n) * 10.0 ** g.integers(-320, 300, n)
        else:
            x = g.choice(special, n)
        units = exact_sum_units(x)
        assert Fraction(units, 1 << 1074) == sum((Fraction(float(v)) for v in x), Fraction(0))
        assert from_exact_units(units) == math.fsum(x)
        cut = np.sort(g.integers(0, n + 1, 3))
        parts = np.split(g.permutation(x), cut)
        assert sum(exact_sum_units(p) for p in parts) == units
    assert exact_sum_units(np.zeros(0)) == 0 and from_exact_units(0) == 0.0
    for bad in (np.inf, -np.inf, np.nan):  # no integer mantissa: refused, never a wrong sum
        with pytest.raises(ParameterError, match="finite"):
            exact_sum_units(np.array([1.0, bad]))


def test_exact_sum_is_exact_where_float_summation_is_not():
    """1e16 + 1 - 1e16 ... : float64 addition loses the ones; the exact sum keeps them."""
    x = np.array([1e16, 1.0, -1e16] * 1000 + [1.0])
    assert from_exact_units(exact_sum_units(x)) == 1001.0
    assert sum(x.tolist()) == 1.0  # left-to-right float addition: 1e16 + 1 rounds to 1e16


# --------------------------------------------------------------------------- the release
def _data(n, k, g, sensitive=0.5, lower=0.0):
    data = {f"value{i}": g.uniform(max(lower, 0.0), 100, n) for i in range(1, k + 1)}
    for i in range(1, k + 1):
        data[f"level{i}"] = np.where(g.random(n) < sensitive, g.uniform(0.01, 1.0, n), 0.0)
    return data


def _rows(mech, data):
    cols, reasons = mech.check(data)
    assert not reasons.bad.any()
    vals = np.column_stack([cols[f"value{i}"] for i in mech.target])
    sens = np.column_stack([cols[f"sensitive{i}"] for i in mech.target])
    return vals, sens


@pytest.mark.parametrize("query", QUERIES)
def test_one_pass_release_equals_the_in_memory_release(query):
    """The same uniforms (one Generator, (n, k_T) draws) give the same records kept, and the
    estimator's release -- batches folded and merged in a shuffled order -- has the in-memory
    release's statistics, bit for bit."""
    g = np.random.default_rng(2)
    mech = OsdpRR(epsilon=0.7, query=query, k=3, target=(1, 3), **_kw(query))
    data = {k: v for k, v in _data(3000, 3, g, lower=1.0).items() if not k.endswith("2")}
    rep = mech.records(data, rng=np.random.default_rng(5))
    vals, sens = _rows(mech, data)
    ref = mech.release(vals, sens, np.random.default_rng(5))
    kept = ref.curator["kept"]
    np.testing.assert_array_equal(np.column_stack([rep["released1"], rep["released3"]]),
                                  kept.astype(np.uint8))
    est = OsdpRREstimator(mech)
    whole = est.add(est.create(), rep)
    parts = [est.add(est.create(), {k: v[s:s + 257] for k, v in rep.items()})
             for s in range(0, 3000, 257)]
    g.shuffle(parts)
    merged = est.merge([est.merge(parts[:5]), est.create(), est.merge(parts[5:])])
    assert merged.tolist() == whole.tolist() and est.n_reports(whole) == 3000
    assert whole[1] == int(kept.sum())
    out = est.finalize(merged)
    assert out.n_reports is None
    for name, s in ref.statistics.items():
        assert out[name].to_dict() == s.to_dict(), name


@pytest.mark.parametrize("query", QUERIES)
def test_statistics_match_the_former_floating_point_formulas(query):
    """Against a direct computation on the released records (numpy's pairwise float sums, as
    the former release computed them): equal counts, and sums within the float summation's
    rounding (n * 2^-52 relative); the exact sums equal math.fsum of the released terms."""
    g = np.random.default_rng(3)
    kw = _kw(query)
    mech = OsdpRR(epsilon=0.9, query=query, k=2, **kw)
    data = _data(5000, 2, g, lower=kw["lower"])
    vals, sens = _rows(mech, data)
    rel = mech.release(vals, sens, np.random.default_rng(8))
    v = vals[rel.curator["kept"]]
    n_rel, s, ss = float(v.size), float(v.sum()), float(np.square(v).sum())
    recs, su, qu = rel.curator["exact"]
    assert recs == v.size > 0
    need_s, need_q = mech.exact_sums
    if need_s:
        assert from_exact_units(su) == math.fsum(v.tolist())
    if need_q:
        assert from_exact_units(qu) == math.fsum(np.square(v).tolist())
    tol = 8 * v.size * 2.0 ** -52
    q = mech.keep_probability
    st = rel.statistics
    assert st["released_records"].value == v.size
    if query == "count":
        assert st["count_raw"].value == n_rel and st["count"].value == n_rel / q
        assert st["count"].stderr == math.sqrt(n_rel * (1 - q)) / q
    elif query == "sum":
        assert st["sum_raw"].value == pytest.approx(s, rel=tol)
        assert st["sum"].value == pytest.approx(s / q, rel=tol)
        assert st["sum"].stderr == pytest.approx(math.sqrt(ss * (1 - q)) / q, rel=tol)
    else:
        value, clipped = query_answer(query, n_rel, s, ss, mech.lower, mech.upper,
                                      mech.resolved_mean_floor)
        assert st[query].value == pytest.approx(float(value), rel=1e-9)
        assert st[query].clipped == pytest.approx(float(clipped), rel=1e-9)


def test_keep_frequencies_match_q_and_sensitive_records_are_never_released():
    """40,000 rows of two target items, pipeline-style addressed draws from a secret run key:
    no sensitive record is released; each item's non-sensitive records are kept with frequency
    within Z binomial standard errors of q = 1 - e^-eps (and 1 - e^(-eps/2) at Linf = 2); the
    two items' draws are independent: both kept within Z standard errors of q^2."""
    for linf in (1, 2):
        eps, n = 0.8, 40_000
        mech = OsdpRR(epsilon=eps, k=2, query="count", max_rows_per_partition=linf, **U)
        q = -math.expm1(-eps / linf)
        assert mech.keep_probability == pytest.approx(q)
        data = {"value1": np.full(n, 50.0), "value2": np.full(n, 50.0),
                "level1": np.where(np.arange(n) % 4 == 0, 0.5, 0.0), "level2": np.zeros(n)}
        src = RunKey.new().source()
        rep = emitted_rows(mech, data, rng=src, stream=0, offset=0)
        sens1 = data["level1"] > 0
        assert rep["released1"][sens1].sum() == 0
        for name, mask in (("released1", ~sens1), ("released2", np.ones(n, bool))):
            m = int(mask.sum())
            hits = int(rep[name][mask].sum())
            assert abs(hits - m * q) <= Z * math.sqrt(m * q * (1 - q)), (linf, name, hits)
        both = int((rep["released1"][~sens1] & rep["released2"][~sens1]).sum())
        m = int((~sens1).sum())
        assert abs(both - m * q * q) <= Z * math.sqrt(m * q * q * (1 - q * q)), (linf, both)
        est = OsdpRREstimator(mech)
        e = est.finalize(est.add(est.create(), rep))
        assert e["released_records"].value == int(rep["released1"].sum()
                                                  + rep["released2"].sum())


def test_the_scaled_sum_is_unbiased_for_the_non_sensitive_total():
    """300 one-pass releases (fresh run keys): the scaled sum's mean is within Z standard errors
    of the non-sensitive total, its sample variance within Z standard errors of the theory's
    sum v^2 (1 - q)/q (normal approximation of the variance's error), and the stated stderr^2
    (released sum of squares x (1 - q)/q^2) estimates that variance without bias."""
    g = np.random.default_rng(4)
    mech = OsdpRR(epsilon=0.5, k=1, query="sum", **U)
    data = _data(400, 1, g, sensitive=0.3)
    vals, sens = _rows(mech, data)
    ns = vals[~sens.astype(bool)]
    q = mech.keep_probability
    var = float(np.square(ns).sum()) * (1 - q) / q
    est = OsdpRREstimator(mech)
    out = [est.finalize(est.add(est.create(), emitted_rows(
        mech, data, rng=RunKey.new().source(), stream=0, offset=0)))["sum"] for _ in range(300)]
    draws = np.array([s.value for s in out])
    stated = np.array([s.stderr ** 2 for s in out])
    assert abs(draws.mean() - ns.sum()) <= Z * math.sqrt(var / 300)
    assert abs(draws.var(ddof=1) / var - 1) <= Z * math.sqrt(2 / 299)
    assert abs(stated.mean() - var) <= Z * stated.std(ddof=1) / math.sqrt(300)


# --------------------------------------------------------------------------- the estimator
def test_reports_without_decisions_are_refused():
    est = OsdpRREstimator(OsdpRR(epsilon=0.8, **U))
    with pytest.raises(ParameterError, match="released"):
        est.add(est.create(), {"value1": np.ones(3), "sensitive1": np.zeros(3)})
    acc = est.add(est.create(), {"value1": np.zeros(0), "released1": np.zeros(0, np.uint8)})
    assert acc.tolist() == est.create().tolist() == [0, 0, 0, 0] and est.n_reports(acc) == 0


def _fold_peak(mech, n, batch):
    """Peak traced memory of folding n rows, ``batch`` rows at a time, into one accumulator
    (each batch's reports made and dropped inside the loop), and the accumulator."""
    est = OsdpRREstimator(mech)
    g = np.random.default_rng(4)
    data = {"value1": g.uniform(0, 100, batch),
            "level1": np.where(g.random(batch) < 0.5, g.uniform(0, 1, batch), 0.0)}
    src = RandomSource(2)
    tracemalloc.start()
    try:
        acc = est.create()
        for s in range(0, n, batch):
            acc = est.add(acc, emitted_rows(mech, data, rng=src, stream=0, offset=s))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, acc, est


def test_the_accumulator_does_not_grow_with_users():
    """20,000 vs 400,000 users folded in batches of 2,000: four integers either way (each a few
    bits longer: a count or an exact sum 20 times as large), and a peak of traced memory that
    does not grow with users: at most twice the small run's and under 1 MiB, where the former
    row accumulator held 400,000 x 2 float64 (6.4 MB)."""
    mech = OsdpRR(epsilon=0.8, k=1, query="variance", **U)
    _fold_peak(mech, 2_000, 2_000)  # warm-up: first-call caches are not the accumulator's
    small, acc_s, est = _fold_peak(mech, 20_000, 2_000)
    large, acc_l, _ = _fold_peak(mech, 400_000, 2_000)
    assert acc_l.dtype == object and acc_s.shape == acc_l.shape == (4,)
    assert all(type(a) is int for a in acc_l) and not est.accumulates_rows
    assert est.n_reports(acc_l) == 400_000 and acc_l[1] > 0
    # 20 times the users: each integer is about 20 times larger, log2(20) ~ 4.3 more bits (at
    # most 6 with the sample's randomness), never more than the float64 range's 2,098 bits
    # (2^1024 / 2^-1074) plus 64; pickled, at most a byte more per integer plus a wider
    # small-int opcode (2 -> 4 bytes): 4 x 3 bytes, and under 1 KiB either way
    for a, b in zip(acc_s, acc_l):
        assert 0 <= b.bit_length() - a.bit_length() <= 6, (a, b)
        assert b.bit_length() <= 2098 + 64
    size_s, size_l = len(pickle.dumps(acc_s)), len(pickle.dumps(acc_l))
    assert 0 <= size_l - size_s <= 12 and size_l < 1024, (size_s, size_l)
    assert large <= 2 * small and large < 1 << 20, (small, large)


def test_no_rows_cap_applies(tmp_path, monkeypatch, capsys):
    """The rows cap (LDP_BEAM_MAX_USER_CELLS) bounded the former row accumulator; the one-pass
    release holds no rows: 2,000 users under a cap of 100 cells are released."""
    from ldp_beam import progress
    from ldp_beam.pipelines.cli import main

    g = np.random.default_rng(5)
    path = str(tmp_path / "in.parquet")
    pq.write_table(pa.table({"x": g.uniform(0, 100, 2000), "lv": g.uniform(0, 1, 2000)}), path)
    monkeypatch.setenv("LDP_BEAM_MAX_USER_CELLS", "100")
    before = progress.configure()
    try:
        code = main(["estimate", "-i", path, "-m", "osdp-rr", "-p", "epsilon=0.8", "-p", "k=1",
                     "-p", "lower=0", "-p", "upper=100", "--role", "value1=x", "--role",
                     "level1=lv", "-o", str(tmp_path / "r.json"), "--quiet",
                     "--ledger", str(tmp_path / "ledger")])
    finally:
        progress.restore(before)
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "r.json").exists()


# --------------------------------------------------------------------------- pipelines
def _table(path, n, g):
    sampling_table(path, n, g, share=0.4, low=0.01)


def _pipeline(path, mech, seed, batch_rows, tmp):
    return release_pipeline(path, mech, OsdpRREstimator(mech), seed, batch_rows, tmp,
                            lambda acc: [str(a) for a in acc])


def test_seeded_release_is_bit_identical_across_batch_sizes_and_runners(tmp_path):
    """The same seed gives the same accumulator and release whatever the reader's batch size,
    and the same release on the DirectRunner and the multi-process DirectRunner through
    ``estimate`` (every record's uniform is addressed by its file and offset); another seed
    gives another sample; counts reconcile (rows read = released from + dead-lettered)."""
    g = np.random.default_rng(6)
    path = tmp_path / "t.parquet"
    _table(path, 12_000, g)
    mech = OsdpRR(epsilon=0.8, k=1, query="sum", **U)
    ref = _pipeline(path, mech, 11, 4096, tmp_path)
    assert int(ref[0][0]) == 12_000 - 4  # users: the four invalid rows are dead-lettered
    for rows in (97, 1000, 50_000):
        assert _pipeline(path, mech, 11, rows, tmp_path) == ref, rows
    other = _pipeline(path, mech, 12, 4096, tmp_path)
    assert other[0][0] == ref[0][0] and other[0][1:] != ref[0][1:]  # another sample
    outs = release_on_two_runners(path, mech, tmp_path, MULTI, 12_000, 4)
    assert outs["direct"]["estimate"]["statistics"] == ref[1]["statistics"]
    assert outs["direct"]["seeded"] is True
    assert "not private" in outs["direct"]["guarantee"]["summary"]


def test_unseeded_runs_sample_differently(tmp_path):
    """Without a seed each run draws a fresh secret run key: two runs release different
    samples (2,000 records kept with q ~ 0.55: equal counts and sums by chance with
    probability far below 1e-6)."""
    from ldp_beam.pipelines.estimate import run_estimate

    g = np.random.default_rng(7)
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": g.uniform(0, 100, 2000), "lv": np.zeros(2000)}), path)
    mech = OsdpRR(epsilon=0.8, k=1, query="sum", **U)
    assert not RunKey.new().seeded
    outs = [run_estimate(str(path), str(tmp_path / f"f{i}.json"), mech,
                         columns={"value1": "x", "level1": "lv"},
                         ledger=str(tmp_path / f"f{i}.db")) for i in range(2)]
    assert outs[0]["seeded"] is False
    assert outs[0]["estimate"]["statistics"] != outs[1]["estimate"]["statistics"]
    a, b = (o["estimate"]["statistics"]["sum_raw"]["value"] for o in outs)
    assert a != b
