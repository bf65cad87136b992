"""Pipeline benchmarks for ``ldp-beam bench``: the Beam batch path end to end on Parquet rows.

Each pipeline runs in a fresh child process, which reports its own peak RSS (``peak_rss_mb``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from ldp_beam.evaluation.records import make_record

_CHILD = r"""
import json, sys, time
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from ldp_beam import build_mechanism, estimator_for
from ldp_beam.transforms import ReadTable, Perturb, EstimateGlobally
cfg = json.loads(sys.argv[1])
mech = build_mechanism(cfg["mechanism"], **cfg["params"])
rows, path = cfg["rows"], cfg["path"]
if cfg["mode"] == "batched":
    t = time.perf_counter()
    with beam.Pipeline(options=PipelineOptions(cfg["beam_args"])) as p:
        out = p | ReadTable(path)
        r = out.batches | Perturb(mech, columns={"value": "x"})
        r.reports | EstimateGlobally(estimator_for(mech))
    secs = time.perf_counter() - t
else:
    x = pq.read_table(path)["x"].to_numpy()[:rows]
    t = time.perf_counter()
    with beam.Pipeline(options=PipelineOptions(cfg["beam_args"])) as p:
        r = (p | beam.Create([{"x": float(v)} for v in x])
             | Perturb(mech, columns={"value": "x"}))
        r.reports | EstimateGlobally(estimator_for(mech))
    secs = time.perf_counter() - t
import resource
print(json.dumps({"seconds": secs,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))
"""


def _child(cfg: dict) -> tuple[float, float]:
    """Run one pipeline in a fresh process: (seconds, that process's own peak RSS in MiB)."""
    r = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(cfg)], capture_output=True,
                       text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"benchmark pipeline failed: {r.stderr[-2000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return out["seconds"], out["peak_rss_mb"]  # ru_maxrss is in KiB on Linux


CASES = {  # mechanism -> (params, domain for the synthetic column)
    "bisample": ({"epsilon": 1.0, "lower": 0.0, "upper": 100.0}, (0.0, 100.0)),
}


def run(quick: bool = False, progress=None) -> list[dict]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 1_000_000
    element_rows = 20_000 if quick else 100_000
    out = []
    with tempfile.TemporaryDirectory(prefix="ldp-beam-bench-") as tmp:
        for name, (params, (lo, hi)) in CASES.items():
            path = os.path.join(tmp, f"{name}.parquet")
            pq.write_table(pa.table({"x": np.random.default_rng().uniform(lo, hi, rows)}), path,
                           row_group_size=250_000)
            for mode, n in (("batched", rows), ("element", element_rows)):
                if progress is not None:
                    progress.note(f"pipeline {name} {mode} ({n:,} rows, DirectRunner)")
                cfg = {"mechanism": name, "params": params, "rows": n, "path": path,
                       "mode": mode, "beam_args": ["--runner=DirectRunner"]}
                secs, rss = _child(cfg)
                rec = make_record("bench", "synthetic", name, params.get("epsilon"),
                                  f"pipeline rows/s ({mode})", n / secs, stage="pipeline",
                                  runner="DirectRunner", rows=n, seconds=secs,
                                  rows_per_second=n / secs, peak_rss_mb=rss, mode=mode,
                                  note="includes pipeline start-up; peak RSS of the pipeline's "
                                  "own process")
                if mode == "batched":
                    rec["target"] = 1e6
                    rec["meets_target"] = bool(n / secs >= 1e6)
                out.append(rec)
    return out
