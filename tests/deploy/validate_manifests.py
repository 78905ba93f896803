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
    proto/kvcache/v1/config.proto, in --pb-dir);
  * security: a non-loopback gRPC listen (the --listen flag, else the config's) has TLS and a
    credential source and no `insecure`; every file the config's tls/auth names is a key of a
    Secret volume mounted read-only, without subPath, at the file's directory; no env var takes
    those Secrets; the probes do not use the kubelet's gRPC probe (no TLS) but the plaintext
    metrics port; the NetworkPolicy selects the kvcached pods and lets only kvcache client pods
    reach the gRPC port and only Prometheus in the monitoring namespace the metrics port;
  * same-node reads (a --local_socket flag or the config's local_socket): the path is per pod
    ($(POD_NAME)), its directory a writable hostPath mount that an init container prepares
    (kvcached is not root), and local_socket_uids names the engines' uids;
  * shards: the container passes --shard=$(POD_NAME) once, POD_NAME comes from the pod's
    metadata.name (so every replica has its own, stable shard name and sequence ids never
    collide), the pod names are DNS labels; the headless Service does not publish not-ready pods
    (a draining shard must leave DNS so that clients place no new sequence on it).
  validate_manifests.py ... --cluster RENDERED.yaml
      RENDERED.yaml is the 3-shard cluster overlay: all the above plus replicas 3, topology
      spread over nodes (maxSkew 1, DoNotSchedule, taints honoured) and zones (ScheduleAnyway)
      selecting the kvcached pods, anti-affinity kept, the PodDisruptionBudget at
      maxUnavailable 1.
  validate_manifests.py ... --secrets-dir DIR
      Also validates the Secret manifests make-secrets.sh wrote to DIR (*.secret.yaml) and
      checks the mounted keys against them instead of the expected key names.
  validate_manifests.py --pb-dir DIR --textproto deploy/x.textproto --dockerfile deploy/docker/D
      Every shipped config file on its own (listen, tls, auth, insecure), and an image's baked
      config with the Dockerfile CMD's --listen applied.
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


def check_rendering(where, docs, version, pb, rendered, secrets):
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
    for kind in ("StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget", "ServiceMonitor", "NetworkPolicy"):
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
    check_probes(where, c, cports, args)
    check_shard(where, sts, c, args, svc)
    check_network_policy(where, by_kind["NetworkPolicy"][0], pod_labels, cports)
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
    config = check_config(where, cm["data"][key], res, c["image"], pb)
    if config is not None:
        check_security(where, config, flag(args, "listen"))
        check_secret_mounts(where, config, pod, c, secrets)
        check_local_socket(where, config, pod, c, args)


def check_local_socket(where, config, pod, c, args):
    path = flag(args, "local_socket") or config.local_socket
    if not path:
        return
    if "$(POD_NAME)" not in path:
        problem(where, f"local_socket {path} is not per pod: two kvcached pods on one node would "
                "take each other's socket (--local_socket=<dir>/$(POD_NAME).sock)")
    d = os.path.dirname(path)
    mount = next((m for m in c.get("volumeMounts", []) if m["mountPath"].rstrip("/") == d), None)
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    vol = volumes.get(mount["name"], {}) if mount else {}
    if "hostPath" not in vol:
        return problem(where, f"local_socket directory {d} is not a hostPath volume mount: engine "
                       "pods on the node could not reach the socket")
    if mount.get("readOnly"):
        problem(where, f"local_socket directory {d} is mounted readOnly: kvcached cannot create its socket")
    if not any(m["name"] == mount["name"] for ic in pod["spec"].get("initContainers", [])
               for m in ic.get("volumeMounts", [])):
        problem(where, f"no init container prepares hostPath {vol['hostPath']['path']}: the kubelet "
                "creates it root-owned 0755, where kvcached (non-root) cannot create its socket")
    if not config.local_socket_uids:
        problem(where, "local_socket without local_socket_uids: no engine's uid could connect "
                "(kvcached refuses to start)")
    if config.local_socket_allow_same_uid:
        problem(where, "local_socket_allow_same_uid: every process of kvcached's uid would be "
                "trusted with every tenant's KV; give the engines their own uid")
    if not config.auth.tokens_file:
        problem(where, "local_socket without auth.tokens_file: a same-node peer proves its "
                "tenant with a bearer token, so without tokens every engine maps every "
                "tenant's KV")
    print(f"{where}: local_socket {path} in hostPath {vol['hostPath']['path']}, "
          f"uids {list(config.local_socket_uids)}")


SHARD_ARG = "--shard=$(POD_NAME)"


def check_shard(where, sts, c, args, svc):
    """Every replica gets its own shard name, the pod name: kvcached mints sequence ids as
    NAME:<incarnation>:<local id> and cluster clients route by NAME, so two pods with one name
    would hand out colliding ids."""
    shard = [a for a in args if a == "--shard" or a.startswith("--shard=")]
    if shard != [SHARD_ARG]:
        problem(where, f"kvcached needs exactly one {SHARD_ARG} argument (a distinct shard per pod), has {shard}")
    env = [e for e in c.get("env", []) if e.get("name") == "POD_NAME"]
    field = env and env[-1].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if len(env) != 1 or "value" in env[0] or field != "metadata.name":
        problem(where, f"env POD_NAME must come from fieldRef metadata.name (the pod's name), is {env}")
    # Pod names are NAME-ORDINAL; --shard takes a DNS label: [a-z0-9-], at most 63 characters.
    last = f'{sts["metadata"]["name"]}-{max(int(sts["spec"].get("replicas", 1)) - 1, 0)}'
    if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", last):
        problem(where, f"pod name {last} is not a DNS label, so not a valid --shard name")
    if svc["spec"].get("publishNotReadyAddresses"):
        problem(where, "the headless Service publishes not-ready pods: a draining shard would stay in DNS "
                       "and clients would keep placing new sequences on it")


def check_cluster(where, docs, replicas):
    """The cluster overlay: its shard count, how the shards spread, how many may be down."""
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d.get("kind"), []).append(d)
    sts, pdb = by_kind["StatefulSet"][0], by_kind["PodDisruptionBudget"][0]
    pod = sts["spec"]["template"]
    labels = pod["metadata"].get("labels", {})
    if sts["spec"].get("replicas") != replicas:
        problem(where, f"cluster: StatefulSet replicas {sts['spec'].get('replicas')}, expected {replicas}")
    tsc = {t.get("topologyKey"): t for t in pod["spec"].get("topologySpreadConstraints", [])}
    for key, when in (("kubernetes.io/hostname", "DoNotSchedule"), ("topology.kubernetes.io/zone", "ScheduleAnyway")):
        t = tsc.get(key)
        if not t:
            problem(where, f"cluster: no topologySpreadConstraint over {key}")
            continue
        if t.get("maxSkew") != 1 or t.get("whenUnsatisfiable") != when:
            problem(where, f"cluster: spread over {key} must be maxSkew 1, {when}: {t}")
        if not subset(t.get("labelSelector", {}).get("matchLabels"), labels):
            problem(where, f"cluster: spread over {key} does not select the kvcached pods")
    if tsc.get("kubernetes.io/hostname", {}).get("nodeTaintsPolicy") != "Honor":
        problem(where, "cluster: the hostname spread must honour taints (nodeTaintsPolicy: Honor), or "
                       "nodes the pods cannot run on count as empty domains and block scheduling")
    if pdb["spec"].get("maxUnavailable") != 1 or "minAvailable" in pdb["spec"]:
        problem(where, f"cluster: PodDisruptionBudget must be maxUnavailable 1: {pdb['spec']}")
    if not subset(pdb["spec"].get("selector", {}).get("matchLabels"), labels):
        problem(where, "cluster: PodDisruptionBudget does not select the kvcached pods")
    if not pod["spec"].get("affinity", {}).get("podAntiAffinity"):
        problem(where, "cluster: the base's podAntiAffinity is gone")


def check_probes(where, c, cports, args):
    """Probes that work while the gRPC port serves TLS: the kubelet's `grpc:` probe dials
    plaintext, so startup and liveness are httpGet /metrics on the metrics port and readiness is
    an exec probe that reads kvc_draining from it over loopback."""
    metrics = cports.get("metrics")
    ml = flag(args, "metrics_listen") or ""
    if ml.rsplit(":", 1)[0] in ("127.0.0.1", "localhost", "[::1]"):
        problem(where, f"--metrics_listen={ml} is loopback: the kubelet's httpGet probes dial the pod IP")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        p = c.get(probe)
        if not p:
            problem(where, f"no {probe}")
        elif "grpc" in p:
            problem(where, f"{probe} is a kubelet gRPC probe, which cannot do TLS")
    for probe in ("livenessProbe", "startupProbe"):
        get = (c.get(probe) or {}).get("httpGet", {})
        if get.get("port") not in ("metrics", metrics) or get.get("path") != "/metrics" or get.get("scheme", "HTTP") != "HTTP":
            problem(where, f"{probe} must be httpGet /metrics on the metrics port (plaintext)")
    cmd = " ".join((c.get("readinessProbe") or {}).get("exec", {}).get("command", []))
    if f"/dev/tcp/127.0.0.1/{metrics}" not in cmd or "^kvc_draining 0$" not in cmd or not cmd.startswith("/bin/bash -c"):
        problem(where, "readinessProbe must be the bash exec probe reading kvc_draining from "
                f"127.0.0.1:{metrics} (the metrics port)")


def check_network_policy(where, np, pod_labels, cports):
    spec = np["spec"]
    where = f"{where} NetworkPolicy/{np['metadata']['name']}"
    if not subset(spec.get("podSelector", {}).get("matchLabels"), pod_labels):
        problem(where, "podSelector does not select the kvcached pods")
    if "Ingress" not in spec.get("policyTypes", []):
        problem(where, "policyTypes must include Ingress")
    allowed = {}
    for i, rule in enumerate(spec.get("ingress", [])):
        peers, ports = rule.get("from"), rule.get("ports")
        # An empty or missing `from` or `ports` means every source or every port.
        if not peers or not ports:
            problem(where, f"ingress[{i}] needs both `from` and `ports` (empty = everything)")
            continue
        for port in ports:
            name = next((n for n, num in cports.items() if port.get("port") in (n, num)), None)
            if name is None:
                problem(where, f"ingress[{i}] port {port.get('port')} is not a kvcached container port")
                continue
            allowed[name] = True
            for j, peer in enumerate(peers):
                pod_sel = peer.get("podSelector", {}).get("matchLabels", {})
                ns_sel = peer.get("namespaceSelector")
                if "ipBlock" in peer:
                    problem(where, f"ingress[{i}].from[{j}]: no ipBlock peers")
                if name == "grpc" and pod_sel.get("kvcache.io/client") != "true":
                    problem(where, f"ingress[{i}].from[{j}]: the grpc port is for pods labelled kvcache.io/client=true")
                if name == "metrics" and (not pod_sel or not (ns_sel or {}).get("matchLabels")):
                    problem(where, f"ingress[{i}].from[{j}]: the metrics port is for the scraper's pods "
                                   "in the monitoring namespace (podSelector and namespaceSelector)")
                if name not in ("grpc", "metrics"):
                    problem(where, f"ingress[{i}]: port {name} should not be reachable")
    for name in ("grpc", "metrics"):
        if name not in allowed:
            problem(where, f"no ingress rule for the {name} port: it would be unreachable")


def loopback(hostport):
    host = hostport.rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.") or hostport.startswith("unix:")


def check_security(where, config, listen_flag):
    """What kvcached will refuse (issue #16): a non-loopback listen without TLS or without a
    credential source, unless `insecure: true` -- which nothing shipped may set."""
    listen = listen_flag or config.listen or "127.0.0.1:50051"
    if config.insecure:
        problem(where, "config sets `insecure: true`: shipped configs must not")
    tls = config.tls if config.HasField("tls") else None
    auth = config.auth if config.HasField("auth") else None
    if not loopback(listen):
        if tls is None or not tls.cert_file or not tls.key_file:
            problem(where, f"listens on {listen} (not loopback) without tls {{ cert_file key_file }}")
        if auth is None or not (auth.tokens_file or auth.client_identities):
            problem(where, f"listens on {listen} (not loopback) without auth (tokens_file or client_identities)")
    if tls is not None:
        if tls.require_client_cert and not tls.client_ca_file:
            problem(where, "tls.require_client_cert without tls.client_ca_file")
        if tls.reload_interval_seconds and not 1 <= tls.reload_interval_seconds <= 86400:
            problem(where, f"tls.reload_interval_seconds {tls.reload_interval_seconds} not in 1..86400")
    if auth is not None and auth.reload_interval_seconds and not 1 <= auth.reload_interval_seconds <= 86400:
        problem(where, f"auth.reload_interval_seconds {auth.reload_interval_seconds} not in 1..86400")
    if auth is not None and auth.client_identities and (tls is None or not tls.client_ca_file):
        problem(where, "auth.client_identities need tls.client_ca_file (client certificates are not verified)")
    return listen


# The keys make-secrets.sh puts in each Secret (used when no --secrets-dir is given).
EXPECTED_SECRET_KEYS = {"kvcached-tls": {"tls.crt", "tls.key", "ca.crt"}, "kvcached-tokens": {"tokens"}}


def check_secret_mounts(where, config, pod, c, secrets):
    files = []
    if config.HasField("tls"):
        files += [("tls." + f, getattr(config.tls, f)) for f in ("cert_file", "key_file", "client_ca_file")]
    if config.HasField("auth"):
        files.append(("auth.tokens_file", config.auth.tokens_file))
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    used = set()
    for field, path in files:
        if not path:
            continue
        d, key = os.path.dirname(path), os.path.basename(path)
        mount = next((m for m in c.get("volumeMounts", []) if m["mountPath"].rstrip("/") == d), None)
        vol = mount and volumes.get(mount["name"], {}).get("secret")
        if not vol:
            problem(where, f"{field} {path}: no Secret volume is mounted at {d}")
            continue
        name = vol.get("secretName")
        used.add(name)
        if not mount.get("readOnly"):
            problem(where, f"{field}: the Secret volume at {d} must be mounted readOnly")
        if mount.get("subPath") or mount.get("subPathExpr"):
            problem(where, f"{field}: a subPath mount of {name} would never see a rotated Secret")
        keys = secrets.get(name, EXPECTED_SECRET_KEYS.get(name, set()))
        if "items" in vol:
            paths = {i["path"]: i["key"] for i in vol["items"]}
            if key not in paths or paths[key] not in keys:
                problem(where, f"{field} {path}: {key} is not an item of Secret {name}")
        elif key not in keys:
            problem(where, f"{field} {path}: Secret {name} has no key {key} (keys {sorted(keys)})")
    for e in c.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef", {}).get("name")
        if ref in used:
            problem(where, f"env {e['name']} takes Secret {ref}: credentials are mounted, not in env")
    for e in c.get("envFrom", []):
        if e.get("secretRef", {}).get("name") in used:
            problem(where, f"envFrom takes Secret {e['secretRef']['name']}: credentials are mounted, not in env")


def parse_config(where, text, pb):
    from google.protobuf import text_format
    try:
        return text_format.Parse(text, pb.ServerConfig())
    except text_format.ParseError as e:
        problem(where, f"config is not a valid kvcache.v1.ServerConfig: {e}")
        return None


def check_config(where, text, res, image, pb):
    config = parse_config(where, text, pb)
    if config is None:
        return None
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
    return config


def check_textproto(path, pb, listen_flag=None, where=None):
    where = where or path
    with open(path) as f:
        config = parse_config(where, f.read(), pb)
    if config is None:
        return
    before = len(problems)
    listen = check_security(where, config, listen_flag)
    if len(problems) == before:
        mode = "loopback, plaintext allowed" if loopback(listen) else "TLS + auth"
        print(f"{where}: listen {listen}: {mode}")


def check_dockerfile(path, pb, root):
    """The image's baked config with the CMD's --listen applied: what `docker run` starts."""
    import json
    text = re.sub(r"\\\n", " ", open(path).read())
    m = re.search(r"install -D -m \d+ (\S+\.textproto) /out/etc/kvcached/config\.textproto", text)
    cmd = re.findall(r"^CMD (\[.*\])$", text, re.M)
    if not m or not cmd:
        return problem(path, "no baked /etc/kvcached/config.textproto or no exec-form CMD")
    args = json.loads(cmd[-1])
    if flag(args, "config") != "/etc/kvcached/config.textproto":
        problem(path, f"CMD --config={flag(args, 'config')} is not the baked config")
    check_textproto(os.path.join(root, m.group(1)), pb, flag(args, "listen"),
                    where=f"{path} (CMD with {m.group(1)})")


def load_secrets(d, version):
    """{name: keys} of the Secret manifests in d, each validated against the schema."""
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".secret.yaml"):
            continue
        for doc in load_docs(os.path.join(d, f)):
            where = f"{f} Secret/{doc.get('metadata', {}).get('name')}"
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                problem(where, f"schema: {'/'.join(str(p) for p in e.path)}: {e.message}")
            if doc.get("kind") != "Secret" or not doc.get("data"):
                problem(where, "not a Secret with data")
                continue
            if doc["metadata"]["name"] == "kvcached-tls" and doc.get("type") != "kubernetes.io/tls":
                problem(where, "kvcached-tls must be of type kubernetes.io/tls")
            out[doc["metadata"]["name"]] = set(doc["data"])
    for name in EXPECTED_SECRET_KEYS:
        if name not in out:
            problem(d, f"no manifest for Secret {name}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pb-dir", required=True, help="where protoc wrote kvcache/v1/config_pb2.py")
    ap.add_argument("--k8s-version", default="1.32.0")
    ap.add_argument("--kustomize-dir")
    ap.add_argument("--secrets-dir", help="make-secrets.sh output: validate and use its Secret manifests")
    ap.add_argument("--textproto", action="append", default=[], help="a shipped config file to check")
    ap.add_argument("--dockerfile", action="append", default=[], help="a Dockerfile whose baked config to check")
    ap.add_argument("--cluster", action="append", default=[],
                    help="a rendering of the cluster overlay: also its replicas, spread and budget")
    ap.add_argument("--cluster-replicas", type=int, default=3)
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    sys.path.insert(0, a.pb_dir)
    from kvcache.v1 import config_pb2 as pb
    renderings = [(f, load_docs(f), True) for f in a.files + a.cluster]
    if a.kustomize_dir:
        renderings.append((a.kustomize_dir, kustomize_dir_docs(a.kustomize_dir), False))
    if not renderings and not a.textproto and not a.dockerfile:
        ap.error("nothing to validate")
    secrets = load_secrets(a.secrets_dir, a.k8s_version) if a.secrets_dir else {}
    if a.secrets_dir and not problems:
        print(f"{a.secrets_dir}: Secret manifests valid: " + ", ".join(f"{n} {sorted(k)}" for n, k in secrets.items()))
    for path in a.textproto:
        check_textproto(path, pb)
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    for path in a.dockerfile:
        check_dockerfile(path, pb, root)
    for where, docs, rendered in renderings:
        before = len(problems)
        check_rendering(where, docs, a.k8s_version, pb, rendered, secrets)
        if where in a.cluster and len(problems) == before:
            check_cluster(where, docs, a.cluster_replicas)
            if len(problems) == before:
                print(f"{where}: cluster ok: {a.cluster_replicas} shards, spread over nodes and zones, "
                      "PodDisruptionBudget maxUnavailable 1")
        if len(problems) == before:
            kinds = ", ".join(f'{d["kind"]}/{d["metadata"]["name"]}' for d in docs)
            print(f"{where}: valid against Kubernetes {a.k8s_version} (strict) + ServiceMonitor check: {kinds}")
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
