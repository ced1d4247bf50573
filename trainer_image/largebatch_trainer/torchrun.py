"""`python -m largebatch_trainer.torchrun ARGS`: torchrun, with what its command line cannot say: a
shorter exit barrier, no restart of a worker group that diverged, trainer processes forked from the
agent instead of started as new interpreters (largebatch_trainer.forked), an agent that leaves at
once when it has succeeded, a rendezvous handler that rejoins a store that was lost and came back
(largebatch_trainer.rejoin), and rounds that wait for the nodes already waiting for them
(largebatch_trainer.full_rounds).

When an agent's workers have finished, torchelastic holds the agent in an "exit barrier" until every
other agent of the rendezvous round has finished too, for up to `exit_barrier_timeout` seconds (300 by
default, settable only through the Python API). The barrier protects a rendezvous store hosted by one
of the agents; largebatch's store is hosted outside every agent (the runner's, or the job's rendezvous
pod), and all ranks of a job finish at the same step (they agree on it through the per-step
all-reduce), so agents reach the barrier within a second or two of each other. A peer that has not
arrived after EXIT_BARRIER_SECONDS is not coming: its worker was restarted into a new round, or its
node is gone. Waiting five minutes for it only delays the end of the job; see docs/trainer.md.

A worker group that failed because training diverged (a NaN or infinite loss) is not restarted: the same
steps from the same checkpoint would diverge again, so the agent gives up at once and the shell reports it.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback

from torch.distributed import run
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous import registry
from torch.distributed.launcher import api as launcher

from largebatch import launch
from largebatch_trainer import forked, full_rounds, rejoin
from largebatch_trainer.lifeline import AGENT_PID, die_with_parent, parent_from
from largebatch_trainer.main import exit_process

EXIT_BARRIER_SECONDS = float(os.environ.get("LARGEBATCH_EXIT_BARRIER_SECONDS", "10"))
# The runner's pid, set by `lbctl run --local` only: a user's own torchrun under nohup must outlive its shell.
DIE_WITH_PARENT = "LARGEBATCH_AGENT_DIES_WITH_PARENT"


class Agent(LocalElasticAgent):
    """torchrun's agent with largebatch's exit barrier timeout, which does not restart a diverged group."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("exit_barrier_timeout", EXIT_BARRIER_SECONDS)
        super().__init__(*args, **kwargs)

    def _monitor_workers(self, worker_group):
        result = super()._monitor_workers(worker_group)
        # Every rank raises on the same all-reduced loss; one rank's error file saying so is enough.
        if result.is_failed() and any(launch.DIVERGED in str(f.message) for f in result.failures.values()):
            self._remaining_restarts = 0
        return result


def main() -> None:
    if os.environ.get(DIE_WITH_PARENT):
        # The local runner hosts the rendezvous store: an agent that outlived it could only fail later.
        die_with_parent(signal.SIGTERM, parent_from(DIE_WITH_PARENT))
    os.environ[AGENT_PID] = str(os.getpid())  # the workers' parent, for their own lifeline
    # torchrun builds its agent through this module's name; there is no other way to pass the timeout.
    launcher.LocalElasticAgent = Agent
    build = registry.get_rendezvous_handler
    registry.get_rendezvous_handler = lambda params: rejoin.Rejoining(params, build)
    full_rounds.install()
    forked.install()
    # Once torchrun returns or raises, its workers are reaped and its rendezvous closed. A normal exit
    # would then spend over a second of CPU finalising torch's modules and libraries before the pod or
    # the local run could end: leave at once, with what the interpreter would have printed.
    try:
        run.main()
    except SignalException as exc:
        # A stop, not a failure: the pod deleted (a suspended, preempted or finished job: the operator
        # removes a finished job's pods as soon as rank 0 reports the end, which can find its agent still
        # in the exit barrier) or the local run stopped. Its workers have been stopped; a traceback would
        # read as a crash in the log of a job that succeeded.
        print(f"torchrun agent stopped by {signal.Signals(exc.sigval).name}", file=sys.stderr, flush=True)
        exit_process(1)
    except Exception:  # failed workers (SystemExit: argparse's own)
        traceback.print_exc()
        exit_process(1)
    exit_process(0)


if __name__ == "__main__":
    main()
