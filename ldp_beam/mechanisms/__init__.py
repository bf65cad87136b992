"""Client-side randomizers, one module per family. Never imports the server side."""
from .bisample import BiSample, BiSampleMD
from .mean_baselines import Harmony, PiecewiseMechanism, PrivKVM

__all__ = ["BiSample", "BiSampleMD", "Harmony", "PiecewiseMechanism", "PrivKVM"]
