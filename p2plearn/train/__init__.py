"""The torch integration: the decentralized optimizer and built-in data sets.

`DecentralizedOptimizer` (optimizer.py) is composed of parts, one file each: the model's layout
(layout.py, on buckets.py), its engine (channel.py), the round core (synchronizer.py) on host
staging (staging.py), overlapped rounds (overlap.py), joiners' state (state_transfer.py), the final
average (final_average.py), statistics (stats.py) and the multicast reach (reach.py).
"""
from p2plearn.train import data
from p2plearn.train.optimizer import DecentralizedOptimizer, JobEnded, TrainingStats, describe_layers

__all__ = ["DecentralizedOptimizer", "JobEnded", "TrainingStats", "data", "describe_layers"]
