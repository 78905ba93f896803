#!/usr/bin/env python3
"""PromQL in deploy/: the Grafana dashboard's queries and the alert rules' expressions.

  prom_queries.py check DASHBOARD ALERTS RULES_OUT
      Structural checks of the dashboard JSON; writes every dashboard query (variables
      substituted) as a recording rule into RULES_OUT for `promtool check rules`.
  prom_queries.py live PROM_URL DASHBOARD ALERTS
      Evaluates every dashboard query, variable query and alert expression through a running
      Prometheus's HTTP API: each must evaluate; each dashboard query must return at least one
      finite sample; every kvcached metric must exist; every loaded rule must be healthy.
      KVC_ABSENT_OK=METRIC[,METRIC...] in the environment: those metrics may be missing (a
      kvcached built before them, e.g. kvc_shard_info without --shard), and the queries and
      variables that use them may be empty; each is reported as a note.

Standard library only (runs under any python3).
"""
import json
import math
import os
import re
import sys
import urllib.parse
import urllib.request

# The metric families kvcached exports (docs/OPERATIONS.md). Histograms add _bucket/_sum/_count.
METRICS = {
    "kvc_pool_capacity_bytes", "kvc_pool_info", "kvc_pool_used_bytes", "kvc_pool_free_bytes",
    "kvc_pool_blocks",
    "kvc_sequences", "kvc_visible_tokens", "kvc_stored_token_heads", "kvc_compression_ratio",
    "kvc_evicted_tokens_total", "kvc_rpc_requests_total", "kvc_rpc_duration_seconds",
    "kvc_rpc_received_bytes_total", "kvc_rpc_sent_bytes_total", "kvc_draining", "kvc_build_info",
    "kvc_tenant_sequences", "kvc_tenant_used_bytes", "kvc_tenant_quota_bytes",
    "kvc_tenant_quota_sequences", "kvc_tenant_call_limit_refusals_total", "kvc_auth_failures_total",
    "kvc_shard_info",
    "kvc_prefix_lookups_total", "kvc_prefix_lookup_tokens_total", "kvc_prefix_misses_total",
    "kvc_prefix_attached_tokens_total", "kvc_prefix_entries_total", "kvc_prefix_cache_entries",
    "kvc_prefix_cache_bytes", "kvc_prefix_corrupt_reads_total", "kvc_process_resident_bytes",
    "kvc_pool_free_resident_bytes", "kvc_pool_released_bytes_total",
}
HISTOGRAMS = {"kvc_rpc_duration_seconds"}
# Counters that exist only once something happened (no eviction policy ran in the live test).
MAY_BE_ABSENT = {"kvc_evicted_tokens_total", "kvc_tenant_call_limit_refusals_total",
                 # quota gauges exist only for tenants with a quota entry (none in the test)
                 "kvc_tenant_quota_bytes", "kvc_tenant_quota_sequences"}
# What Grafana's variables become when the test evaluates a query: every value.
RATE_INTERVAL = "1m"


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def load_dashboard(path):
    with open(path) as f:
        return json.load(f)


def dashboard_variables(dash):
    return {v["name"]: v for v in dash.get("templating", {}).get("list", [])}


def substitute(expr, variables):
    def repl(m):
        name = m.group(1) or m.group(2)
        if name in ("__rate_interval", "__interval", "__range"):
            return RATE_INTERVAL
        if name not in variables:
            fail(f"query uses undefined variable ${name}: {expr}")
        return ".*"
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", repl, expr)


def walk_panels(panels):
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def dashboard_queries(dash, with_record=False):
    """[(label, expr with variables substituted)] for every panel target; with_record adds the
    recording rule name `check` gives it: dashboard:panel_<id>_<refId>."""
    variables = dashboard_variables(dash)
    out = []
    for p in walk_panels(dash.get("panels", [])):
        for t in p.get("targets", []):
            q = (f'panel {p["id"]} "{p["title"]}" {t["refId"]}', substitute(t["expr"], variables))
            out.append(q + (f'dashboard:panel_{p["id"]}_{t["refId"]}',) if with_record else q)
    return out


def variable_queries(dash):
    """[(name, selector, label)] for label_values(SELECTOR, LABEL) query variables."""
    variables = dashboard_variables(dash)
    out = []
    for v in variables.values():
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q.strip())
        if not m:
            fail(f"variable {v['name']}: only label_values(SELECTOR, LABEL) is supported: {q}")
        out.append((v["name"], substitute(m.group(1), variables), m.group(2)))
    return out


def alert_exprs(path):
    """[(alert name, expr)] from a Prometheus rules file, parsed without PyYAML: the file's
    expressions are either `expr: ONE LINE` or an `expr: |` block."""
    out = []
    lines = open(path).read().splitlines()
    name = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"\s*- (?:alert|record): (\S+)", line)
        if m:
            name = m.group(1)
        m = re.match(r"(\s*)expr: (.*)$", line)
        if m:
            indent, rest = len(m.group(1)), m.group(2).strip()
            if rest in ("|", "|-", ">", ">-"):
                body = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                    body.append(lines[i].strip())
                    i += 1
                out.append((name, " ".join(b for b in body if b)))
                continue
            out.append((name, rest))
        i += 1
    if not out:
        fail(f"no expressions found in {path}")
    return out


def metric_names(expr):
    return set(re.findall(r"\b(kvc_[a-z0-9_]+)", expr))


def check_known_metrics(where, expr):
    for name in metric_names(expr):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name not in METRICS and not (base in HISTOGRAMS and base != name):
            fail(f"{where}: unknown metric {name} (not exported by kvcached)")


