"""The central-DP aggregations against PipelineDP (``ldp-beam bench``'s ``central`` section).

On the same generated rows (N rows; privacy units of L0 x Linf rows each, spread over exactly L0
keys with Linf rows in each, so that both systems' contribution bounding keeps every row and the
truth is the plain per-key statistic; a key column of K public keys; values in [0, 100]), each
aggregation runs twice on the DirectRunner in this process (the same Prism-free runner object,
:func:`~.common.local_runner`):

* **ours**: ``ldp-beam estimate -m central-... --by key --privacy-unit user --keys ...`` through
  :func:`~.estimate.run_estimate` (its whole run: reading the Parquet file, bounding, validation,
  per-key release, ledger, outputs and manifest), a fresh ledger per run;
* **PipelineDP** (``pipeline-dp``, Beam backend): ``beam.io.ReadFromParquet`` of the same file,
  ``DPEngine.aggregate`` with COUNT, PRIVACY_ID_COUNT, SUM, MEAN, VARIANCE or PERCENTILE(25, 50,
  75) (one quantile tree for the three, as ours), the same epsilon (NaiveBudgetAccountant, delta
  0), Laplace noise, the same bounds and the same public keys, written with ``WriteToText``.

Both use public keys (no partition selection: its cost and threshold differ between the two and
would blur the accuracy comparison) and the same budget. Each system first runs a small warm-up
pipeline (imports and Beam's first-pipeline costs are not measured). Reported per aggregation:
wall seconds of each (the fastest of ``repeats``), ``ratio`` = ours / theirs (< 1: ours faster),
and the mean absolute error against the truth over the keys (and the three quantiles) of what
each publishes (ours: the ``clipped`` post-processed value where there is one, else the raw
value), from one release per key: with K = 20 keys a mean absolute error is itself uncertain by
about +-25%, so only large accuracy differences are findings (ours also reports the mean
standard error it states, ``mean_stated_stderr``). Differences to keep in mind: PipelineDP
clamps out-of-domain values (there are none here) and adds PyDP's Laplace noise to doubles; ours
dead-letters them and draws exact discrete Laplace noise on integers (counts and 2^-40-grid
sums).
"""
from __future__ import annotations

import json
import operator
import os
import shutil
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version as package_version
from typing import Any, Callable

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions

from ldp_beam.registry import build_mechanism

from .common import local_runner
from .estimate import run_estimate
from .records import SectionFailed, make_record

#: our registry name -> (statistic published, PipelineDP metric names, truth over a key's rows)
AGGREGATIONS: dict[str, tuple[str, tuple[str, ...], Callable[[dict], Any]]] = {
    "central-count": ("count", ("COUNT",), lambda g: g["values"].size),
    "privacy-id-count": ("privacy_id_count", ("PRIVACY_ID_COUNT",),
                         lambda g: np.unique(g["units"]).size),
    "central-sum": ("sum", ("SUM",), lambda g: float(g["values"].sum())),
    "central-mean": ("mean", ("MEAN",), lambda g: float(g["values"].mean())),
    "central-variance": ("variance", ("VARIANCE",), lambda g: float(g["values"].var())),
    "central-quantiles": ("quantiles", ("PERCENTILE",),
                          lambda g: np.quantile(g["values"], QUANTILES).tolist()),
}
QUANTILES = (0.25, 0.5, 0.75)
LOWER, UPPER = 0.0, 100.0
WARMUP_ROWS = 2_000


def pipeline_dp_version() -> str | None:
    """The installed PipelineDP's version, or None."""
    try:
        # lazy: an optional dependency (the `test` extra), needed only by this section
        import pipeline_dp
    except ImportError:
        return None
    try:
        return package_version("pipeline-dp")
    except PackageNotFoundError:  # imported from a source tree
        return getattr(pipeline_dp, "__version__", "unknown")


