"""Synchronizers: BSP, SSP and partitioned rounds on top of the engine, merging with delivery masks."""
from p2plearn.sync.base import RoundStats, Synchronizer
from p2plearn.sync.bsp import BSP
from p2plearn.sync.codec import MessageCodec
from p2plearn.sync.merge import Contribution, merge_parameter
from p2plearn.sync.partitioned import Partitioned
from p2plearn.sync.ssp import SSP

SYNCHRONIZERS = {"bsp": BSP, "ssp": SSP, "partitioned": Partitioned}

__all__ = ["BSP", "SSP", "Partitioned", "SYNCHRONIZERS", "Contribution", "MessageCodec", "RoundStats", "Synchronizer",
           "merge_parameter"]
