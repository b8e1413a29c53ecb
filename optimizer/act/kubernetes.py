"""Kubernetes: the change that moves a Deployment, StatefulSet, Job or LeaderWorkerSet to other GPUs, as a patch
and as a manifest for ``kubectl apply -f``; with a kubeconfig, a server-side dry run (``dryRun=All``) and then
the patch.

What moves a workload: a node selector on ``nvidia.com/gpu.product``, the label NVIDIA's GPU feature discovery
puts on every GPU node (the product name with spaces as dashes, e.g. ``NVIDIA-H100-80GB-HBM3``; NVIDIA GPU
Operator docs, "GPU Feature Discovery"), rewritten too where a required node affinity names that label; the GPU
count in each container's ``resources.limits["nvidia.com/gpu"]`` (requests follow where set); and, where the
site maps hardware to Kueue queues, the ``kueue.x-k8s.io/queue-name`` label, whose LocalQueue's ClusterQueue
holds the target's ResourceFlavor. The patch is the difference between the object and its changed form as a JSON
merge patch (RFC 7386), which the API server also reads as a strategic merge patch for the built-in kinds; lists
it holds (containers, node selector terms) are given whole."""

from __future__ import annotations

import copy
import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agent.protocol import Recommendation
from optimizer.act.backend import Options, Proposal, Step
from optimizer.act.runner import Ran
from optimizer.act.settings import KubernetesSettings, pick
from optimizer.plan.render import kind_of

NAME = "kubernetes"
PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Kind:
    api_version: str
    plural: str
    templates: tuple[tuple[str, ...], ...]  # where its pod templates are
    content_type: str  # how its patch is sent

    def base(self, namespace: str) -> str:
        group = "api" if "/" not in self.api_version else f"apis/{self.api_version.split('/')[0]}"
        version = self.api_version.rsplit("/", 1)[-1]
        return f"/{group}/{version}/namespaces/{namespace}/{self.plural}"


_STRATEGIC = "application/strategic-merge-patch+json"
KINDS = {
    "Deployment": Kind("apps/v1", "deployments", (("spec", "template"),), _STRATEGIC),
    "StatefulSet": Kind("apps/v1", "statefulsets", (("spec", "template"),), _STRATEGIC),
    "Job": Kind("batch/v1", "jobs", (("spec", "template"),), _STRATEGIC),
    # a custom resource: the API server takes no strategic merge patch for it, only a JSON merge patch
    "LeaderWorkerSet": Kind(
        "leaderworkerset.x-k8s.io/v1",
        "leaderworkersets",
        (("spec", "leaderWorkerTemplate", "workerTemplate"), ("spec", "leaderWorkerTemplate", "leaderTemplate")),
        "application/merge-patch+json",
    ),
}
# what the API server fills in and a manifest must not carry back
_SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink")

