"""A real Prometheus (and promtool) for the observability tests, built from the upstream module by
build_tools.sh: started on a scrape config of static targets, asked through its HTTP API."""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.cluster.cluster import tools
from tests.helpers import bound, free_port, wait_for


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(tools() / "promtool"), *args], input=stdin, capture_output=True, text=True)


class QueryError(Exception):
    pass


@dataclass
class Prometheus:
    process: subprocess.Popen
    url: str
    log: Path

    @classmethod
    def start(
        cls,
        folder: Path,
        jobs: dict[str, list[str]],
        rules: dict | None = None,
        target_labels: dict[str, dict[str, str]] | None = None,
        interval: str = "1s",
    ) -> Prometheus:
        """Scrape each job's `host:port` targets every `interval`, with honor_labels as the chart's monitors
        do (the trainers' and the operator's own namespace and job_name labels win), the job's
        `target_labels` added, and evaluate `rules` (a rule file's content) as often."""
        folder.mkdir(parents=True, exist_ok=True)
        if rules:
            (folder / "rules.yml").write_text(yaml.safe_dump(rules))
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(folder / "rules.yml")] if rules else [],
            "scrape_configs": [
                {
                    "job_name": job,
                    "honor_labels": True,
                    "static_configs": [{"targets": targets, "labels": (target_labels or {}).get(job, {})}],
                }
                for job, targets in jobs.items()
            ],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        log = folder / "prometheus.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [
                    str(tools() / "prometheus"),
                    f"--config.file={folder / 'prometheus.yml'}",
                    f"--storage.tsdb.path={folder / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        prometheus = cls(process, f"http://127.0.0.1:{port}", log)
        wait_for(prometheus.ready, what="Prometheus ready")
        return prometheus

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.process.returncode}: {self.log.read_text()[-2000:]}")
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as response:
            return response.status == 200

    def query(self, expr: str) -> list[dict]:
        """The instant vector `expr` evaluates to now; a parse error raises with Prometheus's message."""
        try:
            return self.api("query", query=expr)["result"]
        except urllib.error.HTTPError as error:
            raise QueryError(f"{expr}: {json.load(error).get('error')}") from error

    def api(self, path: str, **params: str) -> dict:
        """GET /api/v1/<path>: its data."""
        url = f"{self.url}/api/v1/{path}?" + urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(url, timeout=30) as response:
            return json.load(response)["data"]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=bound(30))
