"""Real Prometheus-compatible servers for tests: Prometheus (Debian's package; history backfilled with promtool) and
VictoriaMetrics (its import API), each started on a free port."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import _wait_listening, free_port

_SAMPLE = re.compile(r"^(.*) (\S+) (\d+)$")


def binary(name: str) -> str:
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if found is None:
        pytest.fail(f"{name} is not installed: `make test` installs it (apt-get install prometheus)")
    return found


@dataclass
class Prometheus:
    port: int
    data: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None
    max_samples: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def backfill(self, lines: Iterable[str]) -> None:
        """Samples as ``series value milliseconds`` lines, written into blocks by ``promtool tsdb
        create-blocks-from openmetrics`` (OpenMetrics wants seconds and a closing ``# EOF``)."""
        source = self.data.parent / "history.om"
        with source.open("w") as out:
            for line in lines:
                m = _SAMPLE.match(line)
                assert m is not None, line
                out.write(f"{m.group(1)} {m.group(2)} {int(m.group(3)) / 1000:.3f}\n")
            out.write("# EOF\n")
        subprocess.run(
            [binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(source), str(self.data)],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip

    def start(self) -> None:
        config = self.data.parent / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 30s\nscrape_configs: []\n")
        args = [binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={self.data}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=100y",
                "--log.level=error"]  # fmt: skip
        if self.max_samples is not None:
            args.append(f"--query.max-samples={self.max_samples}")
        self.process = subprocess.Popen(args, stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        _wait_listening("127.0.0.1", self.port, self.process, self.log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # listening comes before the TSDB is open
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"Prometheus never became ready: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


def prometheus(directory: Path, lines: Iterable[str], max_samples: int | None = None) -> Prometheus:
    """A Prometheus holding ``lines`` of history, started."""
    directory.mkdir(parents=True, exist_ok=True)
    server = Prometheus(free_port(), directory / "data", directory / "prometheus.log", max_samples=max_samples)
    server.backfill(lines)
    server.start()
    return server


def import_into_victoria(url: str, lines: Iterable[str]) -> None:
    """Samples as ``series value milliseconds`` lines into VictoriaMetrics (``/api/v1/import/prometheus``), flushed
    so that they are searchable at once."""
    body = "\n".join(lines).encode()
    urllib.request.urlopen(urllib.request.Request(f"{url}/api/v1/import/prometheus", data=body), timeout=60).read()
    urllib.request.urlopen(f"{url}/internal/force_flush", timeout=30).read()
