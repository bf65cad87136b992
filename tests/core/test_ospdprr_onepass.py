"""OSPDPRR's one-pass release (sound-self, issue 16): each row's Bernoulli(pi_u) sampling drawn
where the row is read, from a uniform addressed by the row's identity; the estimator keeps four
integers [users, N, S, Q] (the sample's exact lattice sums); one discrete Laplace draw at
release.

Checked here: the sums equal the in-memory release's when everyone is sampled, and equal the
lattice sums of the sampled rows otherwise; sampling frequencies match pi_u within binomial
standard errors; seeded releases are bit-identical across batch sizes and runners; unseeded
sampling is secret (a fresh run key per run); the accumulator's memory does not grow with users
(and the row accumulator's does, so the test can tell them apart); counts reconcile."""
from __future__ import annotations

import math
import pickle
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam.central.histogram import release_source
from ldp_beam.central.ospdprr import (OSPDPRR, OSPDPRREstimator, QUERIES, statistic_lattice,
                                      statistic_units)
from ldp_beam.rng import RandomSource, RunKey
from ldp_beam_test_helpers import (emitted_rows, release_on_two_runners, release_pipeline,
                                   sampling_table)

Z = 4.5  # standard errors allowed for a binomial count (two-sided p ~ 7e-6 per check)
U = dict(lower=0.0, upper=100.0)
MULTI = ["--runner=DirectRunner", "--direct_num_workers=2",
         "--direct_running_mode=multi_processing"]


def _data(n, k, g, sensitive=0.6):
    data = {f"value{i}": g.uniform(0, 100, n) for i in range(1, k + 1)}
    for i in range(1, k + 1):
        data[f"level{i}"] = np.where(g.random(n) < sensitive, g.uniform(0.0, 1.0, n), 0.0)
        data[f"importance{i}"] = g.uniform(0.05, 1.0, n)
    return data


def _rows(mech, data):
    cols, reasons = mech.check(data)
    assert not reasons.bad.any()
    vals = np.column_stack([cols[f"value{i}"] for i in mech.target])
    w = np.column_stack([cols[f"weight{i}"] for i in range(1, mech.k + 1)])
    return vals, w


@pytest.mark.parametrize("query", QUERIES)
def test_everyone_sampled_gives_the_in_memory_release_sums_exactly(query):
    """Every weight 0 -> M_u = 1 >= t -> pi_u = 1: the one-pass accumulator's N, S, Q are the
    in-memory release's lattice sums of all users, bit for bit, and the release has the same
    statistics, budget and noise scales."""
    g = np.random.default_rng(1)
    mech = OSPDPRR(t=0.7, k=3, target=(1, 3), query=query, lower=1.0, upper=100.0)
    n = 2000
    data = {f"value{i}": g.uniform(1, 100, n) for i in (1, 3)}
    data.update({f"level{i}": np.zeros(n) for i in (1, 2, 3)})
    rep = mech.records(data, rng=5)
    assert rep["sampled"].dtype == np.uint8 and rep["sampled"].all()
    est = OSPDPRREstimator(mech, seed=3)
    acc = est.add(est.create(), rep)
    vals, w = _rows(mech, data)
    ref = mech.release(vals, w, RandomSource(9))
    assert ref.curator["pi"].min() == 1.0
    assert acc.dtype == np.int64 and acc[0] == n
    np.testing.assert_array_equal(acc[1:], ref.curator["units"])
    lattice = statistic_lattice(query, 2, 1.0, 100.0)
    np.testing.assert_array_equal(acc[1:], statistic_units(vals, lattice).sum(axis=0))
    one = mech.release_sums(n, acc[1:], RandomSource(9))
    assert set(one.statistics) == set(ref.statistics)
    assert one.curator["scales"] == ref.curator["scales"]
    assert one.curator["epsilon"] == ref.curator["epsilon"] == 0.7
    assert est.finalize(acc).statistics == mech.release_sums(
        n, acc[1:], release_source(3, acc)).statistics


def test_sums_are_the_sampled_rows_lattice_sums_in_any_split():
    """With sampling: N, S, Q are the exact lattice sums of the rows whose report says
    sampled; batches of any size, merged in any order, give the same four integers."""
    g = np.random.default_rng(2)
    mech = OSPDPRR(t=0.6, k=2, query="variance", **U)
    data = _data(5000, 2, g)
    rep = emitted_rows(mech, data, rng=RandomSource(7), stream=3, offset=0)
    keep = rep["sampled"] == 1
    assert 0 < keep.sum() < keep.size
    vals, _ = _rows(mech, data)
    lattice = statistic_lattice("variance", 2, 0.0, 100.0)
    est = OSPDPRREstimator(mech)
    whole = est.add(est.create(), rep)
    assert whole[0] == 5000
    np.testing.assert_array_equal(whole[1:], statistic_units(vals[keep], lattice).sum(axis=0))
    for size in (1, 7, 333, 4999):
        parts = [est.add(est.create(), {k: v[s:s + size] for k, v in rep.items()})
                 for s in range(0, 5000, size)]
        g.shuffle(parts)
        np.testing.assert_array_equal(est.merge(parts), whole)
        # the records' draws do not depend on how they are batched (per-record addressing)
        again = [emitted_rows(mech, {k: v[s:s + size] for k, v in data.items()},
                              rng=RandomSource(7), stream=3, offset=s)["sampled"]
                 for s in range(0, 5000, size)]
        np.testing.assert_array_equal(np.concatenate(again), rep["sampled"])


