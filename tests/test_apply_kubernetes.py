"""The Kubernetes backend of `fleetfit apply`: the manifests it writes checked against the `kubernetes` client's
models, its patches against the objects they change, and its calls against a stand-in for the API server that
answers as one does (dry run first; 409, 422 and 403 recorded as failed with the server's message)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from apply_recs import k8s_move

from agent.protocol import Recommendation
from optimizer.act.backend import Options, Status, carry_out
from optimizer.act.kubernetes import (
    GPU_RESOURCE,
    PRODUCT_LABEL,
    QUEUE_LABEL,
    Change,
    ClientApi,
    Kubernetes,
    changed,
    merge_patch,
)
from optimizer.act.settings import KubernetesSettings

kubernetes = pytest.importorskip("kubernetes", reason="pip install 'fleetfit[test]' (the kubernetes client)")
from kubernetes.client import ApiClient, ApiException  # noqa: E402

H100 = "NVIDIA-H100-80GB-HBM3"  # GPU feature discovery's nvidia.com/gpu.product on an H100 SXM node
L40S = "NVIDIA-L40S"
SETTINGS = KubernetesSettings(
    products={"H100 80GB": H100, "L40S 48GB": L40S}, queues={"L40S 48GB": "l40s-queue"}, namespace="ml"
)


def pod_template(gpus: int = 2) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "chat"}},
        "spec": {
            "nodeSelector": {PRODUCT_LABEL: H100, "kubernetes.io/os": "linux"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": PRODUCT_LABEL, "operator": "In", "values": [H100]}]}
                        ]
                    }
                }
            },
            "containers": [
                {"name": "sidecar", "image": "envoy:1.30"},
                {
                    "name": "server",
                    "image": "vllm/vllm-openai:v0.6.0",
                    "resources": {
                        "limits": {GPU_RESOURCE: str(gpus), "cpu": "8"},
                        "requests": {GPU_RESOURCE: str(gpus)},
                    },
                },
            ],
        },
    }


def deployment() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat", "namespace": "ml", "uid": "1234", "resourceVersion": "77", "generation": 3},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "chat"}}, "template": pod_template()},
        "status": {"replicas": 2},
    }


def job() -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "embed", "namespace": "ml", "labels": {QUEUE_LABEL: "h100-queue"}},
        "spec": {
            "suspend": True,
            "template": {**pod_template(1), "spec": {**pod_template(1)["spec"], "restartPolicy": "Never"}},
        },
    }


def lws() -> dict[str, Any]:
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "llama", "namespace": "ml"},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {"size": 2, "leaderTemplate": pod_template(), "workerTemplate": pod_template()},
        },
    }


def rec(kind: str = "move", gpus_after: float | None = None) -> Recommendation:
    return k8s_move(kind=kind, gpus_after=gpus_after)


@dataclass
class Response:
    data: bytes


def model(obj: dict[str, Any], kind: str) -> Any:
    """``obj`` read into the client's model, as the client reads an API server's answer."""
    # the step after parsing the JSON, the same in every client version (the public deserialize() changed its
    # arguments in v35)
    return ApiClient()._ApiClient__deserialize(json.loads(json.dumps(obj)), kind)


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, to check that a patch turns the live object into the manifest."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out


def test_deployment_manifest_is_a_valid_deployment_on_the_target() -> None:
    """The manifest reads as a V1Deployment selecting the L40S by product label and affinity, with one GPU per pod
    once right-sized, and none of the server's fields (deliberate bug caught: the affinity left naming the H100,
    which keeps the pods where they are)."""
    moved = changed(deployment(), Change(product=L40S, gpus=1))
    d = model(moved, "V1Deployment")
    assert (d.metadata.name, d.metadata.namespace, d.spec.selector.match_labels) == ("chat", "ml", {"app": "chat"})
    spec = d.spec.template.spec
    assert spec.node_selector == {PRODUCT_LABEL: L40S, "kubernetes.io/os": "linux"}
    (term,) = spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    assert [(e.key, e.values) for e in term.match_expressions] == [(PRODUCT_LABEL, [L40S])]
    server = next(c for c in spec.containers if c.name == "server")
    assert server.resources.limits == {GPU_RESOURCE: "1", "cpu": "8"}
    assert server.resources.requests == {GPU_RESOURCE: "1"}
    assert d.metadata.resource_version is None and d.metadata.uid is None and d.status is None


def test_patch_turns_the_live_object_into_the_manifest() -> None:
    """The merge patch holds only what moves the workload, and applied to the live object gives the manifest
    (deliberate bug caught: a required node affinity on the product label left as it was, so the patch lacks it and
    the pods must still land on an H100)."""
    live = deployment()
    moved = changed(live, Change(product=L40S, gpus=1))
    patch = merge_patch(changed(live, Change()), moved)
    assert set(patch["spec"]) == {"template"}
    assert set(patch["spec"]["template"]["spec"]) == {"nodeSelector", "affinity", "containers"}
    assert patch["spec"]["template"]["spec"]["nodeSelector"] == {PRODUCT_LABEL: L40S}
    assert apply_merge_patch(changed(live, Change()), patch) == moved


def test_job_moves_to_the_target_queue_and_lws_moves_leader_and_workers() -> None:
    """A Job's Kueue queue label names the target's queue and it stays a valid V1Job; a LeaderWorkerSet's leader and
    worker templates both select the target (deliberate bug caught: only the worker template changed, which leaves
    the leader on the H100)."""
    j = model(changed(job(), Change(product=L40S, queue="l40s-queue")), "V1Job")
    assert j.metadata.labels == {QUEUE_LABEL: "l40s-queue"}
    assert j.spec.template.spec.node_selector[PRODUCT_LABEL] == L40S
    assert j.spec.template.spec.restart_policy == "Never"
    moved = changed(lws(), Change(product=L40S))
    templates = moved["spec"]["leaderWorkerTemplate"]
    for part in ("leaderTemplate", "workerTemplate"):
        pod = model({"metadata": {"name": "x"}, "spec": templates[part]["spec"]}, "V1Pod")
        assert pod.spec.node_selector[PRODUCT_LABEL] == L40S
        assert [c.name for c in pod.spec.containers] == ["sidecar", "server"]
    assert (moved["apiVersion"], moved["kind"], moved["metadata"]["name"]) == (
        "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "llama",
    )  # fmt: skip


@dataclass
class FakeApiClient:
    """Answers as an API server does: the objects it holds, and for a PATCH the error it is told to give."""

    objects: dict[str, dict[str, Any]]
    fail: tuple[int, str, str] | None = None  # (status, reason, message) for PATCH
    calls: list[tuple[str, str, tuple[tuple[str, str], ...], str]] = field(default_factory=list)
    bodies: list[Any] = field(default_factory=list)

    def call_api(self, path: str, method: str, **kw: Any) -> Response:
        query = tuple(kw.get("query_params") or ())
        self.calls.append((method, path, query, kw.get("header_params", {}).get("Content-Type", "")))
        self.bodies.append(kw.get("body"))
        if method == "PATCH" and self.fail is not None:
            status, reason, message = self.fail
            exc = ApiException(status=status, reason=reason)
            exc.body = json.dumps(
                {"kind": "Status", "status": "Failure", "code": status, "reason": reason, "message": message}
            )
            raise exc
        if path not in self.objects:
            exc = ApiException(status=404, reason="Not Found")
            exc.body = json.dumps({"kind": "Status", "code": 404, "reason": "NotFound", "message": f"{path} not found"})
            raise exc
        return Response(json.dumps(self.objects[path] if method == "GET" else {}).encode())


def server(fail: tuple[int, str, str] | None = None) -> tuple[Kubernetes, FakeApiClient]:
    pod = {"metadata": {"name": rec().workload_name, "ownerReferences": [
        {"kind": "ReplicaSet", "name": "chat-7d9c5b6f4d", "controller": True}]}}  # fmt: skip
    rs = {
        "metadata": {
            "name": "chat-7d9c5b6f4d",
            "ownerReferences": [{"kind": "Deployment", "name": "chat", "controller": True}],
        }
    }
    fake = FakeApiClient(
        {
            f"/api/v1/namespaces/ml/pods/{rec().workload_name}": pod,
            "/apis/apps/v1/namespaces/ml/replicasets/chat-7d9c5b6f4d": rs,
            "/apis/apps/v1/namespaces/ml/deployments/chat": deployment(),
        },
        fail,
    )
    api = ClientApi.__new__(ClientApi)
    api._client, api._timeout = fake, 5.0
    return Kubernetes(SETTINGS, api), fake


def test_with_a_server_the_patch_is_dry_run_then_sent() -> None:
    """The pod's owner is found through its ReplicaSet; the patch goes first with dryRun=All, then for real, as a
    strategic merge patch; a Deployment Kueue does not manage is not put in a queue (deliberate bugs caught: the
    dry run skipped, which sends an unchecked change; the site's queue label added to any object moved)."""
    backend, fake = server()
    proposal = backend.propose(rec(), "ml", Options())
    assert proposal.runnable
    result = carry_out(proposal)
    assert result.status == Status.APPLIED, result.output
    patches = [(q, ct) for method, path, q, ct in fake.calls if method == "PATCH"]
    assert patches == [
        ((("dryRun", "All"),), "application/strategic-merge-patch+json"),
        ((), "application/strategic-merge-patch+json"),
    ]
    assert all(path == "/apis/apps/v1/namespaces/ml/deployments/chat" for m, path, _, _ in fake.calls if m == "PATCH")
    assert json.loads(proposal.manifest)["spec"]["template"]["spec"]["nodeSelector"][PRODUCT_LABEL] == L40S
    sent = fake.bodies[-1]["spec"]["template"]["spec"]
    assert sent["nodeSelector"] == {PRODUCT_LABEL: L40S}  # the one key that changed; the others stay the server's
    assert "metadata" not in fake.bodies[-1]  # not in Kueue on the server: a move does not put it in a queue


@pytest.mark.parametrize(
    ("status", "reason", "message"),
    [
        (409, "Conflict", 'Operation cannot be fulfilled on deployments.apps "chat": the object has been modified'),
        (
            422,
            "Invalid",
            'Deployment.apps "chat" is invalid: spec.template.spec.containers[1].resources.limits: Invalid value',
        ),
        (403, "Forbidden", 'deployments.apps "chat" is forbidden: User "fleetfit" cannot patch resource "deployments"'),
    ],
)
def test_server_refusals_are_recorded_failed_with_its_message(status: int, reason: str, message: str) -> None:
    """A refused dry run stops the change: failed, with the server's status, reason and message, and no real patch
    sent (deliberate bug caught: the server's body dropped, which leaves only "Conflict" in the record)."""
    backend, fake = server((status, reason, message))
    result = carry_out(backend.propose(rec(), "ml", Options()))
    assert result.status == Status.FAILED
    assert f"{status} {reason}: {message}" in result.output
    assert [q for m, _, q, _ in fake.calls if m == "PATCH"] == [(("dryRun", "All"),)]


def test_without_a_kubeconfig_the_change_is_printed_not_run() -> None:
    """No kubeconfig: the Deployment is named from its pod's name, the patch printed as a kubectl command, nothing
    run (deliberate bug caught: the Deployment's name taken with the replica set hash, which names no object)."""
    proposal = Kubernetes(SETTINGS).propose(rec(), None, Options())
    assert not proposal.runnable
    (command,) = proposal.commands
    assert command.startswith("kubectl -n ml patch deployments.apps chat --type=strategic -p ")
    assert "guessed" in proposal.note
    assert json.loads(proposal.manifest)["spec"]["template"]["spec"]["nodeSelector"] == {PRODUCT_LABEL: L40S}
    assert carry_out(proposal).status == Status.NOTIFIED


def test_live_object_is_not_changed_in_place() -> None:
    """The object read from the server stays as it was (the patch is computed against it)."""
    live = deployment()
    before = copy.deepcopy(live)
    changed(live, Change(product=L40S, gpus=1, queue="q"))
    assert live == before


UID = "0b6f7c2e-8d1a-4c3b-9e5f-2a7d4c1b8e90"


def test_a_pod_an_agent_knows_by_its_uid_is_found_among_the_namespaces_pods() -> None:
    """An agent names a pod "pod <uid>" (its cgroup holds nothing else): with a server the pod is found by its uid
    and its Deployment patched; without one nothing is offered to run (deliberate bug caught: "pod <uid>" taken as
    the pod's name, which no server holds, so a Deployment of that name is guessed and patched)."""
    backend, fake = server()
    pod = fake.objects[f"/api/v1/namespaces/ml/pods/{rec().workload_name}"]
    other = {"metadata": {"name": "chat-7d9c5b6f4d-q8q8q", "uid": "11111111-2222-4333-8444-555555555555"}}
    fake.objects["/api/v1/namespaces/ml/pods"] = {
        "items": [other, {**pod, "metadata": {**pod["metadata"], "uid": UID}}]
    }
    agent_rec = k8s_move(workload=f"k8s/{UID}", workload_name=f"pod {UID}")
    result = carry_out(backend.propose(agent_rec, "ml", Options()))
    assert result.status == Status.APPLIED, result.output
    assert {path for m, path, _, _ in fake.calls if m == "PATCH"} == {"/apis/apps/v1/namespaces/ml/deployments/chat"}
    offline = Kubernetes(SETTINGS).propose(agent_rec, "ml", Options())
    assert not offline.runnable and offline.commands == [] and UID in offline.note


@pytest.mark.parametrize(
    ("name", "owner"),
    [("x/../../../kube-system/deployments/coredns", "ml"), ("chat-7d9c5b6f4d-x2x4z", "ml/../kube-system")],
)
def test_a_name_a_node_made_up_is_never_sent_nor_printed_to_run(name: str, owner: str) -> None:
    """A pod name or namespace with a "/" (a node says what it likes) sends nothing to the server and offers no
    kubectl line (deliberate bug caught: the name put in the request's path unchecked, which patches another
    namespace's object once the server has normalised the path)."""
    backend, fake = server()
    proposal = backend.propose(k8s_move(workload_name=name), owner, Options())
    assert not proposal.runnable and proposal.commands == [] and fake.calls == []
    assert carry_out(proposal).status == Status.NOTIFIED


def test_an_answer_that_is_not_json_is_recorded_failed_not_raised() -> None:
    """A proxy in front of the API server answering with an HTML login page: the step is recorded failed with
    what it said, and nothing after it runs (deliberate bug caught: the JSON error raised out of the step, which
    ends `fleetfit apply --execute` with a traceback and keeps no record of the run)."""
    backend, fake = server()
    proposal = backend.propose(rec(), "ml", Options())
    answer = fake.call_api

    def login_page(path: str, method: str, **kw: Any) -> Response:
        answer(path, method, **kw)
        return Response(b"<html><title>Sign in</title></html>")

    fake.call_api = login_page  # type: ignore[method-assign]
    result = carry_out(proposal)
    assert result.status == Status.FAILED
    assert "is not JSON: '<html><title>Sign in</title></html>'" in result.output
    assert [q for m, _, q, _ in fake.calls if m == "PATCH"] == [(("dryRun", "All"),)]
