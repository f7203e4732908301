"""Chart checks for .ci/lint-packaging.sh, on Helm's own Go SDK.

No helm binary can be installed on our machines, so this drives Helm v4's
SDK through helm-python-sdk: the same template engine, values coalescing,
schema validation and linter as `helm template` / `helm lint`.

    chart.py lint CHART [VALUES...]        helm lint, failing on warnings
    chart.py render CHART VALUES OUTDIR    one file per manifest, split by API
                                           (VALUES "-": the chart's defaults)
    chart.py reject CHART VALUES           succeed only if the schema refuses
    chart.py crd-validate FILE...          ServiceMonitors and PrometheusRules,
                                           strictly, against the
                                           prometheus-operator CRD models
    chart.py rule-file RULE OUT            a rendered PrometheusRule's spec as
                                           a Prometheus rule file (for promtool)
    chart.py readme CHART                  README.md lists every value
"""

import copy
import pathlib
import re
import sys

import yaml

RELEASE = "leaderd"
NAMESPACE = "leaderd"
# Kinds outside Kubernetes' own API, which kubernetes-validate has no schema for.
CRD_GROUPS = ("monitoring.coreos.com/",)


def load_values(path):
    if path in (None, "-"):
        return {}
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f) or {}


def lint(chart, value_files):
    import helm_python as helm

    failed = False
    for path in [None, *value_files]:
        report = helm.lint(chart, load_values(path), namespace=NAMESPACE)
        label = path or "default values"
        for m in report["messages"]:
            # 1 = info (e.g. "icon is recommended"); 2 = warning; 3 = error.
            print(f"  [{label}] severity {m['severity']}: {m['path']}: {m['error']}")
            failed |= m["severity"] >= 2
        for err in report["errors"]:
            print(f"  [{label}] error: {err}")
            failed = True
    return 1 if failed else 0


def render(chart, values_path, outdir):
    import helm_python as helm

    out = pathlib.Path(outdir)
    (out / "k8s").mkdir(parents=True, exist_ok=True)
    (out / "crd").mkdir(parents=True, exist_ok=True)
    with helm.Chart.load(chart) as c:
        manifests = c.render(
            load_values(values_path), name=RELEASE, namespace=NAMESPACE, is_install=True
        )
    count = 0
    for template, text in sorted(manifests.items()):
        if template.endswith("NOTES.txt"):
            if not text.strip():
                print(f"  {template} rendered empty")
                return 1
            continue
        for doc in yaml.safe_load_all(text):
            if not doc:
                continue
            count += 1
            sub = "crd" if doc["apiVersion"].startswith(CRD_GROUPS) else "k8s"
            name = f"{doc['kind']}-{doc['metadata']['name']}.yaml".lower()
            (out / sub / name).write_text(yaml.safe_dump(doc, sort_keys=False))
            print(f"  {template} -> {sub}/{name}")
    return 0 if count else 1


def reject(chart, values_path):
    import helm_python as helm

    try:
        with helm.Chart.load(chart) as c:
            c.render(load_values(values_path), name=RELEASE, namespace=NAMESPACE)
    except helm.HelmValuesError as e:
        print(f"  rejected as it should be: {str(e).strip()}")
        return 0
    print(f"  {values_path} was accepted: values.schema.json does not catch it")
    return 1


def forbid_unknown(node):
    """Close every object schema: pydantic models ignore unknown fields, the
    API server's strict field validation does not."""
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for v in node.values():
            forbid_unknown(v)
    elif isinstance(node, list):
        for v in node:
            forbid_unknown(v)


def crd_validate(files):
    import jsonschema
    from cloudcoil.models.prometheus_operator import v1

    models = {
        ("monitoring.coreos.com/v1", "ServiceMonitor"): v1.ServiceMonitor,
        ("monitoring.coreos.com/v1", "PrometheusRule"): v1.PrometheusRule,
    }
    failed = False
    for path in files:
        doc = load_values(path)
        model = models.get((doc.get("apiVersion"), doc.get("kind")))
        if model is None:
            print(f"  {path}: no schema for {doc.get('apiVersion')} {doc.get('kind')}")
            failed = True
            continue
        schema = copy.deepcopy(model.model_json_schema(by_alias=True))
        forbid_unknown(schema)
        errors = list(jsonschema.Draft202012Validator(schema).iter_errors(doc))
        for e in errors:
            print(f"  {path}: {'/'.join(map(str, e.absolute_path))}: {e.message}")
        failed |= bool(errors)
        if not errors:
            print(f"  {path}: valid {doc['kind']} (prometheus-operator CRD models)")
    return 1 if failed else 0


def rule_file(rule_path, out_path):
    """The spec of a PrometheusRule is a rule file's content: `groups`."""
    doc = load_values(rule_path)
    if doc.get("kind") != "PrometheusRule":
        print(f"  {rule_path}: not a PrometheusRule")
        return 1
    with open(out_path, "w", encoding="utf-8") as f:
        yaml.safe_dump(doc["spec"], f, sort_keys=False)
    return 0


def leaf_paths(node, prefix=""):
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from leaf_paths(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip(".")


def readme(chart):
    """Every value in values.yaml has a row in the README's tables (a row
    for an object, e.g. `strategy`, covers everything under it)."""
    chart = pathlib.Path(chart)
    rows = set(re.findall(r"^\| `([^`]+)` \|", (chart / "README.md").read_text(), re.M))
    missing = []
    for path in leaf_paths(load_values(chart / "values.yaml")):
        parts = path.split(".")
        if not any(".".join(parts[:n]) in rows for n in range(1, len(parts) + 1)):
            missing.append(path)
    for path in missing:
        print(f"  {chart}/README.md does not list `{path}`")
    if not missing:
        print(f"  all {len(rows)} documented values found")
    return 1 if missing else 0


def main(argv):
    if len(argv) >= 2 and argv[0] == "lint":
        return lint(argv[1], argv[2:])
    if len(argv) == 4 and argv[0] == "render":
        return render(argv[1], argv[2], argv[3])
    if len(argv) == 3 and argv[0] == "reject":
        return reject(argv[1], argv[2])
    if len(argv) == 2 and argv[0] == "readme":
        return readme(argv[1])
    if len(argv) == 3 and argv[0] == "rule-file":
        return rule_file(argv[1], argv[2])
    if len(argv) >= 2 and argv[0] == "crd-validate":
        return crd_validate(argv[1:])
    print(__doc__, file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