def test_sampling_frequency_matches_pi():
    """Four weight profiles, 20,000 rows each (pipeline-style addressed draws from a secret
    run key): each profile's sampled fraction is within Z binomial standard errors of its
    pi_u = (e^M_u - 1)/(e^t - 1); the accumulator's N within Z standard errors of k_T sum pi."""
    t, n = 0.8, 20_000
    mech = OSPDPRR(t=t, k=2, query="count", **U)
    profiles = [(0.0, 0.0), (0.3, 0.0), (0.6, 0.9), (1.0, 1.0)]
    src = RunKey.new().source()
    est = OSPDPRREstimator(mech)
    acc = est.create()
    total_pi, total_var = 0.0, 0.0
    for j, (l1, l2) in enumerate(profiles):
        data = {"value1": np.full(n, 50.0), "value2": np.full(n, 50.0),
                "level1": np.full(n, l1), "level2": np.full(n, l2)}
        _, w = _rows(mech, data)
        _, _, pi = mech.sampling(w[:1])
        p = float(pi[0])
        rep = emitted_rows(mech, data, rng=src, stream=j, offset=0)
        acc = est.add(acc, rep)
        hits = int(rep["sampled"].sum())
        se = math.sqrt(n * p * (1 - p))
        if p in (0.0, 1.0):
            assert hits == round(n * p), (l1, l2, p)
        else:
            assert abs(hits - n * p) <= Z * se, (l1, l2, p, hits)
        total_pi += n * p
        total_var += n * p * (1 - p)
    assert 0.0 < float(mech.sampling(np.array([[0.6, 0.9]]))[2][0]) < 1.0  # a real test
    assert abs(acc[1] - 2 * total_pi) <= Z * 2 * math.sqrt(total_var)


def test_unseeded_sampling_is_secret_and_a_seeded_run_says_it_is_not_private(tmp_path):
    """Unseeded: the sampling uniforms come from a fresh run key (OS entropy), so two runs
    sample differently (2,000 users with pi ~ 0.5: equal with probability ~2^-2000); a seed
    reproduces the run and the release says it is not private."""
    mech = OSPDPRR(t=0.8, k=1, query="sum", **U)
    lvl = 0.5
    data = {"value1": np.full(2000, 10.0), "level1": np.full(2000, lvl)}
    pi = float(mech.sampling(np.array([[lvl]]))[2][0])
    assert 0.3 < pi < 0.7
    a = emitted_rows(mech, data, rng=RunKey.new().source(), stream=0, offset=0)["sampled"]
    b = emitted_rows(mech, data, rng=RunKey.new().source(), stream=0, offset=0)["sampled"]
    assert not np.array_equal(a, b)
    assert not RunKey.new().seeded  # the pipeline's default: no seed anywhere
    from ldp_beam.pipelines.estimate import run_estimate

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": data["value1"], "lv": data["level1"]}), path)
    cols = {"value1": "x", "level1": "lv"}
    free = [run_estimate(str(path), str(tmp_path / f"f{i}.json"), mech, columns=cols,
                         ledger=str(tmp_path / f"f{i}.db"))["estimate"] for i in range(2)]
    assert free[0]["statistics"] != free[1]["statistics"]
    out = run_estimate(str(path), str(tmp_path / "s.json"), mech, columns=cols, seed=4,
                       ledger=str(tmp_path / "s.db"))
    assert out["seeded"] is True and out["guarantee"]["seeded"] is True
    assert "not private" in out["guarantee"]["summary"]


def _table(path, n, g):
    sampling_table(path, n, g, share=0.6, low=0.0)


def _pipeline(path, mech, est, seed, batch_rows, tmp):
    return release_pipeline(path, mech, est, seed, batch_rows, tmp, lambda acc: acc.tolist())


