"""What a managed control plane does to a running job on every upgrade: its API server restarted, its
etcd restarted; the operator cut off from the API server (a proxy between them drops its
connections); a restarted API server answering 403 while its RBAC caches fill. Real training through the
pod runner; the test control plane stops the component (SIGTERM) and starts it again with the same
flags, etcd keeping its data."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator

import pytest
import urllib3
from kubernetes import client, watch

from largebatch import api, schedule
from tests.cluster.pod_runner import PodRunner
from tests.e2e.jobs import (
    RELEASE,
    apply,
    contiguous,
    history,
    job_document,
    shared_claim,
    status_of,
    wait_or_explain,
    wait_until_succeeded,
)
from tests.e2e.operator_process import OperatorProcess, through_proxy
from tests.helpers import bound, simulated_task, wait_for

pytestmark = pytest.mark.e2e

TOTAL = 16 * 2_000
RAMP = 4_000
"""The batch goes from 16 (one worker) to 32 (two) at sample 4,000 of 32,000: most of the run is left
for what the test does after the batch grew, beside two outages."""
SECONDS_PER_SAMPLE = 0.005
"""Simulated training (a sleep per sample, 80 ms a step): two workers train the rest of the run in about
a minute and a half on any machine, and twice as fast as one. With a real model on two busy cores, two
workers measured slower than one (1,017 against 3,749 samples/s under two CPU hogs), and the operator
rightly did not replace a lost second worker: the test's job must gain from its second worker. So did
steps of 8 ms (0.5 ms a sample) when five xdist workers shared the two cores: the all-reduce's wait
outgrew the step (734 against 1,561 samples/s, CI 2026-12-05). At 80 ms it stays small beside the step."""
BEFORE_GROWTH = 16 * 60
"""How close to the growth (60 steps, 5 s) the tests let the job come before they cut the API server off."""
QUICK_RETRIES = {"LARGEBATCH_API_BACKOFF_SCALE": "0.1"}
"""kopf's waits between tries of a request, a tenth of its own (largebatch/kube/watchdog.py): its nine
default tries, which an outage here outlasts, are over in 5.4 s rather than 54 s, and the operator asks
again within 3 s of the API server's return rather than 30 s. What the tests show is the count: kopf gives
a request up after its ninth try unless the operator tells it otherwise."""


def ramp_job(name: str) -> tuple[dict, int]:
    """A job growing from one worker to two at RAMP samples, and the sample at which it grows."""
    document = job_document(name, "checkpoints", total=TOTAL)
    document["spec"]["task"] = simulated_task(SECONDS_PER_SAMPLE)
    document["spec"]["batch"]["policy"] = {"type": "linearRamp", "linearRamp": {"increment": 16, "rampSamples": RAMP}}
    spec = api.LargeBatchJob.model_validate(document).spec
    return document, next(phase.start for phase in schedule.phases(spec) if phase.global_batch == 32)


@pytest.fixture
def patient_operator(operator_kubeconfig, namespace, tmp_path):
    """The operator with the product's grace (20 s) before an unplaced worker counts as a capacity limit,
    not the 3 s that lets the other tests be quick: the replacement of a worker deleted right after etcd
    came back stayed unplaced for longer than 3 s while the control plane caught up, the job's capacity
    was taken to be one worker, and the run ended on one (CI, 2026-12-04)."""
    process = OperatorProcess.start(operator_kubeconfig, namespace, tmp_path / "operator.log",
                                    LARGEBATCH_UNSCHEDULABLE_GRACE_SECONDS="20", **QUICK_RETRIES)  # fmt: skip
    yield process
    process.stop()


def test_restarts_of_the_api_server_and_of_etcd_lose_nothing(crd, namespace, patient_operator, tmp_path):
    """The API server stays away while the batch grows past one worker, and for longer than kopf retries a
    request by default, so the first the operator hears of the growth is rank 0's report after the
    restart; etcd then goes away while two workers train, and a worker lost after that is replaced: the
    operator's watches came back without a restart of the operator."""
    operator = patient_operator
    shared_claim(crd, namespace, "checkpoints")
    document, grows = ramp_job("restart")
    core = client.CoreV1Api(crd.api)
    with PodRunner(crd, namespace, tmp_path / "pods") as pods:
        assert apply(crd, document, namespace).returncode == 0
        explain = dict(cluster=crd, namespace=namespace, name="restart", pods=pods, log_path=operator.log)
        samples = lambda: status_of(crd, namespace, "restart").get("progress", {}).get("samples", 0)  # noqa: E731
        wait_or_explain(lambda: samples() >= grows - BEFORE_GROWTH, "the job close to its batch growing", **explain)
        assert samples() < grows, f"the batch grew at {grows} samples before the test stopped the API server"

        with contextlib.ExitStack() as held, crd.stopped("kube-apiserver"):
            # Training needs no API server: the checkpoint (on the host) shows the batch grown without it.
            wait_for(lambda: any(batch == 32 for _, _, batch, *_ in history(tmp_path)), timeout=300,
                     what="the trainer to grow its batch while the API server is away")  # fmt: skip
            # Then held still until the API server is back, so that the run's rest is left for the operator
            # to act on: an unloaded machine had trained to within 1% of the end before it was (2026-12-03).
            held.enter_context(pods.paused("restart-worker-0"))
            # Away for longer than kopf's default retries of one request (9 tries, over 54 s unscaled), after
            # which kopf gives the request up unless told otherwise (kube/watchdog.py): an upgrade's restart
            # takes that long.
            wait_for(lambda: "Request attempt #9" in operator.log.read_text(), timeout=120,
                     what="the operator to have tried one request nine times")  # fmt: skip
        assert pods.unavailable, "the pod runner never saw the API server away"
        # Rank 0 trains on to report the growth, then is held still until the second worker is placed, and let
        # go before that worker's torchrun joins (its rendezvous stops rank 0's trainer, which held still
        # cannot checkpoint: torchrun kills it after 30 s). The operator takes up to a minute to come back, and
        # the nodes, marked NotReady once the API server is back, took another minute to take the new pod
        # (two CPU hogs, 2026-12-04): an unloaded machine trains the whole run in that time.
        wait_or_explain(lambda: reported_batch(explain) == 32, "rank 0 to report its grown batch", **explain)
        with pods.paused("restart-worker-0"):
            wait_or_explain(lambda: placed(core, namespace, "restart-worker-1"),
                            "the worker the operator added after the restart placed", **explain)  # fmt: skip

        wait_or_explain(lambda: world_of_newest_checkpoint(tmp_path) == 2, "two workers training", **explain)
        step = newest_step(tmp_path)
        with contextlib.ExitStack() as held:
            with crd.stopped("etcd"):
                wait_for(lambda: newest_step(tmp_path) > step + 100, timeout=300,
                         what="two workers training on while etcd is away")  # fmt: skip
                # Held still from here until the worker is deleted, so that the run's rest is left for its
                # replacement however long etcd and the API server take to come back. Worker 1 waits for
                # rank 0 in its next all-reduce meanwhile.
                held.enter_context(pods.paused("restart-worker-0"))
            assert not status_of(crd, namespace, "restart")["progress"].get("done"), "the run ended before the fault"
            core.delete_namespaced_pod("restart-worker-1", namespace)  # a worker lost once etcd is back
        wait_or_explain(lambda: pods.started.count("restart-worker-1") == 2, "the lost worker replaced", **explain)
        wait_until_succeeded(**explain)
        assert operator.process.poll() is None  # the same operator process throughout
        assert pods.errors == []
        assert pods.started.count("restart-worker-0") == 1 and pods.started.count("restart-rdzv") == 1
        rank0 = pods.log("restart-worker-0")
        assert "status report refused" in rank0 and "status reports resumed" in rank0
        # No traceback of the trainer's (torchrun's own lines carry a prefix: its exit barrier complains when
        # the operator removes the store of a finished job first).
        assert not re.search(r"^Traceback", rank0, re.MULTILINE), rank0
    status = status_of(crd, namespace, "restart")
    assert status["progress"]["samples"] == TOTAL and status["progress"]["done"] is True
    assert contiguous(history(tmp_path), TOTAL)  # nothing skipped or repeated


