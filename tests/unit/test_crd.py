"""The checked-in CRD is what the models generate, and it is a structural schema the API server takes."""

from __future__ import annotations

import yaml

from largebatch import api, crd
from tests.helpers import ROOT

CRD_PATH = ROOT / "crds" / crd.CRD_FILE


def test_checked_in_crd_matches_the_models():
    assert CRD_PATH.read_text() == crd.crd_yaml(), "crds/ drifted from largebatch/api/: run `make crds`"


def _walk(node, path="$"):
    yield path, node
    for key in ("properties", "additionalProperties"):
        children = node.get(key)
        if isinstance(children, dict) and key == "properties":
            for name, child in children.items():
                yield from _walk(child, f"{path}.{name}")
        elif isinstance(children, dict):
            yield from _walk(children, f"{path}{{*}}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[*]")


def _schema():
    return yaml.safe_load(CRD_PATH.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_the_schema_is_structural():
    for path, node in _walk(_schema()):
        assert not {"$ref", "$defs", "anyOf", "oneOf", "allOf", "title", "const"} & node.keys(), path
        assert (
            node.get("type")
            or node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        ), f"{path} has no type"
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(bound, True) is True, f"{path}.{bound} must be a boolean"
        assert node.get("default", 0) is not None, path


def test_every_spec_and_status_field_is_described_for_kubectl_explain():
    schema = _schema()
    for part in ("spec", "status"):
        for path, node in _walk(schema["properties"][part], f"$.{part}"):
            if not path.endswith(("{*}", "[*]")):  # map values and list items are described by their field
                assert node.get("description"), f"{path} has no description"


def test_defaults_enums_bounds_and_cel_rules_are_present():
    spec = _schema()["properties"]["spec"]["properties"]
    policy = spec["batch"]["properties"]["policy"]
    assert policy["properties"]["type"]["enum"] == ["constant", "linearRamp", "seesaw", "criticalBatch"]
    assert policy["properties"]["seesaw"]["properties"]["factor"]["default"] == 2.0
    assert spec["workers"]["properties"]["accelerator"]["enum"] == ["nvidia.com/gpu", "google.com/tpu", "none"]
    # Defaults are written out in full: the API server checks CEL rules against them as written.
    assert spec["workers"]["default"] == api.WorkersSpec().model_dump(mode="json", by_alias=True, exclude_none=True)
    assert spec["metrics"]["properties"]["port"]["minimum"] == 1024
    rules = {rule["rule"] for _, node in _walk(_schema()) for rule in node.get("x-kubernetes-validations", [])}
    assert "self.min <= self.max" in rules
    assert "self.initial <= self.max" in rules
    assert "self.warmupSamples < self.totalSamples" in rules
    assert spec["suspend"]["default"] is False and spec["workers"]["properties"]["maxRestarts"]["default"] == 3


def test_the_blocks_that_define_the_training_cannot_change():
    spec = _schema()["properties"]["spec"]["properties"]
    for name in ("task", "batch", "optimizer", "schedule"):
        transition = [r for r in spec[name]["x-kubernetes-validations"] if "oldSelf" in r["rule"]]
        assert transition == [{"rule": "self == oldSelf", "message": transition[0]["message"]}]
        assert f"spec.{name} cannot change" in transition[0]["message"]
    for name in ("workers", "image", "suspend"):
        assert not any("oldSelf" in r["rule"] for r in spec[name].get("x-kubernetes-validations", []))
    for name in ("min", "max", "maxRestarts", "devicesPerWorker"):
        assert "x-kubernetes-validations" not in spec["workers"]["properties"][name]


def test_what_the_workers_read_once_from_the_job_file_cannot_change():
    """The job's ConfigMap is written when the job starts; an edit accepted afterwards would never reach
    the workers, so the API server refuses it (issue 24)."""
    schema = _schema()["properties"]["spec"]
    spec = schema["properties"]
    for node, name in [(spec[n], n) for n in ("gradientAllReduce", "evaluation", "checkpoint", "metrics")] + [
        (spec["workers"]["properties"]["accelerator"], "workers.accelerator")
    ]:
        [transition] = [r for r in node["x-kubernetes-validations"] if "oldSelf" in r["rule"]]
        assert transition["rule"] == "self == oldSelf" and f"spec.{name} cannot change" in transition["message"]
    [precision] = [r for r in schema["x-kubernetes-validations"] if "oldSelf.precision" in r["rule"]]
    assert precision["fieldPath"] == ".precision" and "spec.precision cannot change" in precision["message"]


def test_names_subresource_and_printer_columns():
    document = yaml.safe_load(CRD_PATH.read_text())
    assert document["spec"]["names"]["shortNames"] == ["lbj"]
    version = document["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase",
        "Workers",
        "Global batch",
        "Accum",
        "LR",
        "Step",
        "Loss",
        "Age",
    ]
