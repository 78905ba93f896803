#!/usr/bin/env python3
"""Offline validation of kvcached's Kubernetes manifests.

  validate_manifests.py --pb-dir DIR --k8s-version 1.32.0 RENDERED.yaml [...]
      RENDERED.yaml: the output of `kubectl kustomize` for one overlay (or the base).
  validate_manifests.py --pb-dir DIR --k8s-version 1.32.0 --kustomize-dir deploy/k8s/base
      No kubectl: assemble the base's own resources and configMapGenerator files directly.

Checks, per rendering:
  * every built-in object against the Kubernetes OpenAPI schemas shipped by the PyPI package
    kubernetes-validate (strict: unknown fields are errors);
  * ServiceMonitor (a CRD, no schema there) by a small check of the fields Prometheus Operator
    needs;
  * the objects agree with each other and with kvcached: selectors match pod labels, the
    StatefulSet's serviceName is a headless Service, ServiceMonitor and Service ports exist, the
    --config file is mounted from an existing ConfigMap key, listen ports = container ports =
    probe port, terminationGracePeriodSeconds > --shutdown_grace_seconds, host pools fit the
    memory limit, CUDA pools come with nvidia.com/gpu;
  * the ConfigMap's config parses as kvcache.v1.ServerConfig (protoc-generated Python from
    proto/kvcache/v1/config.proto, in --pb-dir).
Needs PyYAML, kubernetes-validate and protobuf (tests/deploy/make_venv.sh).
"""
import argparse
import os
import re
import sys

import kubernetes_validate
import yaml

problems = []


