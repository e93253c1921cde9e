"""Where the write-ahead log may live (``spark_connector.placement``) and a walPath that lost its
log: refused in durable mode, continued from the checkpoint in commit mode."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from spark_connector.options import SourceOptions
from spark_connector.placement import filesystem_of
from spark_connector.stream_reader import make_offset, parse_offset
from tests.integration.harness import REPO_ROOT
from tests.spark.conftest import bodies, publish, wait_until
from tests.spark.test_consumer import make_reader

pytestmark = pytest.mark.timeout(120)

# A child of a process whose command line names Spark's standalone driver launcher, as a driver
# started in cluster deploy mode is; it checks the placement and prints the outcome.
_CHILD = """
import json, sys
from spark_connector.options import SourceOptions
from spark_connector.placement import check_placement
try:
    check_placement(SourceOptions.parse(json.loads(sys.argv[1])))
    print("ACCEPTED")
except ValueError as exc:
    print("REFUSED", exc)
"""
_PARENT = (
    "import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', sys.argv[1], sys.argv[2]]).returncode)"
)


def placement_under_cluster_driver(options: dict) -> str:
    argv = [sys.executable, "-c", _PARENT, _CHILD, json.dumps(options), "org.apache.spark.deploy.worker.DriverWrapper"]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def source_options(tmp_path, **extra) -> dict:
    return {
        "nsqd.tcp.addresses": "127.0.0.1:4150",
        "topic": "t",
        "channel": "c",
        "walPath": str(tmp_path / "wal"),
        **extra,
    }


def test_durable_mode_on_a_local_disk_is_refused_for_a_cluster_mode_driver(tmp_path):
    outcome = placement_under_cluster_driver(source_options(tmp_path))
    assert outcome.startswith("REFUSED nsq source: ackMode=durable with walPath")
    assert "standalone cluster deploy mode" in outcome
    assert "Use ackMode=commit" in outcome


@pytest.mark.parametrize("extra", [{"ackMode": "commit"}, {"walPathShared": "true"}])
def test_commit_mode_or_shared_storage_is_accepted_for_a_cluster_mode_driver(tmp_path, extra):
    assert placement_under_cluster_driver(source_options(tmp_path, **extra)) == "ACCEPTED"


def test_durable_mode_on_a_local_disk_warns_when_the_deploy_mode_is_unknown(tmp_path, caplog):
    from spark_connector.placement import check_placement

    with caplog.at_level("WARNING", logger="spark_connector.placement"):
        check_placement(SourceOptions.parse(source_options(tmp_path)))
    assert "safe only if the driver always restarts on this machine" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="spark_connector.placement"):
        check_placement(SourceOptions.parse(source_options(tmp_path, ackMode="commit")))
    assert caplog.text == ""


def test_filesystem_of_a_path_that_does_not_exist_yet(tmp_path):
    assert filesystem_of(tmp_path / "not" / "yet") == filesystem_of(tmp_path)
    assert filesystem_of("/proc/self") == "proc"


def test_empty_wal_path_continues_from_the_checkpoint_in_commit_mode(tmp_path, nsqd_at, topic):
    nsqd = nsqd_at()
    reader = make_reader(tmp_path, **{"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic, "ackMode": "commit"})
    try:
        # Spark re-runs a batch [400, 500) the lost log held: nothing of it is here any more
        assert reader.partitions(make_offset({nsqd.tcp_address: 400}), make_offset({nsqd.tcp_address: 500})) == []
        publish(nsqd, topic, bodies("c", 0, 10))
        start = make_offset({nsqd.tcp_address: 500})

        def reached():
            end = reader.latestOffset(start, ReadAllAvailable())
            return end if parse_offset(end).get(nsqd.tcp_address) == 510 else None

        end = wait_until(reached, 30, "ten messages logged after position 500")
        [part] = reader.partitions(start, end)
        assert (part.start, part.end) == (500, 510)
        reader.commit(end)
    finally:
        reader.stop()
