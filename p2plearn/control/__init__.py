"""Control plane (pyzmq): rendezvous, membership, heartbeats, clock table and global view.

``Coordinator`` serves one job (in the launcher, or in rank 0 without one); every peer holds a
``Client``. Messages are signed with the job key (``protocol``); nothing here carries tensors:
model state for a joining peer travels through the data engine, the control plane only
tells the donor whom to send it to.
"""

from .client import Client, ControlError, CoordinatorDead, Refused
from .coordinator import Coordinator
from .estimator import BandwidthEstimator, seed_rates
from .lifecycle import Phase
from .membership import Event, Member
from .progress import Progress
from .table import MembershipTable
from .view import GlobalView

__all__ = ["BandwidthEstimator", "Client", "ControlError", "Coordinator", "CoordinatorDead", "Event",
           "GlobalView", "Member", "MembershipTable", "Phase", "Progress", "Refused", "seed_rates"]
