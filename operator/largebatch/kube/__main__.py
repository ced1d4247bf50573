"""`python -m largebatch.kube` (also `lbctl operator`): the operator, for every namespace or the ones
named in LARGEBATCH_WATCH_NAMESPACES (comma-separated)."""

from __future__ import annotations

import logging
import os

import kopf

from largebatch.kube import handlers  # noqa: F401 (registers the handlers)


def main() -> None:
    namespaces = [n for n in os.environ.get("LARGEBATCH_WATCH_NAMESPACES", "").split(",") if n]
    kopf.configure(log_format=kopf.LogFormat.PLAIN)
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # not a line per timer tick
    kopf.run(
        standalone=True,  # one operator; peering (two replicas) comes with the chart
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=os.environ.get("LARGEBATCH_LIVENESS_ENDPOINT") or None,
    )


if __name__ == "__main__":
    main()
