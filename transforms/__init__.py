"""The Beam layer (installed as ``ldp_beam.transforms``): thin, generic, family-agnostic.

* :class:`Perturb` — any mechanism over elements or column batches, with a dead-letter output.
* :class:`EstimateGlobally` / :class:`EstimatePerKey` — any estimator as a CombineFn.
* :class:`ValidateReports` — dead-letters malformed reports before estimation.
* :class:`ReadTable`, :class:`WriteParquetFile`, :class:`WriteJsonLines` — table IO via pyarrow.
* :class:`SpoolSource` / :class:`ReadSpoolOnce` — telemetry from a spool directory of JSON-lines
  files (live, with durable claims, or once), for ``ldp-beam stream``.
"""
from .batches import KeyedBatch, mechanism_metadata, report_schema
from .combine import (Accumulate, EstimateGlobally, EstimatePerKey, EstimatorCombineFn,
                      SplitByKey, ValidateReports)
from .io import ReadTable, WriteJsonLines, WriteParquetFile, input_schema, match_files
from .perturb import DEAD_LETTER, Perturb, PerturbFn
from .spool import ReadSpoolOnce, SpoolDirectory, SpoolSource

__all__ = ["KeyedBatch", "mechanism_metadata", "report_schema", "Accumulate", "EstimateGlobally",
           "EstimatePerKey", "EstimatorCombineFn", "SplitByKey", "ValidateReports", "ReadTable",
           "WriteJsonLines", "WriteParquetFile", "input_schema", "match_files", "DEAD_LETTER",
           "Perturb", "PerturbFn", "ReadSpoolOnce", "SpoolDirectory", "SpoolSource"]
