"""Prometheus scrapes the gateway and Grafana shows every Chorus metric: infra/prometheus.yml, the
provisioning under infra/grafana/provisioning, and the dashboard JSON they load."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.infra.compose import HISTOGRAMS, INFRA, METRICS, mount_source, resolved_environment, services

PROMETHEUS = INFRA / "prometheus.yml"
GRAFANA = INFRA / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "chorus.json"
METRIC_NAME = re.compile(r"\bchorus_[a-z0-9_]+\b")
PANEL_TYPES = {"row", "timeseries", "stat", "gauge", "bargauge", "table", "heatmap", "state-timeline", "text"}


def _dashboard() -> dict[str, Any]:
    loaded = json.loads(DASHBOARD.read_text())
    assert isinstance(loaded, dict)
    return loaded


def _panels() -> list[dict[str, Any]]:
    panels = []
    for panel in _dashboard()["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # inside collapsed rows
    return panels


def _exprs() -> list[str]:
    return [t["expr"] for p in _panels() for t in p.get("targets", [])]


def _base_metric(name: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if name.removesuffix(suffix) in HISTOGRAMS:
            return name.removesuffix(suffix)
    return name


def test_prometheus_scrapes_the_gateway_metrics() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    gateway = [
        job for job in jobs.values() if any("gateway:8000" in sc["targets"] for sc in job.get("static_configs", []))
    ]
    assert len(gateway) == 1, "one job scrapes gateway:8000"
    assert gateway[0].get("metrics_path", "/metrics") == "/metrics"
    assert resolved_environment("gateway")["CHORUS_PORT"] == "8000"
    assert mount_source("prometheus", "/etc/prometheus/prometheus.yml") == PROMETHEUS
    assert "--config.file=/etc/prometheus/prometheus.yml" in services()["prometheus"]["command"]


def test_promtool_accepts_the_prometheus_config() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    result = subprocess.run(
        [promtool, "check", "config", "--syntax-only", str(PROMETHEUS)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_provisioning_points_at_prometheus_and_the_dashboard() -> None:
    provisioning = mount_source("grafana", "/etc/grafana/provisioning")
    assert provisioning == GRAFANA / "provisioning"
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert "prometheus" in services()
    providers = yaml.safe_load((provisioning / "dashboards" / "chorus.yml").read_text())["providers"]
    (provider,) = providers
    assert provider["type"] == "file"
    mounted = mount_source("grafana", provider["options"]["path"])
    assert (mounted / DASHBOARD.name).resolve() == DASHBOARD.resolve()
    home = services()["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(provider["options"]["path"]) / DASHBOARD.name == Path(home)
    uids = {panel["datasource"]["uid"] for panel in _panels() if "datasource" in panel}
    uids |= {t["datasource"]["uid"] for p in _panels() for t in p.get("targets", []) if "datasource" in t}
    assert uids == {source["uid"]}


def test_the_dashboard_is_grafana_dashboard_json() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] and dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert "id" not in dashboard or dashboard["id"] is None  # provisioning assigns it
    ids = [panel["id"] for panel in _panels()]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in _panels():
        assert panel["type"] in PANEL_TYPES, panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        assert grid["h"] > 0 and grid["y"] >= 0, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"], f"{panel['title']} queries nothing"
            refs = [t["refId"] for t in panel["targets"]]
            assert len(refs) == len(set(refs)), panel["title"]
    for variable in dashboard["templating"]["list"]:
        assert variable["name"] and variable["type"] in ("query", "custom", "datasource", "interval")


def test_every_panel_queries_the_chorus_metrics() -> None:
    used: set[str] = set()
    for panel in _panels():
        for target in panel.get("targets", []):
            names = {_base_metric(n) for n in METRIC_NAME.findall(target["expr"])}
            assert names, f"{panel['title']}: {target['expr']} reads no Chorus metric"
            assert names <= METRICS, f"{panel['title']}: unknown {names - METRICS}"
            used |= names
    for variable in _dashboard()["templating"]["list"]:
        names = {_base_metric(n) for n in METRIC_NAME.findall(json.dumps(variable.get("query")))}
        assert names <= METRICS, variable["name"]
    assert used == METRICS, f"no panel for {sorted(METRICS - used)}"


def test_histograms_show_p50_and_p99_and_counters_show_rates() -> None:
    exprs = _exprs()
    for histogram in HISTOGRAMS:
        quantiles = {
            q for e in exprs if f"{histogram}_bucket" in e for q in re.findall(r"histogram_quantile\((0\.\d+)", e)
        }
        assert {"0.5", "0.99"} <= quantiles, histogram
        assert all("by (le" in e for e in exprs if f"{histogram}_bucket" in e), histogram
    for expr in exprs:
        for name in METRIC_NAME.findall(expr):
            if name.endswith("_total"):
                assert re.search(rf"(rate|increase)\({name}\b", expr), f"{name} is a counter: {expr}"


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    rules = []
    for i, expr in enumerate(_exprs()):
        concrete = expr.replace("$__rate_interval", "1m")
        concrete = re.sub(r"\$\{?\w+\}?", ".*", concrete)  # template variables
        rules.append({"record": f"chorus:dashboard:query{i}", "expr": concrete})
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