def reported_batch(explain: dict) -> int | None:
    """The batch rank 0 last reported for the job `explain` names."""
    return status_of(explain["cluster"], explain["namespace"], explain["name"]).get("progress", {}).get("policyBatch")


def newest_step(tmp_path) -> int:
    return sum(steps for *_, steps in history(tmp_path))


def world_of_newest_checkpoint(tmp_path) -> int | None:
    """The world size of the run that wrote the newest checkpoint."""
    runs = history(tmp_path)
    return runs[-1][3] if runs else None


def placed(core: client.CoreV1Api, namespace: str, pod: str) -> bool:
    """Whether `pod` exists and the scheduler has bound it to a node (the pod runner starts it next)."""
    try:
        return bool(core.read_namespaced_pod(pod, namespace).spec.node_name)
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise


def test_the_operator_cut_off_from_the_api_server_for_a_minute_creates_nothing_twice(
    crd, namespace, operator_kubeconfig, tmp_path
):
    """The operator reaches the API server through a proxy that drops every connection and refuses new
    ones for a minute, while the batch grows past one worker: once let through, the operator adds the
    one worker the growth needs, and no object of the job was created twice (a watch of its own sees
    every pod created)."""
    shared_claim(crd, namespace, "checkpoints")
    document, grows = ramp_job("cut")
    core = client.CoreV1Api(crd.api)
    created: list[str] = []  # every pod the watch saw created, in order
    done = threading.Event()

    def watch_pods() -> None:
        version = None  # resumed from the last event seen when a watch ends or breaks
        while not done.is_set():
            try:
                stream = watch.Watch().stream(core.list_namespaced_pod, namespace, resource_version=version,
                                              timeout_seconds=10)  # fmt: skip
                for event in stream:
                    version = event["object"].metadata.resource_version
                    if event["type"] == "ADDED":
                        created.append(event["object"].metadata.name)
            except urllib3.exceptions.HTTPError:
                continue

    watcher = threading.Thread(target=watch_pods, daemon=True)
    watcher.start()
    with through_proxy(crd, operator_kubeconfig, namespace, tmp_path / "operator.log", **QUICK_RETRIES) as (
        operator,
        proxy,
    ):
        try:
            with PodRunner(crd, namespace, tmp_path / "pods") as pods:
                assert apply(crd, document, namespace).returncode == 0
                explain = dict(cluster=crd, namespace=namespace, name="cut", pods=pods, log_path=operator.log)
                samples = lambda: status_of(crd, namespace, "cut").get("progress", {}).get("samples", 0)  # noqa: E731
                wait_or_explain(lambda: samples() >= grows - BEFORE_GROWTH, "the job close to its batch growing",
                                **explain)  # fmt: skip
                services = {s.metadata.name: s.metadata.uid for s in core.list_namespaced_service(namespace).items}
                with contextlib.ExitStack() as held:
                    with proxy.cut_off():
                        # The trainers reach the API server directly, not through the proxy: rank 0 reports the
                        # growth, and is then held still for the rest of the cut, as in the restart test.
                        wait_or_explain(lambda: reported_batch(explain) == 32, "rank 0 to report its grown batch",
                                        **explain)  # fmt: skip
                        held.enter_context(pods.paused("cut-worker-0"))
                        wait_for(lambda: "Request attempt #9" in operator.log.read_text(), timeout=120,
                                 what="the operator to have tried one request nine times")  # fmt: skip
                    assert proxy.refused > 0, "the operator never tried to reconnect"
                    wait_or_explain(lambda: placed(core, namespace, "cut-worker-1"),
                                    "the operator to add the worker the growth needs, placed", **explain)  # fmt: skip
                wait_until_succeeded(**explain)
                assert operator.process.poll() is None and pods.errors == []
            assert {s.metadata.name: s.metadata.uid for s in core.list_namespaced_service(namespace).items} == services
        finally:
            done.set()
            watcher.join(timeout=bound(30))
    assert sorted(created) == ["cut-rdzv", "cut-worker-0", "cut-worker-1"], created  # each once
    assert contiguous(history(tmp_path), TOTAL)