def problem(where, msg):
    problems.append(f"{where}: {msg}")


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def kustomize_dir_docs(path):
    """The base without kubectl: its resources plus configMapGenerator ConfigMaps (no hash)."""
    with open(os.path.join(path, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    docs = []
    for r in k.get("resources", []):
        docs += load_docs(os.path.join(path, r))
    for g in k.get("configMapGenerator", []):
        data = {}
        for spec in g.get("files", []):
            key, _, file = spec.partition("=") if "=" in spec else (os.path.basename(spec), "", spec)
            with open(os.path.join(path, file)) as f:
                data[key] = f.read()
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": g["name"]}, "data": data})
    return docs


def quantity(q):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(q))
    if not m:
        raise ValueError(f"unsupported quantity {q}")
    mult = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    return float(m.group(1)) * mult[m.group(2)]


def subset(sel, labels):
    return bool(sel) and all(labels.get(k) == v for k, v in sel.items())


DURATION = re.compile(r"^(\d+(ms|s|m|h))+$")
ENDPOINT_KEYS = {"port", "targetPort", "path", "scheme", "interval", "scrapeTimeout", "honorLabels",
                 "honorTimestamps", "relabelings", "metricRelabelings", "tlsConfig", "bearerTokenSecret",
                 "authorization", "basicAuth", "params", "followRedirects", "enableHttp2", "proxyUrl",
                 "oauth2", "filterRunning", "trackTimestampsStaleness"}
SPEC_KEYS = {"selector", "endpoints", "namespaceSelector", "jobLabel", "targetLabels", "podTargetLabels",
             "sampleLimit", "targetLimit", "labelLimit", "labelNameLengthLimit", "labelValueLengthLimit",
             "attachMetadata", "scrapeProtocols", "keepDroppedTargets", "bodySizeLimit"}


def check_service_monitor(where, d):
    meta, spec = d.get("metadata", {}), d.get("spec")
    if not meta.get("name"):
        problem(where, "ServiceMonitor without metadata.name")
    if not isinstance(spec, dict):
        return problem(where, "ServiceMonitor without spec")
    for k in spec:
        if k not in SPEC_KEYS:
            problem(where, f"ServiceMonitor spec: unknown field {k}")
    sel = spec.get("selector", {})
    if not isinstance(sel.get("matchLabels"), dict) or not sel["matchLabels"]:
        problem(where, "ServiceMonitor spec.selector.matchLabels must be a non-empty map")
    eps = spec.get("endpoints")
    if not isinstance(eps, list) or not eps:
        return problem(where, "ServiceMonitor spec.endpoints must be a non-empty list")
    for i, ep in enumerate(eps):
        for k in ep:
            if k not in ENDPOINT_KEYS:
                problem(where, f"ServiceMonitor endpoints[{i}]: unknown field {k}")
        if not isinstance(ep.get("port"), str):
            problem(where, f"ServiceMonitor endpoints[{i}].port must be a port name")
        if "path" in ep and not str(ep["path"]).startswith("/"):
            problem(where, f"ServiceMonitor endpoints[{i}].path must start with /")
        for k in ("interval", "scrapeTimeout"):
            if k in ep and not DURATION.match(str(ep[k])):
                problem(where, f"ServiceMonitor endpoints[{i}].{k} is not a duration: {ep[k]}")


def flag(args, name):
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def port_of(hostport):
    return int(hostport.rsplit(":", 1)[1])


def check_rendering(where, docs, version, pb, rendered):
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d.get("kind"), []).append(d)
        name = f'{d.get("kind")}/{d.get("metadata", {}).get("name")}'
        if d.get("apiVersion") == "monitoring.coreos.com/v1" and d.get("kind") == "ServiceMonitor":
            check_service_monitor(f"{where} {name}", d)
            continue
        try:
            kubernetes_validate.validate(d, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError as e:
            problem(f"{where} {name}", f"no schema (a CRD this check does not know?): {e}")
        except kubernetes_validate.ValidationError as e:
            path = "/".join(str(p) for p in e.path)
            problem(f"{where} {name}", f"schema: {path}: {e.message}")
    for kind in ("StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget", "ServiceMonitor"):
        if len(by_kind.get(kind, [])) != 1:
            problem(where, f"expected exactly one {kind}, found {len(by_kind.get(kind, []))}")
    if problems:
        return
    sts, svc, cm = by_kind["StatefulSet"][0], by_kind["Service"][0], by_kind["ConfigMap"][0]
    pdb, sm = by_kind["PodDisruptionBudget"][0], by_kind["ServiceMonitor"][0]
    pod = sts["spec"]["template"]
    pod_labels = pod["metadata"].get("labels", {})
    if not subset(sts["spec"]["selector"].get("matchLabels"), pod_labels):
        problem(where, "StatefulSet selector does not match its pod labels")
    if sts["spec"].get("serviceName") != svc["metadata"]["name"] or svc["spec"].get("clusterIP") != "None":
        problem(where, "StatefulSet serviceName must name the headless Service (clusterIP: None)")
    if not subset(svc["spec"].get("selector"), pod_labels):
        problem(where, "Service selector does not match the pods")
    if not subset(pdb["spec"]["selector"].get("matchLabels"), pod_labels):
        problem(where, "PodDisruptionBudget selector does not match the pods")
    if not subset(sm["spec"]["selector"]["matchLabels"], svc["metadata"].get("labels", {})):
        problem(where, "ServiceMonitor selector does not match the Service's labels")
    svc_ports = {p.get("name"): p for p in svc["spec"]["ports"]}
    for ep in sm["spec"]["endpoints"]:
        if ep["port"] not in svc_ports:
            problem(where, f"ServiceMonitor port {ep['port']} is not a Service port")
    (c,) = [c for c in pod["spec"]["containers"] if c["name"] == "kvcached"]
    cports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    for p in svc_ports.values():
        if isinstance(p.get("targetPort"), str) and p["targetPort"] not in cports:
            problem(where, f"Service targetPort {p['targetPort']} is not a container port")
    args = c.get("args", [])
    for fl, port in (("listen", "grpc"), ("metrics_listen", "metrics")):
        v = flag(args, fl)
        if v is None or port not in cports or port_of(v) != cports[port]:
            problem(where, f"--{fl}={v} does not match container port '{port}' {cports.get(port)}")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        p = c.get(probe)
        if not p or p.get("grpc", {}).get("port") != cports.get("grpc"):
            problem(where, f"{probe} must be a gRPC probe on the grpc port")
    grace = flag(args, "shutdown_grace_seconds")
    tgps = pod["spec"].get("terminationGracePeriodSeconds", 30)
    if grace is None or not int(grace) < tgps:
        problem(where, f"terminationGracePeriodSeconds {tgps} must exceed --shutdown_grace_seconds {grace}")
    sc = pod["spec"].get("securityContext", {})
    if not sc.get("runAsNonRoot"):
        problem(where, "pod must run as non-root")
    res = c.get("resources", {})
    for kind in ("requests", "limits"):
        for r in ("cpu", "memory"):
            if r not in res.get(kind, {}):
                problem(where, f"container has no {kind}.{r}")
    if rendered and not re.search(r":[\w.-]+$", c["image"]) or c["image"].endswith(":latest"):
        problem(where, f"image {c['image']} must carry a fixed tag")
    # --config must be a key of the mounted ConfigMap.
    cfg = flag(args, "config")
    mount = next((m for m in c.get("volumeMounts", []) if cfg and cfg.startswith(m["mountPath"].rstrip("/") + "/")), None)
    vol = mount and next((v for v in pod["spec"].get("volumes", []) if v["name"] == mount["name"]), None)
    key = cfg and os.path.basename(cfg)
    if not vol or vol.get("configMap", {}).get("name") != cm["metadata"]["name"] or key not in cm.get("data", {}):
        return problem(where, f"--config={cfg} is not a key of the mounted ConfigMap {cm['metadata']['name']}")
    check_config(where, cm["data"][key], res, c["image"], pb)


def check_config(where, text, res, image, pb):
    from google.protobuf import text_format
    try:
        config = text_format.Parse(text, pb.ServerConfig())
    except text_format.ParseError as e:
        return problem(where, f"ConfigMap config is not a valid kvcache.v1.ServerConfig: {e}")
    if not config.pools:
        return problem(where, "config has no pools")
    names = [p.name for p in config.pools]
    if len(set(names)) != len(names) or not all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in names):
        problem(where, f"pool names must be unique and [A-Za-z0-9._-]: {names}")
    host = sum(p.capacity_bytes for p in config.pools if p.device in ("", "cpu"))
    if any(p.capacity_bytes <= 0 for p in config.pools):
        problem(where, "every pool needs capacity_bytes > 0")
    limit = quantity(res.get("limits", {}).get("memory", "0"))
    if host + 512 * 2**20 > limit:
        problem(where, f"host pools ({host / 2**30:.1f} GiB) + 512 MiB do not fit the memory limit")
    cuda = [p.name for p in config.pools if p.device.startswith("cuda")]
    gpus = int(res.get("limits", {}).get("nvidia.com/gpu", 0))
    if cuda and (gpus < 1 or "gpu" not in image):
        problem(where, f"CUDA pools {cuda} need nvidia.com/gpu and the GPU image (image {image}, gpus {gpus})")
    if gpus and not cuda:
        problem(where, "nvidia.com/gpu requested but no pool is on cuda")
    print(f"{where}: config ok: pools {names} (host {host / 2**30:.1f} GiB, cuda {cuda})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pb-dir", required=True, help="where protoc wrote kvcache/v1/config_pb2.py")
    ap.add_argument("--k8s-version", default="1.32.0")
    ap.add_argument("--kustomize-dir")
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    sys.path.insert(0, a.pb_dir)
    from kvcache.v1 import config_pb2 as pb
    renderings = [(f, load_docs(f), True) for f in a.files]
    if a.kustomize_dir:
        renderings.append((a.kustomize_dir, kustomize_dir_docs(a.kustomize_dir), False))
    if not renderings:
        ap.error("nothing to validate")
    for where, docs, rendered in renderings:
        before = len(problems)
        check_rendering(where, docs, a.k8s_version, pb, rendered)
        if len(problems) == before:
            kinds = ", ".join(f'{d["kind"]}/{d["metadata"]["name"]}' for d in docs)
            print(f"{where}: valid against Kubernetes {a.k8s_version} (strict) + ServiceMonitor check: {kinds}")
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