def make_rows(rows: int, keys: int, l0: int, linf: int, seed: int) -> dict[str, np.ndarray]:
    """``rows`` rows of units with exactly ``l0`` keys x ``linf`` rows each (the last unit may
    have fewer), keys ``k0 .. k{keys-1}``, values Beta(2, 5) x 100 (skewed, in [0, 100])."""
    if keys < l0:
        raise ValueError(f"keys = {keys}: at least L0 = {l0} keys are needed")
    rng = np.random.default_rng(seed)
    per_unit = l0 * linf
    units = -(-rows // per_unit)
    # l0 distinct keys per unit: a random permutation's first l0 entries
    unit_keys = np.argsort(rng.random((units, keys)), axis=1)[:, :l0]
    key_code = np.repeat(unit_keys, linf, axis=1).reshape(-1)[:rows]
    uid = np.repeat(np.arange(units), per_unit)[:rows]
    perm = rng.permutation(rows)  # rows of a unit are not adjacent
    return {"user": np.char.add("u", uid[perm].astype(str)).astype(object),
            "key": np.char.add("k", key_code[perm].astype(str)).astype(object),
            "value": rng.beta(2.0, 5.0, rows) * (UPPER - LOWER) + LOWER}


def truth(data: dict[str, np.ndarray], name: str) -> dict[str, Any]:
    fn = AGGREGATIONS[name][2]
    out = {}
    for k in np.unique(data["key"]):
        mask = data["key"] == k
        out[str(k)] = fn({"values": data["value"][mask], "units": data["user"][mask]})
    return out


def _write(data: dict[str, np.ndarray], path: str) -> None:
    pq.write_table(pa.table({"user": data["user"].astype(str), "key": data["key"].astype(str),
                             "value": data["value"]}), path, row_group_size=250_000)


def _params(name: str, epsilon: float, l0: int, linf: int) -> dict:
    p: dict[str, Any] = {"epsilon": epsilon, "max_partitions_per_unit": l0,
                         "max_rows_per_partition": 1 if name == "privacy-id-count" else linf}
    if name not in ("central-count", "privacy-id-count"):
        p.update(lower=LOWER, upper=UPPER)
    if name == "central-quantiles":
        p["quantiles"] = QUANTILES
    return p


def run_ours(name: str, path: str, keys: list[str], epsilon: float, l0: int, linf: int,
             tmp: str, tag: str) -> tuple[float, dict[str, Any]]:
    """(seconds, published value per key) of ``ldp-beam estimate -m NAME --by key``."""
    mech = build_mechanism(name, **_params(name, epsilon, l0, linf))
    out = os.path.join(tmp, f"ours-{name}-{tag}.json")
    t = time.perf_counter()
    res = run_estimate(path, out, mech, by="key", columns={"value": "value"},
                       beam_args=["--runner=DirectRunner"], unit="user", keys=keys,
                       ledger=f"sqlite:///{os.path.join(tmp, f'ledger-{name}-{tag}.db')}")
    secs = time.perf_counter() - t
    stat = AGGREGATIONS[name][0]
    values, ses = {}, []
    for key, est in res["estimates"].items():
        s = est["statistics"][stat]
        values[key] = s["clipped"] if s.get("clipped") is not None else s["value"]
        ses.append(np.mean(s["stderr"]))
    STATED_SE[name] = float(np.mean(ses)) if ses else None
    return secs, values


#: the mean stated standard error of our last release of each aggregation (for the records)
STATED_SE: dict[str, float | None] = {}


def _pdp_row(kv: Any) -> str:
    key, metrics = kv
    return json.dumps({"key": key, **metrics._asdict()})


def run_pipeline_dp(name: str, path: str, keys: list[str], epsilon: float, l0: int, linf: int,
                    tmp: str, tag: str) -> tuple[float, dict[str, Any]]:
    """(seconds, published value per key) of PipelineDP's Beam backend on the same file."""
    # lazy: an optional dependency (the `test` extra), needed only by this section
    import pipeline_dp

    M = pipeline_dp.Metrics
    metrics = {"COUNT": [M.COUNT], "PRIVACY_ID_COUNT": [M.PRIVACY_ID_COUNT], "SUM": [M.SUM],
               "MEAN": [M.MEAN], "VARIANCE": [M.VARIANCE],
               "PERCENTILE": [M.PERCENTILE(100 * q) for q in QUANTILES]}
    (metric,) = AGGREGATIONS[name][1]
    prefix = os.path.join(tmp, f"pdp-{name}-{tag}")
    args = ["--runner=DirectRunner"]
    t = time.perf_counter()
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=0.0)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.BeamBackend())
    params = pipeline_dp.AggregateParams(
        metrics=metrics[metric], noise_kind=pipeline_dp.NoiseKind.LAPLACE,
        max_partitions_contributed=l0,
        max_contributions_per_partition=1 if metric == "PRIVACY_ID_COUNT" else linf,
        min_value=LOWER, max_value=UPPER)
    extractors = pipeline_dp.DataExtractors(privacy_id_extractor=operator.itemgetter("user"),
                                            partition_extractor=operator.itemgetter("key"),
                                            value_extractor=operator.itemgetter("value"))
    p = beam.Pipeline(runner=local_runner(args), options=PipelineOptions(args))
    rows = p | "Read" >> beam.io.ReadFromParquet(path)
    res = engine.aggregate(rows, params, extractors, public_partitions=keys)
    accountant.compute_budgets()
    _ = (res | "ToJson" >> beam.Map(_pdp_row)
         | "Write" >> beam.io.WriteToText(prefix, file_name_suffix=".jsonl"))
    p.run().wait_until_finish()
    secs = time.perf_counter() - t
    values = {}
    for f in sorted(os.listdir(tmp)):
        if f.startswith(os.path.basename(prefix)) and f.endswith(".jsonl"):
            with open(os.path.join(tmp, f)) as fh:
                for line in fh:
                    r = json.loads(line)
                    key = r.pop("key")
                    values[key] = ([r[k] for k in sorted(r, key=lambda s: float(s.split("_")[1]))]
                                   if metric == "PERCENTILE" else r[metric.lower()])
    return secs, values


