"""The node page's replication card in a real browser: Playwright drives Debian's chromium against three trionsq
nodes (A keeps copies on B and C, one acknowledgement required) and a real nsqadmin in nsqd mode.

A's card lists its peers with their state and what they have not acknowledged; B's card lists the copies it
holds for A with a takeover button, which asks first: cancelling changes nothing, confirming makes B adopt A's
messages (checked through B's ``/stats``). A screenshot goes to tests/artifacts/ui/replication-card.png.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.admin.cluster import Daemon, http, wait_until
from tests.integration.harness import RawClient, free_port
from tests.ui.test_pages import ADMIN_HEADERS, Tab, expect


@pytest.fixture
def ring(tmp_path):
    """Nodes A (origin), B and C (its replicas) and an admin that knows all three."""
    started: list[Daemon] = []

    def start(module: str, args: list[str]) -> Daemon:
        daemon = Daemon(module, args).start()
        started.append(daemon)
        return daemon

    ports = {name: free_port() for name in "abc"}

    def nsqd(name: str, *args: str) -> Daemon:
        (tmp_path / name).mkdir()
        return start(
            "nsqd",
            [
                f"--tcp-address=127.0.0.1:{ports[name]}",
                "--http-address=127.0.0.1:0",
                "--broadcast-address=127.0.0.1",
                f"--data-path={tmp_path / name}",
                *args,
            ],
        )

    b, c = nsqd("b"), nsqd("c")
    a = nsqd(
        "a", f"--replicate-to=127.0.0.1:{ports['b']}", f"--replicate-to=127.0.0.1:{ports['c']}", "--replication-acks=1"
    )
    admin = start(
        "admin",
        [
            "--http-address=127.0.0.1:0",
            "--admin-user=alice",
            "--history-interval=1s",
            *(f"--nsqd-http-address={d.http}" for d in (a, b, c)),
        ],
    )
    try:
        yield SimpleNamespace(
            a=a,
            b=b,
            c=c,
            admin=admin,
            url=f"http://{admin.http}",
            nodes={name: f"127.0.0.1:{port}" for name, port in ports.items()},
        )
    finally:
        for daemon in reversed(started):
            if daemon.is_running():
                daemon.kill()


@pytest.fixture
def tab(browser, ring):
    tab = Tab(browser, ring, ADMIN_HEADERS)
    yield tab
    tab.close()


def _page_name(daemon: Daemon) -> str:
    """The node as the admin names it: the address of its HTTP port."""
    return "127.0.0.1:" + daemon.http.rpartition(":")[2]


def _replication(daemon: Daemon) -> dict:
    return http("GET", f"http://{daemon.http}/stats?format=json").json()["replication"]


def test_replication_card_shows_peers_and_takes_over_after_confirmation(tab, ring):
    wait_until(
        lambda: [p["state"] for p in _replication(ring.a)["peers"]] == ["connected", "connected"],
        message="A replicating to B and C",
    )
    origin = ring.nodes["a"]
    with RawClient(("127.0.0.1", int(origin.rpartition(":")[2]))) as producer:
        producer.publish_many("t", [b"m%d" % i for i in range(3)])
    wait_until(
        lambda: [p["pending_messages"] for p in _replication(ring.a)["peers"]] == [0, 0], message="held by B and C"
    )
    ring.c.kill()  # C falls behind: what A publishes now is held by B only
    wait_until(lambda: _replication(ring.a)["peers"][1]["state"] != "connected", message="C gone")
    with RawClient(("127.0.0.1", int(origin.rpartition(":")[2]))) as producer:
        producer.publish_many("t", [b"late1", b"late2"])

    page = tab.open(f"/nodes/{_page_name(ring.a)}")
    card = page.locator("section.card", has=page.get_by_role("heading", name="Replication", exact=True))
    expect(card.locator(".card-head")).to_contain_text("replicating")
    peers = card.locator("table").first.locator("tbody tr")
    expect(peers).to_have_count(2)
    expect(peers.nth(0)).to_contain_text(ring.nodes["b"])
    expect(peers.nth(0).locator(".badge")).to_have_text("connected")
    expect(peers.nth(0).locator("td").nth(2)).to_have_text("0")
    expect(peers.nth(1)).to_contain_text(ring.nodes["c"])
    expect(peers.nth(1).locator(".badge").first).not_to_have_text("connected")
    expect(peers.nth(1).locator("td").nth(2)).to_have_text("2")  # its lag: the two it did not acknowledge
    tab.screenshot("replication-card-origin")

    ring.a.kill()  # the origin dies: B holds its five messages
    page = tab.open(f"/nodes/{_page_name(ring.b)}")
    card = page.locator("section.card", has=page.get_by_role("heading", name="Replication", exact=True))
    held = card.locator("tr", has_text=origin)
    expect(held).to_contain_text("5")
    expect(held.locator(".badge")).to_have_text("gone")
    expect(card).to_contain_text("Takeovers: 0")

    held.get_by_role("button", name="Take over", exact=True).click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(f"the 5 unfinished message(s) it holds for {origin}")
    dialog.get_by_role("button", name="Cancel", exact=True).click()
    expect(dialog).to_have_count(0)
    replication = _replication(ring.b)
    assert replication["takeovers"] == 0
    assert [r["held_messages"] for r in replication["replicas"] if r["node"] == origin] == [5]
    assert not http("GET", f"http://{ring.b.http}/stats?format=json&topic=t").json()["topics"]  # nothing adopted

    held.get_by_role("button", name="Take over", exact=True).click()
    dialog.get_by_role("button", name="Take over", exact=True).click()
    expect(page.locator("#flash")).to_contain_text(f"Messages of {origin} adopted by {_page_name(ring.b)}")
    topics = http("GET", f"http://{ring.b.http}/stats?format=json&topic=t").json()["topics"]
    assert [(t["topic_name"], t["depth"]) for t in topics] == [("t", 5)]
    assert _replication(ring.b)["takeovers"] == 1
    expect(card).to_contain_text("Takeovers: 1, messages adopted: 5, duplicates after takeover: 0")
    expect(held.get_by_role("button", name="Take over", exact=True)).to_have_count(0)
    tab.screenshot("replication-card")
