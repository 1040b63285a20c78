"""The torch integration: the decentralized optimizer and built-in data sets."""
from p2plearn.train import data
from p2plearn.train.optimizer import DecentralizedOptimizer, TrainingStats, describe_layers

__all__ = ["DecentralizedOptimizer", "TrainingStats", "data", "describe_layers"]
