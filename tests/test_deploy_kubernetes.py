"""deploy/kubernetes validated offline (no API server can run here): the Dask operator's
custom resources against the CRD schemas that the dask-kubernetes wheel ships, their pod
specs and the standard resources with kubernetes-validate, and the job's command with
dnomad's own argument parser."""
import importlib.util
import os
import re
import shlex
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[1]
KUBE = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.30"
MANIFESTS = sorted(KUBE.glob("*.yaml"))


def crd_schema(kind):
    """openAPIV3Schema of the operator's CRD for ``kind``, read from the installed
    dask-kubernetes files (the package is not imported: its runtime dependencies are
    not needed here)."""
    spec = importlib.util.find_spec("dask_kubernetes")
    if spec is None:
        pytest.fail("dask-kubernetes is not installed: the README's test command installs it "
                    "(pip install --no-deps dask-kubernetes==2026.3.0)")
    crds = Path(list(spec.submodule_search_locations)[0]) / "operator" / "deployment" / "helm" / \
        "dask-kubernetes-operator" / "crds"
    for path in crds.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
            return version["schema"]["openAPIV3Schema"]
    pytest.fail(f"no CRD for {kind} in {crds}")


def unknown_fields(obj, schema, path="$"):
    """Keys the (structural) schema does not declare: the API server would drop them
    silently, so a typo such as ``resource:`` would go unnoticed."""
    out = []
    if isinstance(obj, dict) and schema.get("type") == "object":
        props = schema.get("properties")
        if props is None or schema.get("x-kubernetes-preserve-unknown-fields"):
            extra = schema.get("additionalProperties")
            if isinstance(extra, dict):
                for k, v in obj.items():
                    out += unknown_fields(v, extra, f"{path}.{k}")
            return out
        for k, v in obj.items():
            if k not in props:
                out.append(f"{path}.{k}")
            else:
                out += unknown_fields(v, props[k], f"{path}.{k}")
    elif isinstance(obj, list) and "items" in schema:
        for i, v in enumerate(obj):
            out += unknown_fields(v, schema["items"], f"{path}[{i}]")
    return out


def nulls(obj, path="$"):
    if obj is None:
        return [path]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in nulls(v, f"{path}.{k}")]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in nulls(v, f"{path}[{i}]")]
    return []


def pod_specs(doc):
    """(where, PodSpec) for every pod a Dask resource starts."""
    if doc["kind"] == "DaskJob":
        yield "job", doc["spec"]["job"]["spec"]
        cluster = doc["spec"]["cluster"]["spec"]
    else:
        cluster = doc["spec"]
    yield "scheduler", cluster["scheduler"]["spec"]
    yield "worker", cluster["worker"]["spec"]


def load(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs, f"{path.name} is empty"
    return docs


def test_there_are_manifests():
    assert {p.name for p in MANIFESTS} >= {"daskjob.yaml", "daskcluster.yaml", "storage-secret.yaml"}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates(path):
    for doc in load(path):
        assert not nulls(doc), f"{path.name}: null values (e.g. 'env: null') at {nulls(doc)}"
        if doc["apiVersion"].startswith("kubernetes.dask.org/"):
            schema = crd_schema(doc["kind"])
            jsonschema.validate({k: v for k, v in doc.items() if k != "metadata"}, schema)
            assert not unknown_fields(doc["spec"], schema["properties"]["spec"], "$.spec")
            for where, spec in pod_specs(doc):
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"check-{where}"},
                       "spec": spec}
                kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("path", [KUBE / "daskjob.yaml", KUBE / "daskcluster.yaml"], ids=lambda p: p.name)
def test_resources_are_strings_and_the_scheduler_stays_inside(path):
    (doc,) = load(path)
    for where, spec in pod_specs(doc):
        for c in spec["containers"]:
            for kind in ("requests", "limits"):
                for name, val in c.get("resources", {}).get(kind, {}).items():
                    assert isinstance(val, str), f"{where} {kind}.{name} = {val!r}: quote it"
            assert not re.search(r"(?i)secret_access_key|password", str(c.get("env", ""))), \
                "credentials belong in a Secret, not in the manifest"
    cluster = doc["spec"]["cluster"]["spec"] if doc["kind"] == "DaskJob" else doc["spec"]
    assert cluster["scheduler"]["service"]["type"] == "ClusterIP"


def test_daskjob_runs_dnomad_fit_with_documented_arguments():
    from dnomad.cli import build_parser

    (doc,) = load(KUBE / "daskjob.yaml")
    (container,) = doc["spec"]["job"]["spec"]["containers"]
    argv = container.get("command", []) + container["args"]
    assert argv[0] == "dnomad"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "fit" and args.method in ("nomad", "symnmf", "hottopixx")
    assert args.store.startswith("s3://") and args.input.startswith("s3://")
    assert args.n_clusters >= 2 and args.backend == "distributed"
    # No scheduler flag: the job pod connects through DASK_SCHEDULER_ADDRESS (set by the operator).
    assert args.scheduler_address is None and args.scheduler_file is None
    assert {"secretRef": {"name": "dnomad-storage"}} in container["envFrom"]


def test_readme_commands_use_the_tested_files():
    readme = (KUBE / "README.md").read_text()
    applied = re.findall(r"kubectl apply[^\n]*?-f ([\w./-]+\.yaml)", readme)
    assert applied, "the README shows no kubectl apply"
    for target in applied:
        assert (ROOT / target).resolve() in {p.resolve() for p in MANIFESTS}, target
    for line in re.findall(r"^\s*dnomad (?:fit|info|resume)[^\n]*", readme, flags=re.M):
        from dnomad.cli import build_parser

        build_parser().parse_args(shlex.split(line.strip())[1:])


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_dockerfiles_copy_files_that_exist(name):
    text = (KUBE / name).read_text()
    copies = re.findall(r"^COPY\s+(.+)$", text, flags=re.M)
    assert copies
    for line in copies:
        *sources, _ = line.split()
        for src in sources:
            assert (ROOT / src).exists(), f"{name}: COPY {src} (the build context is the repository root)"
    assert re.search(r"^USER\s+1000", text, flags=re.M), "the image should not run as root"
    assert os.path.exists(ROOT / "pyproject.toml")


def test_the_checks_catch_broken_manifests():
    """The same checks on damaged copies of daskjob.yaml: a misspelt field, a null env,
    a pod spec without containers, an unquoted limit."""
    import copy

    (doc,) = load(KUBE / "daskjob.yaml")
    schema = crd_schema("DaskJob")
    bad = copy.deepcopy(doc)
    bad["spec"]["cluster"]["spec"]["worker"]["spec"]["containers"][0]["resource"] = {}
    assert unknown_fields(bad["spec"], schema["properties"]["spec"], "$.spec") == [
        "$.spec.cluster.spec.worker.spec.containers[0].resource"]
    bad = copy.deepcopy(doc)
    bad["spec"]["job"]["spec"]["containers"][0]["env"] = None
    assert nulls(bad) == ["$.spec.job.spec.containers[0].env"]
    bad = copy.deepcopy(doc)
    del bad["spec"]["cluster"]["spec"]["worker"]["spec"]["containers"]
    with pytest.raises(Exception):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w"},
                                      "spec": bad["spec"]["cluster"]["spec"]["worker"]["spec"]},
                                     K8S_VERSION, strict=True)
    bad = copy.deepcopy(doc)
    bad["spec"]["cluster"]["spec"]["worker"]["replicas"] = "four"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({k: v for k, v in bad.items() if k != "metadata"}, schema)
