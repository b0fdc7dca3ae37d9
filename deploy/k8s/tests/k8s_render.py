"""Renders deploy/k8s's overlays for the checks in this directory.

render(overlay) copies deploy/k8s (as the test's runfiles or the source tree hold it) into a
temporary directory, dereferencing Bazel's symlinks (kustomize refuses files whose real path
lies outside the kustomization's root), runs `kubectl kustomize` there and returns the objects.
kubectl comes from $FERRY_KUBECTL or the PATH (kubectl 1.32, with kustomize 5.5, is what the
checks are written against). A missing kubectl or a failed render raises RenderError with
kubectl's own message. render_with(overlay, components) renders an overlay with more components
(components/planner-advice), as a user's kustomization over the overlay would;
render_including(overlay, components) with more components listed in the overlay's own
kustomization (components/encoder: the overlay's patches, the cpu overlay's model volume among
them, then apply to the component's objects too), as the overlays' commented lines suggest.
"""

import os
import shutil
import subprocess
import tempfile

import yaml

OVERLAYS = ("cpu", "gpu")
K8S_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RenderError(Exception):
    pass


def kubectl():
    path = os.environ.get("FERRY_KUBECTL") or shutil.which("kubectl")
    if not path:
        raise RenderError("kubectl is not on the PATH (./ferry setup installs it; "
                          "or set FERRY_KUBECTL)")
    return path


_copy = None


def _tree():
    """deploy/k8s copied once per process, symlinks resolved."""
    global _copy
    if _copy is None:
        _copy = os.path.join(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")), "k8s")
        shutil.copytree(K8S_DIR, _copy, symlinks=False)
    return _copy


def render_dir(path):
    """The objects `kubectl kustomize PATH` outputs (PATH relative to deploy/k8s)."""
    out = subprocess.run([kubectl(), "kustomize", os.path.join(_tree(), path)],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RenderError("kubectl kustomize %s failed:\n%s" % (path, out.stderr.strip()))
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def render(overlay):
    return render_dir(os.path.join("overlays", overlay))


def render_with(overlay, components):
    """An overlay's objects with more components applied (paths relative to deploy/k8s), as a user's
    kustomization over it would: `resources: [overlay]`, `components: [...]`."""
    name = "%s+%s" % (overlay, "+".join(os.path.basename(c) for c in components))
    directory = os.path.join(_tree(), "variants", name)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "kustomization.yaml"), "w", encoding="utf-8") as f:
        yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": ["../../overlays/" + overlay],
            "components": ["../../" + c for c in components]}, f)
    return render_dir(os.path.join("variants", name))


def render_including(overlay, components):
    """An overlay's objects with more components listed in its own kustomization (paths relative to
    deploy/k8s), as uncommenting its `# - ../../components/...` line does: a copy of the overlay
    beside it (overlays/OVERLAY+NAMES), so that its relative paths hold."""
    name = "%s+%s" % (overlay, "+".join(os.path.basename(c) for c in components))
    directory = os.path.join(_tree(), "overlays", name)
    if not os.path.isdir(directory):
        shutil.copytree(os.path.join(_tree(), "overlays", overlay), directory)
        path = os.path.join(directory, "kustomization.yaml")
        with open(path, encoding="utf-8") as f:
            kustomization = yaml.safe_load(f)
        kustomization.setdefault("components", []).extend("../../" + c for c in components)
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(kustomization, f)
    return render_dir(os.path.join("overlays", name))


def load(path):
    """The objects of one YAML file of deploy/k8s (an optional component's own file)."""
    with open(os.path.join(K8S_DIR, path), encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def name(obj):
    return "%s/%s" % (obj["kind"], obj["metadata"]["name"])
