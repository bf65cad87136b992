"""What the Beam layer asks of the runner a pipeline will run on, in one place: whether it
routes tagged outputs (:func:`separates_tagged_outputs`), whether it is the DirectRunner's one
in-memory worker (:func:`one_local_worker`), and the runner options ldp-beam adds to Beam's
(:class:`LdpBeamRunnerOptions`, registered when this module is imported).
"""
from __future__ import annotations

from typing import Any

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

DEFAULT_DASK_WORKERS = 2


class LdpBeamRunnerOptions(PipelineOptions):
    """Runner options ldp-beam adds to Beam's (read by
    :func:`ldp_beam.pipelines.common.runner_context`)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--dask_workers", type=int, default=DEFAULT_DASK_WORKERS,
                            help="worker processes of the local Dask cluster started for a run "
                                 "with --runner dask and no --dask_client_address")


def separates_tagged_outputs(pipeline: Any) -> bool:
    """Whether the pipeline's runner routes tagged outputs to their own PCollections. Beam's
    Dask runner does not (each branch gets every element): there, one output and two filters
    (:func:`~ldp_beam.transforms.perturb.split_dead_letters`) do the same job at the cost of two
    steps per element."""
    runner = getattr(pipeline, "runner", None)
    return runner is not None and not type(runner).__module__.startswith(
        "apache_beam.runners.dask")


def one_local_worker(pipeline: Any) -> bool:
    """Whether ``pipeline`` runs on Beam's DirectRunner with one worker (its default: one
    in-memory worker), where spreading elements over workers has nothing to spread over."""
    runner = getattr(pipeline, "runner", None)
    if runner is None or not type(runner).__module__.startswith("apache_beam.runners.direct"):
        return False
    opts = pipeline.options.view_as(DirectOptions)
    return opts.direct_num_workers == 1 and opts.direct_running_mode == "in_memory"


__all__ = ["DEFAULT_DASK_WORKERS", "LdpBeamRunnerOptions", "one_local_worker",
           "separates_tagged_outputs"]