def test_seeded_release_is_bit_identical_across_batch_sizes_and_runners(tmp_path):
    """The same seed gives the same accumulator and release whatever the reader's batch size,
    and the same release on the DirectRunner and the multi-process DirectRunner through
    ``estimate`` (every row's sampling uniform is addressed by its file and offset); another
    seed gives another sample."""
    g = np.random.default_rng(3)
    path = tmp_path / "t.parquet"
    _table(path, 12_000, g)
    mech = OSPDPRR(t=0.8, k=1, query="mean", **U)
    est = OSPDPRREstimator(mech, seed=11)
    ref = _pipeline(path, mech, est, 11, 4096, tmp_path)
    assert ref[0][0] == 12_000 - 4  # users: the four invalid rows are dead-lettered
    for rows in (97, 1000, 50_000):
        assert _pipeline(path, mech, est, 11, rows, tmp_path) == ref, rows
    assert _pipeline(path, mech, est, 12, 4096, tmp_path)[0] != ref[0]  # another seed, another sample
    # the same release on both runners; counts reconcile: rows read = released + dead-lettered
    release_on_two_runners(path, mech, tmp_path, MULTI, 12_000, 4)


def _fold_peak(mech, n, batch):
    """Peak traced memory of folding n rows, ``batch`` rows at a time, into one accumulator
    (the reports of each batch made and dropped inside the loop), and the accumulator."""
    est = OSPDPRREstimator(mech, seed=1)
    g = np.random.default_rng(4)
    v = g.uniform(0, 100, batch)
    lv = np.where(g.random(batch) < 0.5, g.uniform(0, 1, batch), 0.0)
    src = RandomSource(2)
    tracemalloc.start()
    try:
        acc = est.create()
        for s in range(0, n, batch):
            acc = est.add(acc, emitted_rows(mech, {"value1": v, "level1": lv}, rng=src,
                                            stream=0, offset=s))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, acc, est


def test_the_accumulator_does_not_grow_with_users():
    """sound-self: 20,000 vs 400,000 users folded in batches of 2,000: the same four int64
    numbers (32 bytes, the same pickle size) and a peak of traced memory that does not grow
    with users: at most twice the small run's (the batch's temporaries, ~100 KB, plus the
    interpreter's own allocations, which vary by tens of KB from run to run) and under 1 MiB,
    where 400,000 rows of the row accumulator need 6.4 MB; the row accumulator of
    sound-public grows over the same runs, so the test tells them apart."""
    self_ = OSPDPRR(t=0.8, k=1, query="sum", **U)
    _fold_peak(self_, 2_000, 2_000)  # warm-up: first-call caches are not the accumulator's
    small, acc_s, est = _fold_peak(self_, 20_000, 2_000)
    large, acc_l, _ = _fold_peak(self_, 400_000, 2_000)
    assert acc_s.shape == acc_l.shape == (4,) and acc_s.nbytes == acc_l.nbytes == 32
    assert len(pickle.dumps(acc_s)) == len(pickle.dumps(acc_l))
    assert est.n_reports(acc_l) == 400_000 and not est.accumulates_rows
    assert large <= 2 * small and large < 1 << 20, (small, large)
    public = OSPDPRR(t=0.8, k=1, query="sum", mode="sound-public", **U)
    rows_small, _, _ = _fold_peak(public, 20_000, 2_000)
    rows_large, acc, est = _fold_peak(public, 400_000, 2_000)
    assert est.accumulates_rows and acc.shape == (400_000, 2)
    assert rows_large > 5 * rows_small and rows_large >= 400_000 * 16


def test_user_count_bound_keeps_the_int64_sums_exact():
    """|S|, Q <= k_T 2^20 lattice units per user: past (2^63 - 1) / (k_T 2^20) users the int64
    sums could wrap, so add and merge refuse it (naming the bound) instead."""
    from ldp_beam.errors import ParameterError

    mech = OSPDPRR(t=0.8, k=3, target=(1, 2), query="sum", **U)
    est = OSPDPRREstimator(mech)
    assert est.max_users == ((1 << 63) - 1) // (2 << 20)
    near = np.array([est.max_users, 0, 0, 0], dtype=np.int64)
    with pytest.raises(ParameterError, match="users"):
        est.merge([near, np.array([1, 0, 0, 0], dtype=np.int64)])
    with pytest.raises(ParameterError, match="users"):
        est.add(near, {"value1": np.zeros(1), "value2": np.zeros(1),
                       "sampled": np.ones(1, np.uint8)})
    assert est.n_reports(est.merge([near, est.create()])) == est.max_users


def test_weight_reports_are_refused_by_the_one_pass_estimator():
    """A sound-self estimator fed the data-reference modes' reports (weights, no sampling
    decision) says so rather than releasing an unsampled sum."""
    from ldp_beam.errors import ParameterError

    est = OSPDPRREstimator(OSPDPRR(t=0.8, k=1, **U))
    with pytest.raises(ParameterError, match="sampled"):
        est.add(est.create(), {"value1": np.ones(3), "weight1": np.zeros(3)})
