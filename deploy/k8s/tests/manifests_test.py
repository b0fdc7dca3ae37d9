"""deploy/k8s renders and validates.

Every overlay renders with `kubectl kustomize`; every object with a Kubernetes schema passes
kubernetes-validate --strict against Kubernetes 1.32 (unknown fields are errors); the
Prometheus Operator's objects (ServiceMonitor, PrometheusRule) pass the JSON schemas kept in
deploy/k8s/schemas; an object of any other kind fails (its schema would be missing). The
optional Ingress component is validated on its own, each overlay with the planner's advice
component (HPAs instead of the planner's own scaling), and each with the encoder pool
(components/encoder listed among its components: the encoder's objects, the router told where
they are, the router's and workers' model the vision model; its configuration files are the
base's with only the model changed). Each validator is also shown a broken
object, so that a validator that accepts everything fails the test.
"""

import copy
import json
import os
import sys
import unittest

import jsonschema
import kubernetes_validate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_render  # noqa: E402

KUBERNETES_VERSION = "1.32.0"
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.schema.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule.schema.json",
}


def crd_schema(obj):
    file = CRD_SCHEMAS.get((obj.get("apiVersion"), obj.get("kind")))
    if file is None:
        return None
    with open(os.path.join(k8s_render.K8S_DIR, "schemas", file), encoding="utf-8") as f:
        return json.load(f)


def problems(obj):
    """What is wrong with one object, [] when it validates."""
    schema = crd_schema(obj)
    if schema is not None:
        v = jsonschema.Draft7Validator(schema)
        return ["%s: %s at %s" % (k8s_render.name(obj), e.message, "/".join(map(str, e.path)))
                for e in v.iter_errors(obj)]
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return ["%s: no schema for %s %s (Kubernetes %s or deploy/k8s/schemas)" %
                (k8s_render.name(obj), obj.get("apiVersion"), obj.get("kind"), KUBERNETES_VERSION)]
    except kubernetes_validate.ValidationError as e:
        return ["%s: %s at %s" % (k8s_render.name(obj), e.message, "/".join(map(str, e.path)))]
    return []


class ManifestsTest(unittest.TestCase):

    def test_overlays_render_and_validate(self):
        for overlay in k8s_render.OVERLAYS:
            with self.subTest(overlay=overlay):
                objects = k8s_render.render(overlay)
                kinds = {o["kind"] for o in objects}
                for kind in ("Deployment", "StatefulSet", "Service", "PodDisruptionBudget",
                             "NetworkPolicy", "ConfigMap", "Secret", "ServiceMonitor",
                             "PrometheusRule", "Namespace", "ServiceAccount", "Role",
                             "RoleBinding"):
                    self.assertIn(kind, kinds)
                found = [p for o in objects for p in problems(o)]
                self.assertEqual(found, [], "\n".join(found))

    def test_planner_advice_variant_renders_and_validates(self):
        for overlay in k8s_render.OVERLAYS:
            with self.subTest(overlay=overlay):
                objects = k8s_render.render_with(overlay, ["components/planner-advice"])
                hpas = sorted(o["metadata"]["name"] for o in objects
                              if o["kind"] == "HorizontalPodAutoscaler")
                self.assertEqual(hpas, ["ferry-decode", "ferry-prefill"])
                self.assertFalse([o for o in objects if o["kind"] in ("Role", "RoleBinding")])
                found = [p for o in objects for p in problems(o)]
                self.assertEqual(found, [], "\n".join(found))

    def test_encoder_variant_renders_and_validates(self):
        for overlay in k8s_render.OVERLAYS:
            with self.subTest(overlay=overlay):
                objects = k8s_render.render_including(overlay, ["components/encoder"])
                by_name = {k8s_render.name(o): o for o in objects}
                for kind in ("Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"):
                    self.assertIn(kind + "/ferry-encoder", by_name)
                router = by_name["Deployment/ferry-router"]["spec"]["template"]["spec"]
                self.assertIn("--encoders_dns=ferry-encoder:7600", router["containers"][0]["args"])
                configs = [o for o in objects if o["kind"] == "ConfigMap" and
                           o["metadata"]["name"].startswith(("ferry-router-config",
                                                             "ferry-worker-config"))]
                self.assertEqual(len(configs), 2)
                for cm in configs:
                    for key, text in cm["data"].items():
                        self.assertEqual(json.loads(text)["model"], "/models/llava", key)
                encoder = by_name["Deployment/ferry-encoder"]["spec"]["template"]["spec"]
                models = [v for v in encoder["volumes"] if v["name"] == "models"][0]
                # The overlay's model volume (cpu: the node's directory; gpu: the PVC).
                self.assertIn("hostPath" if overlay == "cpu" else "persistentVolumeClaim", models)
                found = [p for o in objects for p in problems(o)]
                self.assertEqual(found, [], "\n".join(found))

    def test_encoder_config_is_the_base_with_the_vision_model(self):
        for name in ("router", "prefill", "decode"):
            with self.subTest(config=name):
                files = [os.path.join(k8s_render.K8S_DIR, d, "config", name + ".json")
                         for d in ("base", "components/encoder")]
                base, encoder = [json.load(open(f, encoding="utf-8")) for f in files]
                changed = {k for k in set(base) | set(encoder) if base.get(k) != encoder.get(k)}
                self.assertLessEqual(changed, {"model", "served_model_name"})
                self.assertEqual(encoder["model"], "/models/llava")

    def test_readme_init_container_variant_validates(self):
        # deploy/k8s/README.md's fetch-model init container over the cpu overlay (the fixture
        # policy_test also runs its checks on).
        objects = k8s_render.render_dir("tests/testdata/model-init-container")
        inits = [o for o in objects if o["kind"] == "Deployment" and
                 o["spec"]["template"]["spec"].get("initContainers")]
        self.assertEqual(sorted(o["metadata"]["name"] for o in inits),
                         ["ferry-decode", "ferry-prefill", "ferry-router"])
        for o in inits:
            models = [v for v in o["spec"]["template"]["spec"]["volumes"] if v["name"] == "models"]
            self.assertEqual(sorted(k for k in models[0] if k != "name"), ["emptyDir"])
        found = [p for o in objects for p in problems(o)]
        self.assertEqual(found, [], "\n".join(found))

    def test_ingress_component_validates(self):
        objects = k8s_render.load("components/ingress/ingress.yaml")
        self.assertEqual([o["kind"] for o in objects], ["Ingress"])
        found = [p for o in objects for p in problems(o)]
        self.assertEqual(found, [], "\n".join(found))

    def test_validators_reject_broken_objects(self):
        objects = {k8s_render.name(o): o for o in k8s_render.render("cpu")}
        deployment = copy.deepcopy(objects["Deployment/ferry-decode"])
        deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}  # typo
        self.assertNotEqual(problems(deployment), [])
        monitor = copy.deepcopy(objects["ServiceMonitor/ferry"])
        monitor["spec"]["endpoints"][0]["intervall"] = "15s"
        self.assertNotEqual(problems(monitor), [])
        rule = copy.deepcopy(objects["PrometheusRule/ferry"])
        rule["spec"]["groups"][1]["rules"][0]["for"] = "2 minutes"
        self.assertNotEqual(problems(rule), [])
        unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
        self.assertNotEqual(problems(unknown), [])


if __name__ == "__main__":
    unittest.main()
