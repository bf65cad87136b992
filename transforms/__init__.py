"""The Beam layer (installed as ``ldp_beam.transforms``): thin, generic, family-agnostic.

* :class:`Perturb` — any mechanism over elements or column batches, with a dead-letter output.
* :class:`EstimateGlobally` / :class:`EstimatePerKey` — any estimator as a CombineFn.
* :class:`ValidateReports` — dead-letters malformed reports before estimation.
* :class:`ReadTable`, :class:`WriteParquetFile`, :class:`WriteJsonLines` — table IO via pyarrow:
  files (local, ``s3://``, any Beam FileSystems URL) and DuckDB, PostgreSQL and Iceberg tables
  (:mod:`.sources`).
* :func:`tidy_rows` / :func:`write_tidy` / :class:`WriteTidy` — estimates as tidy tables written to
  Parquet, CSV, DuckDB or PostgreSQL (:mod:`.sinks`).
* :class:`SpoolSource` / :class:`ReadSpoolOnce` — telemetry from a spool directory of JSON-lines
  files (live, with durable claims, or once), for ``ldp-beam stream``.
* :class:`BoundContributions` — each privacy unit's rows bounded (reports per unit for LDP,
  partitions and rows per partition for a central release) before a mechanism sees them.
"""
from ldp_beam.bounding import UnitLimitError  # the bounding's error (pure), exported here too

from .batches import KeyedBatch, mechanism_metadata, report_schema
from .combine import (Accumulate, EstimateGlobally, EstimatePerKey, EstimatorCombineFn,
                      SplitByKey, ValidateReports)
from .io import EmptySourceError, SourceError, input_schema, match_files
from .write import WriteJsonLines, WriteParquetFile
from .read import ReadTable
from .rows import EstimatesAsRows
from .sinks import TIDY_SCHEMA, WriteTidy, tidy_output, tidy_rows, tidy_table, write_tidy
from .sinks import TidySchemaError, tidy_output_table, tidy_schema
from .perturb import DEAD_LETTER, Perturb, PerturbFn
from .spool import ReadSpoolOnce, SpoolDirectory, SpoolSource
from .units import BoundContributions, BoundedRows

__all__ = ["EstimatesAsRows", "KeyedBatch", "mechanism_metadata", "report_schema", "Accumulate", "EstimateGlobally",
           "EstimatePerKey", "EstimatorCombineFn", "SplitByKey", "ValidateReports", "ReadTable",
           "WriteJsonLines", "WriteParquetFile", "input_schema", "match_files", "DEAD_LETTER",
           "Perturb", "PerturbFn", "ReadSpoolOnce", "SpoolDirectory", "SpoolSource",
           "EmptySourceError", "SourceError", "TIDY_SCHEMA", "WriteTidy", "tidy_output",
           "tidy_rows", "tidy_table", "write_tidy"]
__all__ += ["BoundContributions", "BoundedRows", "UnitLimitError"]
__all__ += ["TidySchemaError", "tidy_output_table", "tidy_schema"]
