"""One reconcile of one LargeBatchJob, the shell around `kube.plan`: observe (the job, its status, its
pods and, for a job under Kueue, its Workloads), `plan` (pure), `apply` (the only step that calls the
API), `account` (pure), and hand back the status fields that changed and the Events to emit.

Level-based and idempotent: fixed names, 409 on create and 404 on delete count as done, and whatever
the next reconcile needs is in the job's status, so an operator restarted at any moment carries on.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from largebatch import controller, timestamps
from largebatch.api import LargeBatchJob, LargeBatchJobStatus
from largebatch.kube import api_errors, kueue, world
from largebatch.kube.manifests import JOB_LABEL, Names
from largebatch.kube.plan import Actions, Outcome, Seen, Settings, account, plan, workers_of
from largebatch.kube.sharing import Share

__all__ = ["Apis", "Reconciled", "Settings", "reconcile"]

Emit = Callable[[str, str, str], None]
"""(type Normal|Warning, reason, message) → an Event on the job."""


@dataclass
class Apis:
    core: client.CoreV1Api
    rbac: client.RbacAuthorizationV1Api
    custom: client.CustomObjectsApi

    @classmethod
    def of(cls, api_client: client.ApiClient | None = None) -> Apis:
        return cls(
            client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client), client.CustomObjectsApi(api_client)
        )

    def create(self, obj: dict[str, Any]) -> bool:
        """Create an object; False when it exists already."""
        namespace, kind = obj["metadata"]["namespace"], obj["kind"]
        call = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "ConfigMap": self.core.create_namespaced_config_map,
            "ServiceAccount": self.core.create_namespaced_service_account,
            "Role": self.rbac.create_namespaced_role,
            "RoleBinding": self.rbac.create_namespaced_role_binding,
        }[kind]
        try:
            call(namespace, obj)
        except ApiException as exc:
            if exc.status != 409:  # it exists: a restarted operator, or a reconcile that saw an old list
                raise
            return False
        return True

    def claim_exists(self, namespace: str, name: str) -> bool:
        try:
            self.core.read_namespaced_persistent_volume_claim(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete a pod; False when it was gone already (a watch may show a pod for a moment longer)."""
        try:
            self.core.delete_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return False
        return True

    def kueue(self, job: LargeBatchJob) -> kueue.Observed:
        """The job's Workloads, the ResourceFlavors they were admitted to and its priority class's value;
        what stops the asking (Kueue not installed, no rights, a class that does not exist) as the reason
        the job waits."""
        name, namespace = job.metadata.name, job.metadata.namespace
        asked = f"the job is labelled {kueue.QUEUE_LABEL}={kueue.queue_name(job)}"
        try:
            found = self.custom.list_namespaced_custom_object(
                kueue.GROUP, kueue.VERSION, namespace, "workloads", label_selector=f"{JOB_LABEL}={name}"
            )
        except ApiException as exc:
            if exc.status not in (403, 404):
                raise
            missing = ("Kueue's Workload API (kueue.x-k8s.io/v1beta2) is not installed" if exc.status == 404 else
                       "the operator may not use Workloads: install the chart with kueue.enabled=true")  # fmt: skip
            return kueue.Observed(error=("KueueUnavailable", f"{asked}, but {missing}; it starts once Kueue admits it"))
        slices = tuple(kueue.Slice.of(w) for w in found["items"])
        priority_class = job.metadata.labels.get(kueue.PRIORITY_LABEL)
        try:
            flavors = {f: self._kueue_object("resourceflavors", f)["spec"] for s in slices for f in s.flavors}
            priority = (
                self._kueue_object("workloadpriorityclasses", priority_class)["value"] if priority_class else None
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            message = f"{asked}: {api_errors.message(exc)}; create it, or correct {kueue.PRIORITY_LABEL}"
            return kueue.Observed(slices, error=("KueueObjectNotFound", message))
        return kueue.Observed(slices, flavors, priority)

    def _kueue_object(self, plural: str, name: str) -> dict[str, Any]:
        return self.custom.get_cluster_custom_object(kueue.GROUP, kueue.VERSION, plural, name)

    def write_workloads(self, namespace: str, writes: kueue.Writes, stamp: str) -> None:
        """The Workload writes: a create that exists, a delete that is gone and a status write that lost
        a race (409: someone wrote in between) count as done or wait for the next reconcile."""
        group, version, plural = kueue.GROUP, kueue.VERSION, "workloads"
        calls: list[Callable[[], Any]] = []
        if writes.create:
            calls.append(lambda: self.custom.create_namespaced_custom_object(group, version, namespace, plural,
                                                                             writes.create))  # fmt: skip
        if writes.count:
            name, count = writes.count
            patch = {"spec": {"podSets": [{"name": kueue.PODSET, "count": count}]}}
            calls.append(lambda: self.custom.patch_namespaced_custom_object(group, version, namespace, plural, name,
                                                                            patch))  # fmt: skip
        for name in writes.delete:
            calls.append(functools.partial(self.custom.delete_namespaced_custom_object, group, version, namespace,
                                           plural, name))  # fmt: skip
        bodies = [kueue.finished_status(f.slice, f.reason, f.message, stamp) for f in writes.finish]
        if writes.release:
            bodies.append(kueue.released_status(writes.release, stamp))
        for body in bodies:
            calls.append(functools.partial(self.custom.replace_namespaced_custom_object_status, group, version,
                                           namespace, plural, body["metadata"]["name"], body))  # fmt: skip
        for call in calls:
            try:
                call()
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise

    def pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        # The JSON as it came: the client's models cost more to build and turn back into dicts than the call.
        found = self.core.list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}={job}", _preload_content=False)
        return json.loads(found.data)["items"]