@contextlib.contextmanager
def forbidden(cluster) -> Iterator[None]:
    """The operator's ClusterRoleBinding removed for the block, then created again: each request of the
    operator's is answered 403, as a restarted API server does while its RBAC caches are empty. The block
    starts once the API server's authorizer denies the operator (it learns of the deletion through an
    informer): a watch that asked again before that was allowed and streamed on with nothing to fail, and
    test_403s waited 180 s for its refusals (stop 61, a cold run)."""
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    name = f"{RELEASE}-operator"  # the chart's, as its ServiceAccount's
    binding = rbac.read_cluster_role_binding(name)
    rbac.delete_cluster_role_binding(name)
    try:
        account = next(subject for subject in binding.subjects if subject.kind == "ServiceAccount")
        wait_for(lambda: not may_watch_pods(cluster, f"system:serviceaccount:{account.namespace}:{account.name}"),
                 what="the API server's authorizer to deny the operator")  # fmt: skip
        yield
    finally:
        binding.metadata = client.V1ObjectMeta(name=binding.metadata.name, labels=binding.metadata.labels)
        rbac.create_cluster_role_binding(binding)


def may_watch_pods(cluster, user: str) -> bool:
    """What the API server's authorizer answers `user` asking to watch pods (a SubjectAccessReview)."""
    attributes = client.V1ResourceAttributes(verb="watch", resource="pods")
    spec = client.V1SubjectAccessReviewSpec(user=user, resource_attributes=attributes)
    authorization = client.AuthorizationV1Api(cluster.api)
    return authorization.create_subject_access_review(client.V1SubjectAccessReview(spec=spec)).status.allowed