# Names as controllers make them: a StatefulSet's pod ends in its ordinal; a Deployment's in
# <replica set hash>-<5 characters>; a Job's in 5 characters.
_ORDINAL = re.compile(r"^(.+)-\d+$")
_DEPLOYMENT_POD = re.compile(r"^(.+)-[bcdfghjklmnpqrstvwxz2456789]{6,10}-[bcdfghjklmnpqrstvwxz2456789]{5}$")
_JOB_POD = re.compile(r"^(.+)-[bcdfghjklmnpqrstvwxz2456789]{5}$")
# Names as the API server takes them (Kubernetes docs, "Object Names and IDs"): a namespace is a DNS-1123 label, a
# pod a DNS-1123 subdomain, a uid a UUID. A workload's name and owner come from a node, which may say anything; one
# with a "/" would put another object's path in a request and a shell's words in the printed kubectl line.
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_POD_NAME = re.compile(r"(?=.{1,253}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True, slots=True)
class Ref:
    kind: str
    namespace: str
    name: str

    @property
    def path(self) -> str:
        return f"{KINDS[self.kind].base(self.namespace)}/{self.name}"


def guess(pod: str, namespace: str) -> Ref:
    """The object a pod's name suggests owns it, where no API server can say."""
    if m := _DEPLOYMENT_POD.match(pod):
        return Ref("Deployment", namespace, m.group(1))
    if m := _ORDINAL.match(pod):
        return Ref("StatefulSet", namespace, m.group(1))
    if m := _JOB_POD.match(pod):
        return Ref("Job", namespace, m.group(1))
    return Ref("Deployment", namespace, pod)


@dataclass(frozen=True, slots=True)
class Change:
    product: str | None = None  # the nvidia.com/gpu.product value to select
    gpus: int | None = None  # GPUs per pod afterwards
    queue: str | None = None  # the Kueue LocalQueue


def _at(obj: Obj, path: tuple[str, ...], create: bool) -> Obj | None:
    here: Any = obj
    for key in path:
        if not isinstance(here, dict):
            return None
        if key not in here:
            if not create:
                return None
            here[key] = {}
        here = here[key]
    return here if isinstance(here, dict) else None


def changed(obj: Obj, change: Change) -> Obj:
    """``obj`` as it is once moved: a manifest for ``kubectl apply -f``, without the fields the server owns."""
    new = copy.deepcopy(obj)
    new.pop("status", None)
    meta = new.setdefault("metadata", {})
    for key in _SERVER_FIELDS:
        meta.pop(key, None)
    meta.get("annotations", {}).pop("kubectl.kubernetes.io/last-applied-configuration", None)
    kind = KINDS[new["kind"]]
    for n, path in enumerate(kind.templates):
        template = _at(new, path, create=n == 0)  # the first template always exists; an LWS leader's may not
        if template is None:
            continue
        spec = template.setdefault("spec", {})
        if change.product is not None:
            spec.setdefault("nodeSelector", {})[PRODUCT_LABEL] = change.product
            required = (spec.get("affinity") or {}).get("nodeAffinity", {})
            terms = (required.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms", [])
            for term in terms:
                for expr in term.get("matchExpressions", []):
                    if expr.get("key") == PRODUCT_LABEL:  # left alone, it would still demand the old product
                        expr["operator"], expr["values"] = "In", [change.product]
        if change.gpus is not None:
            for container in spec.get("containers", []):
                resources = container.get("resources") or {}
                for part in ("limits", "requests"):
                    if GPU_RESOURCE in (resources.get(part) or {}):
                        resources[part][GPU_RESOURCE] = str(change.gpus)
    if change.queue is not None:
        meta.setdefault("labels", {})[QUEUE_LABEL] = change.queue
    return new


def merge_patch(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``; None where nothing differs."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return None if old == new else new
    out: Obj = {}
    for key, value in new.items():
        if key not in old:
            out[key] = value
        elif (diff := merge_patch(old[key], value)) is not None:
            out[key] = diff
    for key in old:
        if key not in new and key != "status" and key not in _SERVER_FIELDS:
            out[key] = None
    return out or None


class KubeError(Exception):
    """A request the API server refused, or could not be sent: ``status`` is the HTTP status (None: not sent)."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def server_message(status: int | None, reason: str | None, body: str | bytes | None) -> str:
    """The API server's own words for a refusal: its Status object's code, reason and message."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else (body or "")
    try:
        payload = json.loads(text)
    except ValueError:
        payload = None
    if isinstance(payload, dict) and payload.get("kind") == "Status":
        status = payload.get("code", status)
        reason = payload.get("reason", reason)
        text = str(payload.get("message", ""))
    head = " ".join(str(p) for p in (status, reason) if p)
    return f"{head}: {text}".strip(": ") if text else head or "no answer"


class Api(Protocol):
    def get(self, path: str) -> Obj: ...

    def patch(self, path: str, body: Obj, content_type: str, dry_run: bool) -> Obj: ...


class ClientApi:
    """The API server, through the ``kubernetes`` client's ApiClient (``pip install 'fleetfit[kubernetes]'``)."""

    def __init__(self, kubeconfig: Path, context: str | None, timeout: float) -> None:
        from kubernetes import config

        self._client = config.new_client_from_config(config_file=str(kubeconfig), context=context)
        self._timeout = timeout

    def _call(self, method: str, path: str, body: Obj | None = None, content_type: str = "", dry: bool = False) -> Obj:
        from kubernetes.client import ApiException

        headers = {"Accept": "application/json", **({"Content-Type": content_type} if content_type else {})}
        try:
            response = self._client.call_api(
                path,
                method,
                query_params=[("dryRun", "All")] if dry else [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=self._timeout,
            )
        except ApiException as exc:
            raise KubeError(exc.status, server_message(exc.status, exc.reason, exc.body)) from None
        except Exception as exc:  # urllib3's connection and TLS errors: the server was not reached
            raise KubeError(None, f"{type(exc).__name__}: {exc}") from None
        try:
            data = json.loads(response.data or b"{}")
        except ValueError:  # a proxy's page (an expired login answered with HTML), not the API server's JSON
            said = bytes(response.data or b"")[:200].decode(errors="replace")
            raise KubeError(None, f"the answer to {method} {path} is not JSON: {said!r}") from None
        return data if isinstance(data, dict) else {}

    def get(self, path: str) -> Obj:
        return self._call("GET", path)

    def patch(self, path: str, body: Obj, content_type: str, dry_run: bool) -> Obj:
        return self._call("PATCH", path, body, content_type, dry_run)


def _pod(api: Api, namespace: str, name: str | None, uid: str | None) -> Obj:
    """The pod by its name, else by its uid among the namespace's pods (an agent knows a pod by its uid alone: the
    cgroup names nothing else)."""
    if name is not None:
        return api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    for item in api.get(f"/api/v1/namespaces/{namespace}/pods").get("items", []):
        if isinstance(item, dict) and (item.get("metadata") or {}).get("uid") == uid:
            return item
    raise KubeError(404, f"no pod with uid {uid} in namespace {namespace}")


def _owner(api: Api, obj: Obj, namespace: str) -> Ref:
    """The object to change for the pod ``obj``: its controller, followed up through ReplicaSets and an LWS's
    StatefulSets."""
    pod = (obj.get("metadata") or {}).get("name", "?")
    found: Ref | None = None
    for _ in range(4):  # pod → ReplicaSet → Deployment; pod → StatefulSet → LeaderWorkerSet
        refs = [r for r in obj.get("metadata", {}).get("ownerReferences", []) if r.get("controller")]
        kind, name = (refs[0].get("kind", ""), refs[0].get("name", "")) if refs else ("", "")
        if kind == "ReplicaSet":
            obj = api.get(f"/apis/apps/v1/namespaces/{namespace}/replicasets/{name}")
        elif kind in KINDS:
            found = Ref(kind, namespace, name)
            obj = api.get(found.path)
        else:
            break
    if found is None:
        raise KubeError(None, f"pod {namespace}/{pod} has no Deployment, StatefulSet, Job or LeaderWorkerSet")
    return found


def _call_step(text: str, fn: Callable[[], Obj]) -> Step:
    def call() -> Ran:
        try:
            fn()
        except KubeError as exc:
            return Ran((), exc.status if exc.status else None, exc.message)
        return Ran((), 0, "accepted")

    return Step(text, call=call)


class Kubernetes:
    """The Kubernetes backend of one site; ``api`` stands in for the server in tests."""

    name = NAME

    def __init__(self, settings: KubernetesSettings, api: Api | None = None) -> None:
        self.settings = settings
        self._api = api

    @property
    def api(self) -> Api | None:
        if self._api is None and self.settings.kubeconfig is not None:
            self._api = ClientApi(self.settings.kubeconfig, self.settings.context, self.settings.timeout)
        return self._api

    def change_of(self, rec: Recommendation) -> Change:
        gpus = None
        if rec.gpus_after is not None and round(rec.gpus_after) != rec.gpus and rec.gpus_after >= 1:
            gpus = round(rec.gpus_after)
        return Change(pick(self.settings.products, rec.to_hardware), gpus, pick(self.settings.queues, rec.to_hardware))

    def propose(self, rec: Recommendation, owner: str | None, options: Options) -> Proposal:
        kind = kind_of(rec)
        if kind in ("reclaim", "consolidate"):
            note = (
                "an idle allocation is released by its owner (scale down or delete it)"
                if kind == "reclaim"
                else "sharing a GPU (time-slicing, MPS or MIG) is set up on the node, not in the workload"
            )
            return Proposal(rec.id, NAME, runnable=False, note=note)
        namespace = owner or self.settings.namespace
        if namespace is None:
            note = "its namespace is not known: set [sites.*.kubernetes] namespace"
            return Proposal(rec.id, NAME, runnable=False, note=note)
        if not _NAMESPACE.fullmatch(namespace):
            return Proposal(rec.id, NAME, runnable=False, note=f"{namespace!r} is not a Kubernetes namespace")
        pod = rec.workload_name if _POD_NAME.fullmatch(rec.workload_name) else None
        uid = rec.workload.removeprefix("k8s/") if _UID.fullmatch(rec.workload.removeprefix("k8s/")) else None
        if pod is None and uid is None:
            note = f"{rec.workload_name!r} is not a pod's name, nor {rec.workload!r} a pod's uid"
            return Proposal(rec.id, NAME, runnable=False, note=note)
        change = self.change_of(rec)
        if change.product is None and change.queue is None and change.gpus is None:
            note = f"no GPU product label for {rec.to_hardware} in [sites.*.kubernetes] products"
            return Proposal(rec.id, NAME, runnable=False, note=note)
        notes = []
        api = self.api
        live: Obj | None = None
        if api is not None:
            try:
                ref = _owner(api, _pod(api, namespace, pod, uid), namespace)
                live = api.get(ref.path)
            except KubeError as exc:
                if pod is None:
                    note = f"read from the server failed ({exc.message}); the pod's name is not known to guess from"
                    return Proposal(rec.id, NAME, runnable=False, note=note)
                ref = guess(pod, namespace)
                notes.append(f"read from the server failed ({exc.message}); the object is guessed from the pod's name")
        elif pod is None:
            note = (
                f"the pod is known by its uid ({uid}) alone, as an agent reports it: with a kubeconfig "
                "([sites.*.kubernetes] kubeconfig) it is looked up on the server"
            )
            return Proposal(rec.id, NAME, runnable=False, note=note)
        else:
            ref = guess(pod, namespace)
            notes.append("no kubeconfig: the object is guessed from the pod's name and the manifest is partial")
        kinds = KINDS[ref.kind]
        from_server = live is not None
        if live is None:
            live = {"apiVersion": kinds.api_version, "kind": ref.kind, "metadata": {"name": ref.name}}
            live["metadata"]["namespace"] = namespace
            _at(live, kinds.templates[0], create=True)
            if change.gpus is not None:
                notes.append("the GPU count is set in the live object's containers, read with a kubeconfig")
        if change.queue is not None and QUEUE_LABEL not in live.get("metadata", {}).get("labels", {}):
            if from_server:  # the object is not in Kueue: a move does not put it there
                change = Change(change.product, change.gpus, None)
            else:
                notes.append(f"the Kueue queue is set to {change.queue}: leave it out if the workload is not in Kueue")
        moved = changed(live, change)
        patch = merge_patch(changed(live, Change()), moved) or {}
        manifest = json.dumps(moved, indent=2, sort_keys=True)
        text = json.dumps(patch, sort_keys=True, separators=(",", ":"))
        type_flag = "strategic" if kinds.content_type == _STRATEGIC else "merge"
        resource = f"{kinds.plural}.{kinds.api_version.split('/')[0]}"
        line = f"kubectl -n {namespace} patch {resource} {ref.name} --type={type_flag} -p {shlex.quote(text)}"
        if api is None:
            return Proposal(rec.id, NAME, (Step(line),), runnable=False, note="; ".join(notes), manifest=manifest)
        path = ref.path
        steps = (
            _call_step(f"{line} --dry-run=server", lambda: api.patch(path, patch, kinds.content_type, True)),
            _call_step(line, lambda: api.patch(path, patch, kinds.content_type, False)),
        )
        return Proposal(rec.id, NAME, steps, note="; ".join(notes), manifest=manifest)
