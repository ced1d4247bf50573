"""Generates the LargeBatchJob CustomResourceDefinition from the pydantic models in `largebatch.api`.

The API server wants a *structural* OpenAPI v3 schema: every node typed, no `$ref`, no `anyOf` for
optional fields, booleans for exclusive bounds. Pydantic emits JSON Schema 2020-12, so this module
inlines the definitions and rewrites those few constructs; everything else (descriptions, defaults,
enums, bounds, CEL rules) passes through unchanged.
"""

from __future__ import annotations

from typing import Any

import yaml

from largebatch import api

CRD_FILE = f"{api.PLURAL}.{api.GROUP}.yaml"

_PRINTER_COLUMNS = [
    ("Phase", "string", ".status.phase", "Lifecycle phase"),
    ("Workers", "integer", ".status.workers.ready", "Ready workers"),
    ("Global batch", "integer", ".status.plan.globalBatch", "Global batch of the current step"),
    ("Accum", "integer", ".status.plan.accumulationSteps", "Gradient accumulation steps"),
    ("LR", "number", ".status.plan.lr", "Learning rate of the current step"),
    ("Step", "integer", ".status.progress.step", "Optimizer steps taken"),
    ("Loss", "number", ".status.progress.loss", "Training loss of the last step"),
    ("Age", "date", ".metadata.creationTimestamp", "Time since creation"),
]

# JSON Schema keys with no place in a CRD schema.
_DROP = {"title", "$defs", "additionalProperties"}


def openapi_schema(model: type[api._Model]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of one API model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(raw, raw.get("$defs", {}))


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    while "$ref" in node or "anyOf" in node:
        if "$ref" in node:  # inline the definition; the reference's own keys (description, default) win
            target = defs[node.pop("$ref").split("/")[-1]]
            node = {**target, **node}
        else:  # `X | None` is just an optional X; the API server has no null
            branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
            if len(branches) != 1:
                raise ValueError(f"no structural form for a union of {len(branches)} types: {branches}")
            node = {**branches[0], **node}
    if isinstance(node.get("description"), str):  # docstrings wrap; kubectl explain re-wraps
        node["description"] = " ".join(node["description"].split())
    if node.get("default", 0) is None:
        del node["default"]
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, edge in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), int | float) and not isinstance(node.get(bound), bool):
            node[edge] = node[bound]
            node[bound] = True
    extra = node.get("additionalProperties")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key in ("properties",):
            out[key] = {name: _structural(prop, defs) for name, prop in value.items()}
        elif key in ("items", "allOf"):
            out[key] = _structural(value, defs)
        else:
            out[key] = value
    if node.get("type") == "object" and "properties" not in node:
        if isinstance(extra, dict) and extra:  # a map of typed values
            out["additionalProperties"] = _structural(extra, defs)
        elif not out.get("x-kubernetes-preserve-unknown-fields"):
            out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _immutable(spec: dict[str, Any]) -> dict[str, Any]:
    """Transition rules (checked on updates only) on the blocks that define the training math, and on
    what the workers read from the job file written at start: changing either mid-run would train a
    different job under the same name, or change a setting the workers never see."""
    for name in api.LargeBatchJobSpec.immutable:
        _refuse_change(spec, name, "it would change the training mid-run")
    for name in api.LargeBatchJobSpec.read_at_start:
        _refuse_change(spec, name, "the workers read it once, from the job file written when the job started")
    return spec


def _refuse_change(spec: dict[str, Any], dotted: str, why: str) -> None:
    """`self == oldSelf` on the field's own schema when it always has a value (a default fills it);
    otherwise a rule on the spec that also refuses setting or removing it (a transition rule on an
    optional field is skipped when either side lacks it)."""
    model, node, path = api.LargeBatchJobSpec, spec, []
    for name in dotted.split("."):
        info = model.model_fields[name]
        path.append(info.alias or name)
        node = node["properties"][path[-1]]
        model = info.annotation
    field = ".".join(path)
    message = f"spec.{field} cannot change on an existing job ({why}): create a new LargeBatchJob, which can " \
        "resume from this one's checkpoints"  # fmt: skip
    if info.default is not None:
        node.setdefault("x-kubernetes-validations", []).append({"rule": "self == oldSelf", "message": message})
        return
    rule = f"has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field})"
    spec.setdefault("x-kubernetes-validations", []).append({"rule": rule, "message": message, "fieldPath": f".{field}"})


def crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    spec = _immutable(openapi_schema(api.LargeBatchJobSpec))
    status = openapi_schema(api.LargeBatchJobStatus)
    root = {
        "type": "object",
        "description": "A large-batch PyTorch training job with an adaptive global batch.",
        "properties": {
            "apiVersion": {"type": "string", "description": "Versioned schema of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "required": ["spec"],
        "x-kubernetes-validations": [
            {
                "rule": f"self.metadata.name.size() <= {api.MAX_NAME_LENGTH}",
                "message": f"metadata.name must be at most {api.MAX_NAME_LENGTH} characters: "
                "worker pod and service names are derived from it",
            }
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.KIND.lower(),
                "shortNames": [api.SHORT_NAME],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": n, "type": t, "jsonPath": p, "description": d} for n, t, p, d in _PRINTER_COLUMNS
                    ],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `lbctl crd` from largebatch/api/; do not edit (make crds).\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100)
