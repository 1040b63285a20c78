"""Receiver selection: which peers each sender multicasts to, every round."""
from p2plearn.selection.base import SelectionPolicy
from p2plearn.selection.view import NetworkView, average_fanout, plan_time

__all__ = ["SelectionPolicy", "NetworkView", "average_fanout", "plan_time"]
