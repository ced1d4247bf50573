"""The generated CRD on a real kube-apiserver: it is accepted (structural), defaults apply, CEL rules
reject bad jobs at `kubectl apply` with their message, `kubectl explain` and the printer columns work,
and the trainer's Kubernetes progress sink patches the status subresource, and keeps a report the
server refuses until it takes one."""

from __future__ import annotations

import copy

import pytest
import yaml
from kubernetes import client

from largebatch import api, report, schedule
from largebatch.api import PlanStatus, ProgressStatus
from largebatch_trainer.progress import KubernetesSink
from tests.e2e.jobs import apply, seesaw
from tests.helpers import EXAMPLES, bound, wait_for

pytestmark = pytest.mark.e2e


def test_every_example_is_accepted_and_defaults_apply(crd, namespace):
    for path in sorted(EXAMPLES.glob("*.yaml")):
        result = apply(crd, yaml.safe_load(path.read_text()), namespace)
        assert result.returncode == 0, f"{path.name}: {result.stderr}"
    stored = client.CustomObjectsApi(crd.api).get_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, "pylm-seesaw"
    )
    assert stored["spec"]["metrics"]["port"] == 9404  # the whole block was omitted
    assert (
        stored["spec"]["workers"]["pod"] == {"nodeSelector": {}, "tolerations": []}
        or "pod" in stored["spec"]["workers"]
    )
    assert stored["spec"]["optimizer"]["eps"] == 1e-8


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["workers"].update(min=20, max=16), "workers.min must be <= workers.max"),
        (lambda s: s["batch"].update(initial=8192), "batch.initial must be <= batch.max"),
        (
            lambda s: s["schedule"].update(warmupSamples=25600000),
            "schedule.warmupSamples must be < schedule.totalSamples",
        ),
        (lambda s: s["batch"]["policy"]["seesaw"].update(batchFactor=4), "Seesaw stability limit"),
        (lambda s: s["schedule"].update(decay="constant"), "seesaw needs a decaying schedule"),
        (lambda s: s["batch"]["policy"].update(type="linearRamp"), "linearRamp is required"),
        (lambda s: s["optimizer"].update(name="lion"), 'Unsupported value: "lion"'),
        (lambda s: s["workers"].update(accelerator="amd.com/gpu"), 'Unsupported value: "amd.com/gpu"'),
        (lambda s: s["workers"].update(maxRestarts=-1), "spec.workers.maxRestarts: Invalid value"),
        (lambda s: s["batch"].update(microBatchPerDevice=0), "spec.batch.microBatchPerDevice: Invalid value"),
        (lambda s: s.update(metrics={"port": 80}), "spec.metrics.port: Invalid value"),
        (lambda s: s["batch"].update(max=256 * 65_536 + 256), "batch.max must be <= batch.microBatchPerDevice x"),
        (
            lambda s: s["batch"].update(
                initial=1,
                max=20_001,
                policy={"type": "linearRamp", "linearRamp": {"increment": 1, "rampSamples": 1000}},
            ),
            "linearRamp makes at most 10,000 batch increases",
        ),  # fmt: skip
        (lambda s: s["schedule"].update(totalSamples=10**16), "spec.schedule.totalSamples: Invalid value"),
        (lambda s: s["workers"].update(min=True), "spec.workers.min: Invalid value"),
        (
            lambda s: (s.update(metrics={"port": 65530}), s["workers"].update(devicesPerWorker=8)),
            "metrics.port + workers.devicesPerWorker - 1 must be <= 65535",
        ),
        (lambda s: s.update(suspend="yes"), "spec.suspend: Invalid value"),
        (
            lambda s: s["workers"].setdefault("pod", {}).update(volumes=[{"claimName": "c", "mountPath": "/dev/shm"}]),
            "workers.pod.volumes: a mountPath is taken by the checkpoints",
        ),
        (
            lambda s: (
                s["workers"].setdefault("pod", {}).update(volumes=[{"claimName": c, "mountPath": "/d"} for c in "ab"])
            ),
            "two volumes cannot share a mountPath",
        ),
        (
            lambda s: s["workers"].setdefault("pod", {}).update(volumes=[{"claimName": "c", "mountPath": "data"}]),
            "spec.workers.pod.volumes[0].mountPath: Invalid value",
        ),
    ],
)
def test_bad_jobs_are_rejected_at_apply_with_the_rule_message(crd, namespace, change, message):
    document = copy.deepcopy(seesaw())
    change(document["spec"])
    result = apply(crd, document, namespace)
    assert result.returncode != 0
    assert message in result.stderr


def test_a_name_too_long_for_its_pods_is_rejected(crd, namespace):
    document = seesaw()
    document["metadata"]["name"] = "n" * (api.MAX_NAME_LENGTH + 1)
    result = apply(crd, document, namespace)
    assert result.returncode != 0 and f"metadata.name must be at most {api.MAX_NAME_LENGTH}" in result.stderr


@pytest.mark.parametrize(
    ("block", "change"),
    [
        ("batch", lambda s: s["batch"].update(max=8192)),
        ("optimizer", lambda s: s["optimizer"].update(lr=0.01)),
        ("schedule", lambda s: s["schedule"].update(totalSamples=30_000_000)),
        ("task", lambda s: s["task"].update(seed=7)),
        # What the workers read once from the job file (its ConfigMap): an accepted edit would never reach them.
        ("precision", lambda s: s.update(precision="fp32")),
        ("evaluation", lambda s: s.update(evaluation={"everySamples": 4096})),
        ("checkpoint", lambda s: s.update(checkpoint={"everySteps": 7})),
        ("metrics", lambda s: s.update(metrics={"port": 9500})),
        ("workers.accelerator", lambda s: s["workers"].update(accelerator="none")),
    ],
)
def test_edits_that_change_the_training_are_refused_on_an_existing_job(crd, namespace, block, change):
    document = seesaw()
    assert apply(crd, document, namespace).returncode == 0
    change(document["spec"])
    result = apply(crd, document, namespace)
    assert result.returncode != 0
    assert f"spec.{block} cannot change on an existing job" in result.stderr
    assert "create a new LargeBatchJob" in result.stderr


