"""A Spark standalone cluster on 127.0.0.1 for the connector tests: a master and two workers
started with PySpark's own ``bin/spark-class`` (the jars of the installed pyspark; nothing is
downloaded), each worker running its executors in JVMs of their own with their own Python
workers. Also the Spark Connect server, started the same way against that master.

Executors import ``spark_connector`` from this checkout: the workers' environment and the
applications' ``spark.executorEnv.PYTHONPATH`` put the repository root first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.integration.harness import REPO_ROOT, free_port

WORKERS = 2
WORKER_MEMORY = "768m"
EXECUTOR_MEMORY = "512m"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def daemon_env() -> dict[str, str]:
    python_path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(
        os.environ,
        SPARK_HOME=str(spark_home()),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=python_path,
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_HOSTNAME="localhost",
        SPARK_NO_DAEMONIZE="1",
        SPARK_DAEMON_MEMORY="256m",
    )


class StandaloneCluster:
    def __init__(self, base: Path, workers: int = WORKERS) -> None:
        self.base = base
        self.workers = workers
        self.port = free_port()
        self.ui_port = free_port()
        self.processes: list[subprocess.Popen] = []
        self.connect_port: int | None = None

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _launch(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        with open(self.base / f"{name}.log", "ab") as log:  # the process has its own descriptor of it
            process = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env=env or daemon_env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def _spark_class(self, *args: str) -> list[str]:
        return [str(spark_home() / "bin" / "spark-class"), *args]

    def start(self, timeout: float = 120) -> StandaloneCluster:
        self.base.mkdir(parents=True, exist_ok=True)
        self._launch(
            "master",
            self._spark_class(
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(self.ui_port),
            ),
        )
        for n in range(self.workers):
            work = self.base / f"worker{n}"
            work.mkdir(exist_ok=True)
            self._launch(
                f"worker{n}",
                self._spark_class(
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "1",
                    "--memory",
                    WORKER_MEMORY,
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(work),
                    self.master_url,
                ),
            )
        deadline = time.monotonic() + timeout
        while self.alive_workers() < self.workers:
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited with {process.returncode}: {self.logs()}")
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{self.workers} workers did not register within {timeout}s: {self.logs()}")
            time.sleep(0.5)
        return self

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as response:
                state = json.loads(response.read())
        except (OSError, ValueError):
            return 0
        return int(state.get("aliveworkers", 0))

    def executor_pids(self) -> list[int]:
        """Process ids of the executors' JVMs (started by the workers in their work directories)."""
        pids = []
        for entry in Path("/proc").iterdir():
            try:
                if not entry.name.isdigit() or b"CoarseGrainedExecutorBackend" not in (entry / "cmdline").read_bytes():
                    continue
                if os.readlink(entry / "cwd").startswith(str(self.base)):
                    pids.append(int(entry.name))
            except OSError:
                continue
        return pids

    def session_conf(self) -> dict[str, str]:
        """Configuration of an application on this cluster."""
        return {
            "spark.executor.memory": EXECUTOR_MEMORY,
            "spark.executor.cores": "1",
            "spark.cores.max": str(self.workers),
            "spark.executorEnv.PYTHONPATH": daemon_env()["PYTHONPATH"],
            "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
            "spark.pyspark.python": sys.executable,
            "spark.task.maxFailures": "2",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
        }

    def start_connect_server(self, timeout: float = 180) -> str:
        """The Spark Connect server, an application of this cluster; returns its ``sc://`` URL."""
        self.connect_port = free_port()
        conf = {
            **self.session_conf(),
            "spark.connect.grpc.binding.port": str(self.connect_port),
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.driver.memory": "768m",
        }
        argv = self._spark_class(
            "org.apache.spark.deploy.SparkSubmit",
            "--master",
            self.master_url,
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name",
            "trionsq-connect",
            "--driver-memory",
            "768m",
        )
        for key, value in conf.items():
            argv += ["--conf", f"{key}={value}"]
        argv.append("spark-internal")
        env = daemon_env()
        del env["SPARK_DAEMON_MEMORY"]  # a driver, not a daemon: --driver-memory sizes it
        process = self._connect_process = self._launch("connect", argv, env)
        deadline = time.monotonic() + timeout
        import socket

        while True:
            try:
                socket.create_connection(("127.0.0.1", self.connect_port), timeout=1).close()
                return f"sc://127.0.0.1:{self.connect_port}"
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() >= deadline:
                raise RuntimeError(f"the Spark Connect server did not start: {self.logs()}")
            time.sleep(0.5)

    def stop_connect_server(self) -> None:
        """Stop the Connect server (its cores go back to the cluster)."""
        process = getattr(self, "_connect_process", None)
        if process is not None:
            _terminate([process])

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(self.base.glob("*.log"))
        )

    def stop(self) -> None:
        _terminate(list(reversed(self.processes)))


def _terminate(processes: list[subprocess.Popen]) -> None:
    """SIGTERM to each process group (a worker's takes its executors along), SIGKILL after 20 s."""
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
