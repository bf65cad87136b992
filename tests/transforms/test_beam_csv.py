"""Beam's own ReadFromCsv works in our environment (pandas within Beam's supported range) and its
schema'd rows (``BeamSchema_...`` NamedTuples, the issue's failing element type) are perturbed,
not dead-lettered as an unsupported type."""
import apache_beam as beam
import pandas as pd
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from ldp_beam import build_mechanism
from ldp_beam.transforms import Perturb


def test_pandas_is_within_beams_supported_range():
    """Beam's dataframe extra bounds pandas; pyproject depends on it, so pip honours that bound."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement
    from packaging.version import Version

    bounds = [Requirement(r.split(";")[0]) for r in requires("apache-beam")
              if r.startswith("pandas") and 'extra == "dataframe"' in r]
    assert bounds, "apache-beam declares no pandas bound for its dataframe extra"
    assert all(Version(pd.__version__) in b.specifier for b in bounds), (pd.__version__, bounds)


def test_read_from_csv_rows_are_perturbed(tmp_path):
    path = tmp_path / "people.csv"
    ages = [10.0, 150.0, 55.0, 99.0, 0.0]  # 150 is outside [0, 100]: one dead letter
    path.write_text("id,age\n" + "".join(f"{i},{a}\n" for i, a in enumerate(ages)))
    mech = build_mechanism("bisample", epsilon=1.0, lower=0, upper=100)
    p = TestPipeline()
    rows = p | beam.io.ReadFromCsv(str(path))
    out = rows | Perturb(mech, columns={"value": "age"}, key_column="id")
    n = out.reports | beam.Map(lambda e: getattr(e, "num_rows", 1)) | beam.CombineGlobally(sum)
    assert_that(n, equal_to([len(ages) - 1]), label="reports")
    dead = out.dead_letter | beam.Map(lambda d: (d["record"]["id"], "outside [0, 100]" in d["reason"]))
    assert_that(dead, equal_to([(1, True)]), label="dead")
    p.run().wait_until_finish()
