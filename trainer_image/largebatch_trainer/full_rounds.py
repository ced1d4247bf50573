"""A rendezvous round that does not close on the nodes already waiting for it.

torch's c10d rendezvous opens a new round once every participant of the last one has left it (every
agent restarting its group: a newcomer arrived, or a peer was lost). The nodes that waited for that
round (the newcomers, and the participants that left first) poll the store once a second and add
themselves when they see it open; the round closes `last_call_timeout` after it reached `--nnodes`'s
minimum, with whoever is in by then. With a short last call (largebatch's is 1 s, so that a
newcomer is taken in at once) a waiting node that polled a little late, on a loaded machine, missed
the round, waited for the next, and made every agent restart for it again: in CI a job of four
workers restarted every 16 s for ten minutes, each round closing with two of them
(docs/trainer.md, "Rendezvous rounds").

Here a round that could close waits while nodes are still on its wait list, up to `--nnodes`'s
maximum: they asked for this round and are alive (torch drops a node from the wait list once its
heartbeats stop, after keep_alive_interval x keep_alive_max_attempt, 15 s), so the round waits for
them at most that long, and the last call still bounds a round that no one else waits for.
"""

from __future__ import annotations

from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic


class JoinWaitingForTheWaitList(dynamic._RendezvousJoinOp):
    """torch's join step, which does not mark a round complete while live nodes wait to be in it."""

    def __call__(self, ctx: dynamic._RendezvousContext, deadline: float) -> dynamic._Action:
        action = super().__call__(ctx, deadline)
        state = ctx.state
        if (
            action is dynamic._Action.MARK_RENDEZVOUS_COMPLETE
            and state.wait_list
            and len(state.participants) < ctx.settings.max_nodes
        ):
            return dynamic._Action.KEEP_ALIVE if dynamic._should_keep_alive(ctx) else dynamic._Action.SYNC
        return action


def install() -> None:
    """Have this agent's rendezvous handler (which builds a join step per round) use it."""
    dynamic._RendezvousJoinOp = JoinWaitingForTheWaitList