def test_scaling_and_suspending_a_job_are_edits_it_takes(crd, namespace):
    document = seesaw()
    assert apply(crd, document, namespace).returncode == 0
    document["spec"]["workers"].update(min=2, max=4)
    document["spec"]["suspend"] = True
    result = apply(crd, document, namespace)
    assert result.returncode == 0, result.stderr
    stored = client.CustomObjectsApi(crd.api).get_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, document["metadata"]["name"]
    )
    assert stored["spec"]["suspend"] is True and stored["spec"]["workers"]["max"] == 4
    assert stored["spec"]["workers"]["maxRestarts"] == 3  # defaulted


def test_explain_and_printer_columns(crd, namespace):
    explained = crd.kubectl("explain", "lbj.spec.batch.policy.seesaw.factor").stdout
    assert "LR decay step that triggers a cut" in explained
    assert apply(crd, seesaw(), namespace).returncode == 0
    table = crd.kubectl("get", "lbj", "-n", namespace).stdout.splitlines()[0].split()
    for column in ("PHASE", "WORKERS", "GLOBAL", "ACCUM", "LR", "STEP", "LOSS", "AGE"):
        assert column in table


def test_the_trainer_patches_progress_into_the_status_subresource(crd, namespace, monkeypatch):
    assert apply(crd, seesaw(), namespace).returncode == 0
    monkeypatch.setenv("KUBECONFIG", str(crd.kubeconfig))
    sink = KubernetesSink(namespace, "pylm-seesaw")
    progress = ProgressStatus(
        step=12, samples=3072, loss=2.5, noise_scale=310.0, samples_per_second=900.0, policy_batch=256,
        last_change_step=4, done=False, elastic_restarts=1,
    )  # fmt: skip
    plan = PlanStatus(global_batch=256, micro_batch=256, accumulation_steps=1, world_size=1, lr=0.001)
    sink.report(report.report(progress, plan))
    assert sink.close(timeout=bound(30))
    status = client.CustomObjectsApi(crd.api).get_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, "pylm-seesaw"
    )["status"]
    # Nothing of the report was pruned by the schema: the controller gets the policy state back.
    stored, stored_plan = report.read(status)
    assert stored == progress and stored_plan == plan
    assert report.progress_from_status(stored) == schedule.Progress(
        samples=3072, step=12, batch=256, last_change_step=4, noise_scale=310.0
    )
    row = crd.kubectl("get", "lbj", "pylm-seesaw", "-n", namespace, "--no-headers").stdout.split()
    assert "256" in row and "12" in row and "2.5" in row


def test_a_refused_status_report_is_kept_and_the_newest_one_sent_once_the_server_takes_it(
    crd, namespace, monkeypatch, capsys
):
    """The status write refused, for real: an admission policy denies every patch of the job's status, as a
    webhook or a quota would. The trainer's report neither blocks nor raises; the newest report is sent
    once the policy is gone, the older one it superseded never."""
    assert apply(crd, seesaw(), namespace).returncode == 0
    refuse = f"{namespace}-refuse-status"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": refuse},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [api.GROUP], "apiVersions": [api.VERSION],
                                                    "operations": ["UPDATE"], "resources": [f"{api.PLURAL}/status"]}]},
            "validations": [{"expression": "false", "message": "status writes are refused for this test"}],
        },
    }  # fmt: skip
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": refuse},
        "spec": {"policyName": refuse, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}},
    }  # fmt: skip
    custom = client.CustomObjectsApi(crd.api)

    def refused() -> bool:
        try:
            custom.patch_namespaced_custom_object_status(
                api.GROUP, api.VERSION, namespace, api.PLURAL, "pylm-seesaw", {"status": {"progress": {"step": 1}}}
            )
        except client.ApiException as exc:
            return "status writes are refused" in exc.body
        return False

    monkeypatch.setenv("KUBECONFIG", str(crd.kubeconfig))
    plan = PlanStatus(global_batch=256, micro_batch=256, accumulation_steps=1, world_size=1, lr=0.001)
    progress = [
        ProgressStatus(step=step, samples=256 * step, loss=2.5, noise_scale=None, samples_per_second=900.0,
                       policy_batch=256, last_change_step=0, done=False, elastic_restarts=0)
        for step in (12, 13)
    ]  # fmt: skip
    crd.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([policy, binding]))
    try:
        wait_for(refused, what="the admission policy in force")  # the API server loads policies in the background
        sink = KubernetesSink(namespace, "pylm-seesaw")
        sink.report(report.report(progress[0], plan))
        assert not sink.close(timeout=3)  # refused: kept, and the caller was not held up beyond what it allowed
        sink.report(report.report(progress[1], plan))
    finally:
        crd.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", refuse)
    assert sink.close(timeout=bound(60))
    stored = custom.get_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "pylm-seesaw")
    assert report.read(stored["status"])[0] == progress[1]
    said = capsys.readouterr().err
    assert "status report refused (HTTP 422" in said and "status reports resumed after" in said