def pod_uid(core, namespace: str, name: str) -> str | None:
    pods = core.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}").items
    return pods[0].metadata.uid if pods else None


def test_403s_for_longer_than_kopf_retries_by_default_stop_no_watch(crd, namespace, operator_kubeconfig, tmp_path):
    """The soak's finding: a restarted API server answered the operator's watches 403 after refused
    connections had used up most of kopf's default tries (9 over 54 s), and kopf stopped watching for good
    while the process lived on. Here its watches are refused 403 for longer than those 9 tries; once the
    server allows them again the operator watches on: it replaces a worker deleted after, and starts a
    job applied after."""
    core = client.CoreV1Api(crd.api)
    with through_proxy(crd, operator_kubeconfig, namespace, tmp_path / "operator.log", **QUICK_RETRIES) as (
        operator,
        proxy,
    ):
        assert apply(crd, job_document("before", None), namespace).returncode == 0
        first = wait_for(lambda: pod_uid(core, namespace, "before-worker-0"), what="the job's worker created")
        with forbidden(crd):
            proxy.cut()  # its watches ask again, into the 403s
            proxy.restore()
            pattern = re.compile(r"Request attempt #9\b[^\n]*/pods\b[^\n]*APIForbiddenError")
            wait_for(lambda: pattern.search(operator.log.read_text()), timeout=180,
                     what="the last of kopf's default tries of the pods watch refused")  # fmt: skip
        core.delete_namespaced_pod("before-worker-0", namespace)
        wait_for(lambda: pod_uid(core, namespace, "before-worker-0") not in (None, first), timeout=120,
                 what="the worker deleted after the 403s replaced: the pods watch lives")  # fmt: skip
        assert apply(crd, job_document("after", None), namespace).returncode == 0
        wait_for(lambda: pod_uid(core, namespace, "after-worker-0"), timeout=120,
                 what="a job applied after the 403s started: the jobs watch lives")  # fmt: skip
        assert operator.process.poll() is None, operator.tail()
        assert "Stopping the operator" not in operator.log.read_text(), operator.tail()


def test_an_operator_refused_for_longer_than_it_retries_exits_to_be_restarted(
    crd, namespace, operator_kubeconfig, tmp_path
):
    """Refused for longer than its tries last (LARGEBATCH_API_RETRY_SECONDS, 3 s here), a watch of kopf's
    ends for good: the operator exits with status 1, naming it, so that its Deployment starts it again
    rather than leaving it running blind."""
    core = client.CoreV1Api(crd.api)
    log = tmp_path / "operator.log"
    with through_proxy(crd, operator_kubeconfig, namespace, log, LARGEBATCH_API_RETRY_SECONDS="3") as (operator, proxy):
        assert apply(crd, job_document("refused", None), namespace).returncode == 0
        wait_for(lambda: pod_uid(core, namespace, "refused-worker-0"), what="the operator watching, its job started")
        with forbidden(crd):
            proxy.cut()
            proxy.restore()
            assert operator.process.wait(timeout=bound(120)) == 1, operator.tail()
    assert re.search(r"Stopping the operator: kopf's watcher for \S+ failed: APIForbiddenError", log.read_text()), (
        log.read_text()[-3000:]
    )
