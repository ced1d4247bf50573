"""`python -m largebatch.kube` (also `lbctl operator`): the operator, for every namespace or the ones
named in LARGEBATCH_WATCH_NAMESPACES (comma-separated).

Replicas: with LARGEBATCH_PEERING naming a kopf peering object (the chart creates one), replicas
announce themselves there and only the one with the highest priority acts; the others pause and take
over when it stops announcing. Each replica draws a random priority unless
LARGEBATCH_PEERING_PRIORITY sets one (kopf pauses every replica when two share the highest). Without
LARGEBATCH_PEERING the operator runs alone (standalone)."""

from __future__ import annotations

import logging
import os
import random

import kopf

from largebatch.kube import handlers  # noqa: F401 (registers the handlers)


def main() -> None:
    namespaces = [n for n in os.environ.get("LARGEBATCH_WATCH_NAMESPACES", "").split(",") if n]
    peering = os.environ.get("LARGEBATCH_PEERING") or None
    priority = int(os.environ.get("LARGEBATCH_PEERING_PRIORITY") or random.randrange(1, 2**31))
    kopf.configure(log_format=kopf.LogFormat.PLAIN)
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # not a line per timer tick
    kopf.run(
        standalone=peering is None,
        peering_name=peering,
        priority=priority,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=os.environ.get("LARGEBATCH_LIVENESS_ENDPOINT") or None,
    )


if __name__ == "__main__":
    main()
