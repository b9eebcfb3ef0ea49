#!/usr/bin/env python3
"""Checks every query of the Grafana dashboard with promtool: each target's
PromQL becomes a recording rule (Grafana's variables replaced by values
promtool accepts) and `promtool check rules` parses it. Run by
scripts/test.sh; exits non-zero on a bad query or an unknown metric name."""
import json, re, subprocess, sys, tempfile, pathlib

here = pathlib.Path(__file__).resolve().parent
dashboard = json.loads((here / "distlock.json").read_text())
# The metric names distlock exports (distlock/src/metrics.rs describe_metrics).
known = set(re.findall(r'"(distlock_[a-z_]+)"', (here.parents[1] / "distlock/src/metrics.rs").read_text()))
rules, problems = [], []
for panel in dashboard["panels"]:
    for target in panel["targets"]:
        expr = target["expr"].replace("$__rate_interval", "5m").replace("$instance", ".*")
        for name in re.findall(r"\b(distlock_[a-z_]+?)(?:_bucket)?\{", expr):
            if name not in known:
                problems.append(f"{panel['title']}: unknown metric {name}")
        rules.append({"record": f"dashboard:check_{len(rules)}", "expr": expr})
if problems:
    sys.exit("\n".join(problems))
with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
    json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
subprocess.run(["promtool", "check", "rules", f.name], check=True)
print(f"deploy/grafana/distlock.json: {len(rules)} queries over {len(dashboard['panels'])} panels parse")
