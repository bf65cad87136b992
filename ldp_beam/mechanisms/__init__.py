"""Client-side randomizers, one module per family. Never imports the server side."""
from .bisample import BiSample, BiSampleMD
from .categorical import GRR, URR
from .joint import CPRR, JDGRR, TDRR, JuRR
from .mean_baselines import Harmony, PiecewiseMechanism, PrivKVM

__all__ = ["BiSample", "BiSampleMD", "Harmony", "PiecewiseMechanism", "PrivKVM", "GRR", "URR",
           "CPRR", "JDGRR", "JuRR", "TDRR"]