def mean_abs_error(values: dict[str, Any], true: dict[str, Any]) -> float | None:
    """Mean absolute error over the keys (and the quantiles of a key) released by both."""
    errs = [np.abs(np.asarray(values[k], dtype=float) - np.asarray(true[k], dtype=float))
            for k in true if k in values]
    return float(np.mean(np.concatenate([np.ravel(e) for e in errs]))) if errs else None


def central_section(rows: int, *, names: tuple[str, ...] | None = None, epsilon: float = 1.0,
                    keys: int = 20, l0: int = 2, linf: int = 3, repeats: int = 1,
                    seed: int | None = None, tmp: str | None = None, progress: Any = None,
                    stamp: dict | None = None, warmup: bool = True) -> dict:
    """The section's results, JSON-ready: ``records`` (bench records, one per system and
    aggregation, and one comparison record per aggregation), ``comparison`` (per aggregation:
    seconds of both, ``ratio`` = ours / theirs, mean absolute errors of both) and the ``setup``.

    ``names``: the aggregations (default all six); ``keys`` public keys; ``l0``/``linf`` the
    contribution bounds of both systems; ``repeats``: runs of each (the fastest kept);
    ``warmup``: first run both systems once on a small file (unmeasured). Raises
    :class:`~.records.SectionFailed` (with the records measured so far) when PipelineDP is not
    installed (``pip install pipeline-dp``, in the ``test`` extra) or a run fails."""
    version = pipeline_dp_version()
    if version is None:
        raise SectionFailed("PipelineDP is not installed: the central section compares the "
                            "central aggregations with it (pip install 'pipeline-dp>=0.3', in "
                            "ldp-beam's `test` extra); nothing was measured", [])
    names = tuple(names or AGGREGATIONS)
    unknown = [n for n in names if n not in AGGREGATIONS]
    if unknown:
        raise ValueError(f"unknown aggregations {unknown}; known: {list(AGGREGATIONS)}")
    seed = int(np.random.SeedSequence().entropy % 2**32) if seed is None else int(seed)
    stamp = dict(stamp or {})

    note = progress.note if progress is not None else (lambda text: None)

    records: list[dict] = []
    comparison: dict[str, dict] = {}
    own_tmp = tmp is None
    tmp_dir = tempfile.mkdtemp(prefix="ldp-beam-bench-central-") if own_tmp else tmp
    try:
        data = make_rows(rows, keys, l0, linf, seed)
        path = os.path.join(tmp_dir, f"central-{rows}.parquet")
        _write(data, path)
        key_list = [f"k{i}" for i in range(keys)]
        if warmup:
            warm = os.path.join(tmp_dir, "central-warmup.parquet")
            _write(make_rows(WARMUP_ROWS, keys, l0, linf, seed + 1), warm)
            note("central: warm-up pipelines (ldp-beam, PipelineDP)")
            run_ours("central-count", warm, key_list, epsilon, l0, linf, tmp_dir, "warmup")
            run_pipeline_dp("central-count", warm, key_list, epsilon, l0, linf, tmp_dir,
                            "warmup")
        for name in names:
            true = truth(data, name)
            best: dict[str, tuple[float, dict]] = {}
            for r in range(repeats):
                for system, fn in (("ldp-beam", run_ours), ("pipeline-dp", run_pipeline_dp)):
                    note(f"central: {name} on {system} ({rows:,} rows, round {r + 1})")
                    try:
                        secs, values = fn(name, path, key_list, epsilon, l0, linf, tmp_dir,
                                          f"{r}")
                    except Exception as exc:  # noqa: BLE001 - reported with the records so far
                        raise SectionFailed(f"{name} on {system}: {type(exc).__name__}: "
                                            f"{str(exc)[-1500:]}", records) from exc
                    if system not in best or secs < best[system][0]:
                        best[system] = (secs, values)
            entry: dict[str, Any] = {}
            for system, (secs, values) in best.items():
                mae = mean_abs_error(values, true)
                entry[system] = {"seconds": secs, "mean_abs_error": mae,
                                 "keys_released": len(values)}
                if system == "ldp-beam":  # Laplace noise: MAE = SD / sqrt(2)
                    entry[system]["mean_stated_stderr"] = STATED_SE.get(name)
                records.append(make_record(
                    "bench", "synthetic", f"{system}:{name}", epsilon, "seconds", secs,
                    stage="central", path="central", system=system, aggregation=name,
                    rows=rows, seconds=secs, rows_per_second=rows / secs if secs > 0 else None,
                    mean_abs_error=mae, keys=keys, max_partitions_per_unit=l0,
                    max_rows_per_partition=linf, repeats=repeats, seed=seed,
                    pipeline_dp_version=version, **stamp))
            ours, theirs = entry["ldp-beam"], entry["pipeline-dp"]
            entry["ratio"] = ours["seconds"] / theirs["seconds"]
            entry["mae_ratio"] = (ours["mean_abs_error"] / theirs["mean_abs_error"]
                                  if ours["mean_abs_error"] and theirs["mean_abs_error"]
                                  else None)
            comparison[name] = entry
            records.append(make_record(
                "bench", "synthetic", name, epsilon, "seconds ratio ours/PipelineDP",
                entry["ratio"], stage="central", path="central", aggregation=name, rows=rows,
                seconds=ours["seconds"], pipeline_dp_seconds=theirs["seconds"],
                mean_abs_error=ours["mean_abs_error"],
                pipeline_dp_mean_abs_error=theirs["mean_abs_error"],
                mae_ratio=entry["mae_ratio"], keys=keys, seed=seed,
                pipeline_dp_version=version,
                note="ratio = ldp-beam seconds / PipelineDP seconds (< 1: ldp-beam faster); "
                     "mean_abs_error over the keys against the unbounded truth (the bounding "
                     "keeps every row here)", **stamp))
    finally:
        if own_tmp:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    return {"section": "central", "rows": rows, "records": records, "comparison": comparison,
            "setup": {"epsilon": epsilon, "delta": 0.0, "keys": keys, "partitions": "public",
                      "max_partitions_per_unit": l0, "max_rows_per_partition": linf,
                      "rows_per_unit": l0 * linf, "units": -(-rows // (l0 * linf)),
                      "values": "Beta(2, 5) x 100 in [0, 100]", "quantiles": list(QUANTILES),
                      "runner": "DirectRunner (in this process)", "repeats": repeats,
                      "seed": seed, "pipeline_dp_version": version,
                      "noise": {"ldp-beam": "exact discrete Laplace on integers",
                                "pipeline-dp": "Laplace from PyDP, added to doubles"}}}


__all__ = ["central_section", "AGGREGATIONS", "make_rows", "run_ours", "run_pipeline_dp",
           "mean_abs_error", "pipeline_dp_version"]
