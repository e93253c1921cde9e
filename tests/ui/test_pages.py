"""The admin in a real browser: Playwright drives Debian's chromium against a live cluster (lookupd + two nsqd +
nsqadmin, subprocesses on 127.0.0.1). Every page loads, graphs get data points, every action is performed by
clicking (with its confirmation) and its effect is checked through nsqd's HTTP API, client-supplied strings are
shown as text, and actions are refused without the admin header or the CSRF token.

One browser and one cluster serve the whole module; each test gets a fresh browser context and its own topic.
A screenshot of every page is kept under tests/artifacts/ui/ (git-ignored).
"""

from __future__ import annotations

import uuid

import pytest

from tests.admin.cluster import Cluster, http, wait_until
from tests.integration.harness import consumer
from tests.integration.http_helpers import StaticPage
from tests.ui.conftest import ARTIFACTS

playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect

ADMIN_HEADERS = {"X-Forwarded-User": "alice"}
EVIL = "<img src=x onerror=alert(1)>"
TIMEOUT_MS = 15_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("admin-ui"), ["--admin-user=alice"]).start()
    yield cluster
    cluster.stop()


class Tab:
    """One page in its own context; any JavaScript dialog or page error is recorded (and dismissed)."""

    def __init__(self, browser, cluster, headers: dict | None) -> None:
        self.cluster = cluster
        self.context = browser.new_context(extra_http_headers=headers or {}, viewport={"width": 1360, "height": 900})
        self.context.set_default_timeout(TIMEOUT_MS)
        self.page = self.context.new_page()
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.page.on("dialog", self._dialog)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))

    def _dialog(self, dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def open(self, path: str):
        self.page.goto(self.cluster.url + path)
        self.page.wait_for_selector("body[data-refreshed]")
        return self.page

    def act(self, button: str, confirm: str, result: str, scope=None) -> None:
        """Click an action button, confirm in the dialog, wait for the result message."""
        (scope or self.page).get_by_role("button", name=button, exact=True).click()
        dialog = self.page.get_by_role("dialog")
        expect(dialog).to_be_visible()
        dialog.get_by_role("button", name=confirm, exact=True).click()
        expect(self.page.locator("#flash")).to_contain_text(result)
        expect(self.page.locator("#flash")).to_have_class("flash ok")

    def wait_for_chart_points(self, minimum: int = 2) -> None:
        self.page.wait_for_function(
            "min => { const charts = [...document.querySelectorAll('svg.chart')];"
            " return charts.length > 0 && charts.every(c => Number(c.dataset.points) >= min); }",
            arg=minimum,
            timeout=30_000,
        )

    def screenshot(self, name: str) -> None:
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

    def close(self) -> None:
        self.context.close()
        assert not self.errors, f"page errors: {self.errors}"


@pytest.fixture
def tab(browser, cluster):
    tab = Tab(browser, cluster, ADMIN_HEADERS)
    yield tab
    tab.close()


@pytest.fixture
def topic() -> str:
    return f"ui_{uuid.uuid4().hex[:10]}"


def spread(cluster, topic: str, channel: str = "work", messages: int = 1) -> None:
    """``topic`` and ``channel`` on both nodes with ``messages`` published on each, visible to the admin."""
    for index in (0, 1):
        for _ in range(messages):
            cluster.publish(index, topic)
        cluster.create_channel(index, topic, channel)
    wait_until(
        lambda: len(http("GET", f"{cluster.url}/api/topics/{topic}").json().get("nodes") or []) == 2,
        message=f"{topic} on both nodes in the admin",
    )


# -- every page --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def showcase(cluster):
    """A topic with a channel on both nodes and a consumer, for the page tour."""
    name = f"orders_{uuid.uuid4().hex[:6]}"
    spread(cluster, name, "billing", messages=3)
    reader = consumer(
        cluster.nsqds[0].tcp,
        name,
        "billing",
        ready=2,
        identify_fields={
            "client_id": "billing-worker-1",
            "hostname": "worker.example",
            "user_agent": "billing-service/3.2 pynsq/0.9.1",
        },
    )
    wait_until(
        lambda: http("GET", f"{cluster.url}/api/topics/{name}/billing").json().get("clients"), message="consumer listed"
    )
    yield name
    reader.close()


PAGES = [
    ("topics", lambda t, c: "/topics", lambda t, c: ("link", t), True),
    ("topic", lambda t, c: f"/topics/{t}", lambda t, c: ("link", "billing"), True),
    ("channel", lambda t, c: f"/topics/{t}/billing", lambda t, c: ("text", "billing-service/3.2 pynsq/0.9.1"), True),
    ("nodes", lambda t, c: "/nodes", lambda t, c: ("text", c.nsqds[1].http.rpartition(":")[2]), False),
    ("node", lambda t, c: f"/nodes/{c.node_name(0)}", lambda t, c: ("link", t), True),
    ("counter", lambda t, c: "/counter", lambda t, c: ("counter", None), False),
    ("lookup", lambda t, c: "/lookup", lambda t, c: ("button", "Create"), False),
]


@pytest.mark.parametrize("name, path, marker, charts", PAGES, ids=[p[0] for p in PAGES])
def test_page_loads(tab, cluster, showcase, name, path, marker, charts):
    page = tab.open(path(showcase, cluster))
    kind, text = marker(showcase, cluster)
    if kind == "link":
        expect(page.get_by_role("link", name=text, exact=True).first).to_be_visible()
    elif kind == "text":
        expect(page.get_by_text(text, exact=True).first).to_be_visible()
    elif kind == "button":
        expect(page.get_by_role("button", name=text, exact=True)).to_be_visible()
    else:
        page.wait_for_function("() => Number(document.querySelector('#counter-total').dataset.total) >= 6")
    expect(page.locator(".page-error")).to_be_hidden()
    if charts:
        tab.wait_for_chart_points(2)
    tab.screenshot(name)
    assert tab.dialogs == []


def test_graphs_draw_rates_from_samples(tab, cluster, showcase):
    page = tab.open(f"/topics/{showcase}")
    for _ in range(3):
        cluster.publish(1, showcase)
    # the rate chart's line gets at least three points (rates need two samples each)
    page.wait_for_function("() => Number(document.querySelector('svg.chart').dataset.points) >= 3", timeout=30_000)
    assert page.locator("svg.chart").first.locator("circle").count() >= 3
    tab.page.goto(cluster.url + "/topics")
    page.get_by_label("Filter topics").fill(showcase)
    expect(page.locator(f"tr:has(a:text-is('{showcase}')) svg.sparkline")).to_be_visible()


def test_refreshes_without_reloading(tab, cluster, topic):
    spread(cluster, topic)
    page = tab.open(f"/topics/{topic}")
    messages = page.locator(".tile", has_text="Messages").locator(".tile-value")
    expect(messages).to_have_text("2")
    page.evaluate("window.__sameDocument = true")
    for _ in range(3):
        cluster.publish(0, topic)
    expect(messages).to_have_text("5")
    assert page.evaluate("window.__sameDocument === true")


# -- actions -----------------------------------------------------------------------------------------------------
def test_pause_and_unpause_topic(tab, cluster, topic):
    spread(cluster, topic)
    page = tab.open(f"/topics/{topic}")
    tab.act("Pause topic", "Pause", f"Topic “{topic}” paused.")
    assert all(cluster.topic_stats(i, topic)["paused"] for i in (0, 1))
    expect(page.locator("h1 .badge", has_text="paused")).to_be_visible()
    tab.act("Unpause topic", "Unpause", f"Topic “{topic}” unpaused.")
    assert not any(cluster.topic_stats(i, topic)["paused"] for i in (0, 1))


def test_cancelled_confirmation_changes_nothing(tab, cluster, topic):
    spread(cluster, topic)
    page = tab.open(f"/topics/{topic}")
    page.get_by_role("button", name="Delete topic", exact=True).click()
    page.get_by_role("dialog").get_by_role("button", name="Cancel").click()
    expect(page.get_by_role("dialog")).to_be_hidden()
    assert all(cluster.topic_stats(i, topic) is not None for i in (0, 1))


def test_empty_topic(tab, cluster, topic):
    for _ in range(3):
        cluster.publish(0, topic)  # no channel: the messages stay in the topic
    wait_until(lambda: http("GET", f"{cluster.url}/api/topics/{topic}").json().get("nodes"), message="topic seen")
    assert cluster.topic_stats(0, topic)["depth"] == 3
    tab.open(f"/topics/{topic}")
    tab.act("Empty queue", "Empty", f"Topic “{topic}” emptied.")
    assert cluster.topic_stats(0, topic)["depth"] == 0


def test_pause_and_empty_channel(tab, cluster, topic):
    spread(cluster, topic, messages=2)
    assert cluster.channel_stats(0, topic, "work")["depth"] == 2
    page = tab.open(f"/topics/{topic}/work")
    tab.act("Pause channel", "Pause", "Channel “work” paused.")
    assert all(cluster.channel_stats(i, topic, "work")["paused"] for i in (0, 1))
    expect(page.get_by_role("button", name="Unpause channel", exact=True)).to_be_visible()
    tab.act("Empty queue", "Empty", "Channel “work” emptied.")
    assert all(cluster.channel_stats(i, topic, "work")["depth"] == 0 for i in (0, 1))
    tab.act("Unpause channel", "Unpause", "Channel “work” unpaused.")
    assert not any(cluster.channel_stats(i, topic, "work")["paused"] for i in (0, 1))


def test_delete_channel(tab, cluster, topic):
    spread(cluster, topic)
    page = tab.open(f"/topics/{topic}/work")
    tab.act("Delete channel", "Delete", "Channel “work” deleted.")
    expect(page).to_have_url(f"{cluster.url}/topics/{topic}")
    assert all(cluster.channel_stats(i, topic, "work") is None for i in (0, 1))
    assert all(cluster.topic_stats(i, topic) is not None for i in (0, 1))


def test_delete_topic(tab, cluster, topic):
    spread(cluster, topic)
    page = tab.open(f"/topics/{topic}")
    tab.act("Delete topic", "Delete", f"Topic “{topic}” deleted.")
    expect(page).to_have_url(f"{cluster.url}/topics")
    assert all(cluster.topic_stats(i, topic) is None for i in (0, 1))


def test_tombstone_topic_on_node(tab, cluster, topic):
    spread(cluster, topic)
    node = cluster.node_name(1)
    page = tab.open(f"/nodes/{node}")
    page.get_by_label("Filter topics").fill(topic)
    row = page.locator("tr.topic-row", has=page.get_by_role("link", name=topic, exact=True))
    tab.act("Tombstone", "Tombstone", f"Topic “{topic}” tombstoned on {node}.", scope=row)
    assert cluster.topic_stats(1, topic) is None
    assert cluster.topic_stats(0, topic) is not None


def test_create_channel_from_lookup_page(tab, cluster, topic):
    spread(cluster, topic)
    page = tab.open("/lookup")
    page.get_by_label("Topic", exact=True).fill(topic)
    page.get_by_label("Channel", exact=True).fill("made_in_ui")
    tab.act("Create", "Create", f"Created topic “{topic}” with channel “made_in_ui”.")
    assert all(cluster.channel_stats(i, topic, "made_in_ui") is not None for i in (0, 1))
    expect(page.get_by_label("Topic", exact=True)).to_have_value("")


def test_lookup_page_lists_topics_without_producers(tab, cluster, topic):
    if cluster.mode != "lookupd":
        pytest.skip("nsqd does not register with nsqlookupd yet: the admin runs with --nsqd-http-address")
    page = tab.open("/lookup")
    page.get_by_label("Topic", exact=True).fill(topic)
    page.get_by_label("Channel", exact=True).fill("orphan")
    tab.act("Create", "Create", f"Created topic “{topic}” with channel “orphan”.")
    lookupd = f"http://{cluster.lookupd.http}"
    assert topic in http("GET", lookupd + "/topics").json()["topics"]
    row = page.locator("tr", has=page.get_by_role("link", name=topic, exact=True))
    expect(row.get_by_text("orphan")).to_be_visible()
    tab.act("Delete topic", "Delete", f"Topic “{topic}” deleted.", scope=row)
    assert topic not in http("GET", lookupd + "/topics").json()["topics"]


# -- safety ------------------------------------------------------------------------------------------------------
def test_client_strings_are_shown_as_text(tab, cluster, topic):
    spread(cluster, topic)
    evil = consumer(
        cluster.nsqds[0].tcp,
        topic,
        "work",
        ready=1,
        identify_fields={
            "user_agent": EVIL,
            "hostname": "<b id=injected>bold</b>",
            "client_id": "<script>alert(2)</script>",
        },
    )
    try:
        page = tab.open(f"/topics/{topic}/work")
        expect(page.get_by_text(EVIL, exact=True)).to_be_visible()
        expect(page.get_by_text("<b id=injected>bold</b>", exact=True)).to_be_visible()
        expect(page.get_by_text("<script>alert(2)</script>", exact=True)).to_be_visible()
        assert page.locator("main img").count() == 0
        assert page.locator("#injected").count() == 0
        tab.screenshot("channel-hostile-client")
        assert tab.dialogs == []
    finally:
        evil.close()


def test_read_only_user_sees_no_actions_and_is_refused(browser, cluster, topic):
    spread(cluster, topic)
    viewer = Tab(browser, cluster, {"X-Forwarded-User": "mallory"})
    try:
        page = viewer.open(f"/topics/{topic}")
        expect(page.get_by_text("Read-only view", exact=False)).to_be_visible()
        assert page.get_by_role("button", name="Pause topic").count() == 0
        status = page.evaluate(
            """async topic => {
            const config = JSON.parse(document.getElementById('nsqadmin-config').textContent);
            const response = await fetch('/api/topics/' + topic, {method: 'POST',
                headers: {'Content-Type': 'application/json', 'X-CSRF-Token': config.CSRF_TOKEN},
                body: JSON.stringify({action: 'pause'})});
            return [response.status, await response.json()];
        }""",
            topic,
        )
        assert status == [403, {"message": "FORBIDDEN"}]
        assert not any(cluster.topic_stats(i, topic)["paused"] for i in (0, 1))
        viewer.screenshot("topic-read-only")
    finally:
        viewer.close()


def test_action_without_csrf_token_is_refused_in_browser(tab, cluster, topic):
    spread(cluster, topic)
    page = tab.open(f"/topics/{topic}")
    status = page.evaluate(
        """async topic => {
        const response = await fetch('/api/topics/' + topic, {method: 'POST',
            headers: {'Content-Type': 'application/json'}, body: JSON.stringify({action: 'pause'})});
        return [response.status, await response.json()];
    }""",
        topic,
    )
    assert status == [403, {"message": "INVALID_CSRF_TOKEN"}]
    assert not any(cluster.topic_stats(i, topic)["paused"] for i in (0, 1))


def attacker_page(admin_url: str, topic: str) -> StaticPage:
    """A page on another origin (another port of 127.0.0.1) that posts to the admin as soon as it loads: a form
    whose text/plain body reads as the JSON of an action (no CORS preflight for a form), and a no-cors fetch."""
    return StaticPage(
        f"""<!doctype html><body>
        <form id=f method=POST action="{admin_url}/api/topics/{topic}" enctype="text/plain">
          <input name='{{"action":"pause","x":"' value='"}}'></form>
        <script>
          fetch("{admin_url}/api/topics/{topic}/work", {{method: "POST", mode: "no-cors",
                headers: {{"Content-Type": "text/plain"}}, body: JSON.stringify({{action: "empty"}})}})
            .finally(() => document.getElementById("f").submit());
        </script></body>""".encode()
    )


def test_cross_origin_page_cannot_act_but_a_plain_client_can(tab, cluster, topic):
    """The user's browser carries the proxy's user header to every request (the context's extra headers), yet a
    page of another origin is refused, while a script with no browser signals needs no token."""
    spread(cluster, topic)
    attacker = attacker_page(cluster.url, topic)
    try:
        with tab.page.expect_response(lambda r: r.url.endswith(f"/api/topics/{topic}")) as answer:
            tab.page.goto(attacker.url)
        assert (answer.value.status, answer.value.json()) == (403, {"message": "CROSS_ORIGIN_REQUEST"})
        cluster.admin.wait_for_log(rf"403 POST /api/topics/{topic}/work ", 10)  # the fetch arrived, and failed
        assert not any(cluster.topic_stats(i, topic)["paused"] for i in (0, 1))
        assert all(cluster.channel_stats(i, topic, "work")["depth"] == 1 for i in (0, 1))
    finally:
        attacker.close()
    script = http("POST", f"{cluster.url}/api/topics/{topic}", {"action": "pause"}, ADMIN_HEADERS)
    assert (script.status, script.json()) == (200, {"message": ""})
    assert all(cluster.topic_stats(i, topic)["paused"] for i in (0, 1))
