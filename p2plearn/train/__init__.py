"""The torch integration: the decentralized optimizer and built-in data sets."""
from p2plearn.train import data
from p2plearn.train.optimizer import DecentralizedOptimizer, JobEnded, TrainingStats, describe_layers

__all__ = ["DecentralizedOptimizer", "JobEnded", "TrainingStats", "data", "describe_layers"]
