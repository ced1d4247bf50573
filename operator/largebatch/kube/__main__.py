"""`python -m largebatch.kube` (also `lbctl operator`): the operator, for every namespace or the ones
named in LARGEBATCH_WATCH_NAMESPACES (comma-separated).

Replicas: with LARGEBATCH_PEERING naming a kopf peering object (the chart creates one), replicas
announce themselves there and only the one with the highest priority acts; the others pause and take
over when it stops announcing. Each replica draws a random priority unless
LARGEBATCH_PEERING_PRIORITY sets one (kopf pauses every replica when two share the highest). Without
LARGEBATCH_PEERING the operator runs alone (standalone).

It exits with status 1 when kopf gives up watching (largebatch/kube/watchdog.py)."""

from __future__ import annotations

import logging
import os
import random
import sys

import kopf

from largebatch.kube import handlers  # registers the handlers


def main() -> None:
    namespaces = [n for n in os.environ.get("LARGEBATCH_WATCH_NAMESPACES", "").split(",") if n]
    peering = os.environ.get("LARGEBATCH_PEERING") or None
    priority = int(os.environ.get("LARGEBATCH_PEERING_PRIORITY") or random.randrange(1, 2**31))
    kopf.configure(log_format=kopf.LogFormat.PLAIN)
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # not a line per timer tick
    settings = kopf.OperatorSettings()
    # Named namespaces need no listing of the namespaces, which a namespaced install has no right to:
    # kopf would try it for as long as it retries a 403 (LARGEBATCH_API_RETRY_SECONDS) before it fell
    # back on the names. Patterns (globs) do need it.
    settings.scanning.disabled = bool(namespaces) and not any(set("*?!") & set(name) for name in namespaces)
    try:
        kopf.run(
            settings=settings,
            standalone=peering is None,
            peering_name=peering,
            priority=priority,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=os.environ.get("LARGEBATCH_LIVENESS_ENDPOINT") or None,
            stop_flag=handlers.WATCHDOG.stop,
        )
    finally:  # kopf returns, or raises what stopped it
        if handlers.WATCHDOG.failure:
            sys.exit(f"largebatch operator: kopf's {handlers.WATCHDOG.failure}")


if __name__ == "__main__":
    main()