def check(dashboard_path, alerts_path, rules_out):
    dash = load_dashboard(dashboard_path)
    for key in ("title", "uid", "panels", "templating", "schemaVersion"):
        if key not in dash:
            fail(f"dashboard: missing {key}")
    ids = set()
    n_queries = 0
    for p in walk_panels(dash["panels"]):
        if p.get("id") in ids:
            fail(f"dashboard: duplicate panel id {p.get('id')}")
        ids.add(p.get("id"))
        g = p.get("gridPos", {})
        if not all(k in g for k in "hwxy") or g["x"] + g["w"] > 24:
            fail(f"dashboard: panel {p.get('id')} has a bad gridPos {g}")
        if p["type"] == "row":
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            fail(f"dashboard: panel {p['id']} does not use the $datasource variable")
        if not p.get("targets"):
            fail(f"dashboard: panel {p['id']} \"{p.get('title')}\" has no query")
        for t in p["targets"]:
            if not t.get("expr", "").strip():
                fail(f"dashboard: panel {p['id']} target {t.get('refId')} has an empty expr")
            check_known_metrics(f"panel {p['id']}", t["expr"])
            n_queries += 1
    variable_queries(dash)  # fails on unsupported variable queries
    for name, expr in alert_exprs(alerts_path):
        check_known_metrics(f"alert {name}", expr)
    # Every dashboard query as a recording rule: promtool parses and type-checks it, and
    # `promtool test rules` can evaluate it by name (dashboard:panel_<id>_<refId>).
    with open(rules_out, "w") as f:
        f.write("groups:\n  - name: dashboard-queries\n    rules:\n")
        for label, expr, record in dashboard_queries(dash, with_record=True):
            f.write(f"      # {label}\n      - record: {record}\n")
            f.write(f"        expr: {json.dumps(expr)}\n")
    print(f"dashboard: {len(ids)} panels, {n_queries} queries, metric names known; rules in {rules_out}")


def api(prom, path, **params):
    url = f"{prom}{path}?{urllib.parse.urlencode(params, doseq=True)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        body = json.load(e)
    if body.get("status") != "success":
        return None, f'{body.get("errorType")}: {body.get("error")}'
    return body["data"], None


def finite(sample):
    try:
        return math.isfinite(float(sample["value"][1]))
    except (KeyError, ValueError):
        return False


def live(prom, dashboard_path, alerts_path):
    dash = load_dashboard(dashboard_path)
    problems = []
    absent_ok = {m for m in os.environ.get("KVC_ABSENT_OK", "").split(",") if m}
    unknown = absent_ok - METRICS
    if unknown:
        fail(f"KVC_ABSENT_OK names metrics kvcached does not export: {sorted(unknown)}")

    def may_be_empty(expr):
        return bool(metric_names(expr) & absent_ok)

    data, err = api(prom, "/api/v1/query", query='up{job="kvcached"}')
    if err or not data["result"] or any(s["value"][1] != "1" for s in data["result"]):
        problems.append(f'up{{job="kvcached"}} is not 1: {err or data["result"]}')

    data, err = api(prom, "/api/v1/label/__name__/values")
    names = set(data or [])
    for m in sorted(METRICS):
        want = f"{m}_bucket" if m in HISTOGRAMS else m
        if want not in names:
            if m in MAY_BE_ABSENT:
                print(f"note: {m} has no series yet (nothing evicted)")
            elif m in absent_ok:
                print(f"note: {m} not scraped (KVC_ABSENT_OK)")
            else:
                problems.append(f"metric {want} not scraped from kvcached")

    for label, expr in dashboard_queries(dash):
        data, err = api(prom, "/api/v1/query", query=expr)
        if err:
            problems.append(f"{label}: {err}\n    {expr}")
        elif not data["result"] and may_be_empty(expr):
            print(f"note {label}: no data, allowed (KVC_ABSENT_OK={','.join(sorted(absent_ok))})")
        elif not data["result"]:
            problems.append(f"{label}: no data\n    {expr}")
        elif data["resultType"] == "vector" and not any(finite(s) for s in data["result"]):
            problems.append(f"{label}: no finite sample {data['result']}\n    {expr}")
        else:
            print(f"ok   {label}: {len(data['result'])} series")

    for name, selector, lbl in variable_queries(dash):
        data, err = api(prom, f"/api/v1/label/{lbl}/values", **{"match[]": selector})
        if not err and not data and may_be_empty(selector):
            print(f"note variable ${name}: empty, allowed (KVC_ABSENT_OK)")
        elif err or not data:
            problems.append(f"variable ${name}: label_values({selector}, {lbl}) empty: {err or data}")
        else:
            print(f"ok   variable ${name}: {data}")

    for name, expr in alert_exprs(alerts_path):
        data, err = api(prom, "/api/v1/query", query=expr)
        if err:
            problems.append(f"alert {name}: {err}\n    {expr}")
        else:
            print(f"ok   alert {name}: evaluates ({len(data['result']) if isinstance(data['result'], list) else 1} series)")

    data, err = api(prom, "/api/v1/rules")
    rules = [r for g in (data or {}).get("groups", []) for r in g["rules"]]
    if err or len(rules) != len(alert_exprs(alerts_path)):
        problems.append(f"/api/v1/rules: expected {len(alert_exprs(alerts_path))} rules, got {len(rules)} {err or ''}")
    for r in rules:
        if r.get("health") != "ok":
            problems.append(f"rule {r['name']}: health {r.get('health')}: {r.get('lastError')}")

    if problems:
        for p in problems:
            print(f"FAIL: {p}", file=sys.stderr)
        sys.exit(1)
    print("live: every dashboard query has data; every alert expression and rule evaluates")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "check":
        check(*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "live":
        live(*sys.argv[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
