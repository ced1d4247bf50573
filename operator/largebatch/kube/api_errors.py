"""What the Kubernetes API server said, in its own words: the `message` of the Status it answered with."""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException


def message(exc: ApiException) -> str:
    try:
        return json.loads(exc.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{exc.status} {exc.reason}"