@dataclass
class Reconciled:
    changes: dict[str, Any] = field(default_factory=dict)
    """The status fields to patch (only those that changed)."""
    status: dict[str, Any] = field(default_factory=dict)
    """The whole status once they are patched."""
    decision: controller.Decision | None = None
    """The controller's decision, when it changed the number of workers."""


REJECTED = (403, 422)
"""What the API server answers to a pod it refuses (a quota, an admission policy, an invalid field):
reported on the job and retried, never raised, so a bad job cannot make the operator crash-loop."""


def reconcile(
    body: dict[str, Any],
    apis: Apis,
    settings: Settings,
    emit: Emit,
    nodes_changed: datetime.datetime | None = None,
    pods: list[dict[str, Any]] | None = None,
    share: Share | None = None,
) -> Reconciled:
    """Bring the job's objects one step closer to what it needs: observe, `plan`, `apply`, `account`.
    `nodes_changed` is when a node last offered more (a capacity-limited job then tries to grow at once
    instead of after the retry delay); `pods` the job's pods as a watch has them (listed from the API
    when not given); `share` the job's part of the accelerators the jobs share (`kube.sharing`)."""
    seen = dataclasses.replace(observe(body, apis, nodes_changed, pods), share=share)
    if kueue.queue_name(seen.job):
        seen = dataclasses.replace(seen, queue=apis.kueue(seen.job))
    actions = plan(seen, settings)
    if actions.check_claim:
        found = apis.claim_exists(body["metadata"]["namespace"], actions.check_claim)
        actions = plan(dataclasses.replace(seen, claim_found=found), settings)
    accounted = account(actions, apply(apis, actions))
    for event in accounted.events:
        emit(event.type, event.reason, event.message)
    old = dict(body.get("status") or {})
    changes = _changed(_document(seen.status), _document(accounted.status))
    return Reconciled(changes=changes, status=old | changes, decision=accounted.news)


def observe(
    body: dict[str, Any], apis: Apis, nodes_changed: datetime.datetime | None, pods: list[dict[str, Any]] | None
) -> Seen:
    """The job, its status and its pods. A watch can lag behind the pods this operator created a moment
    ago: before workers are started from none (a new rendezvous round), the API server itself is asked."""
    now, meta = timestamps.now(), body["metadata"]
    namespace, job = meta["namespace"], Names(meta["name"]).job
    if pods is None or not world.classify(workers_of(pods), now).live:
        pods = apis.pods(namespace, job)
    return Seen(
        job=LargeBatchJob.from_object(body),
        uid=meta["uid"],
        generation=meta.get("generation"),
        status=LargeBatchJobStatus.of(body),
        pods=pods,
        now=now,
        nodes_changed=nodes_changed,
    )


def apply(apis: Apis, actions: Actions) -> Outcome:
    """The actions' API calls, and what became of them: a 404 on delete and a 409 on create count as done
    (a restarted operator, or a reconcile that saw an old list); a refused pod stops its list."""
    deleted = frozenset(name for name in actions.delete if apis.delete_pod(actions.namespace, name))
    if actions.queue:
        apis.write_workloads(actions.namespace, actions.queue, actions.stamp)
    for obj in actions.objects:
        apis.create(obj)
    _, refused_rendezvous = _create_pods(apis, actions.rendezvous)
    created, refused_workers = _create_pods(apis, actions.workers)
    return Outcome(deleted, created, tuple(refused_rendezvous), tuple(refused_workers))


def _create_pods(apis: Apis, pods: tuple[dict[str, Any], ...]) -> tuple[int, list[tuple[str, str]]]:
    """Create pods in order until the API server refuses one: (how many were created, the refusal as
    [(reason, message)] or [])."""
    created = 0
    for pod in pods:
        try:
            created += apis.create(pod)
        except ApiException as exc:
            if exc.status not in REJECTED:
                raise
            return created, [("PodRejected", f"the API server refused pod {pod['metadata']['name']}: "
                                             f"{api_errors.message(exc)}")]  # fmt: skip
    return created, []


def _document(status: LargeBatchJobStatus) -> dict[str, Any]:
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def _changed(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The top-level status fields that differ (one gone is patched to null, which removes it)."""
    return {key: new.get(key) for key in old.keys() | new.keys() if old.get(key) != new.get(key)}
