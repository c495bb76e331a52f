"""Heat-score routing: which worker process gets the next synthesis stream.

The routing rules live in ``heat``, what they read (settings, each worker's state) in ``model``;
this package's public names are both modules' public classes.
"""

from ttsvc.balancer.heat import HeatScoreBalancer
from ttsvc.balancer.model import BalancerSettings, Clock, WorkerState

__all__ = ["BalancerSettings", "Clock", "HeatScoreBalancer", "WorkerState"]
