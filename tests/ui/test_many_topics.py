"""The admin at size, in a real browser: 10,000 topics on 10 nsqd (1,000 each, registered with nsqlookupd).

Each nsqd starts with its topics in ``nsqd.dat`` (creating 10,000 topics one by one over HTTP takes minutes on
two cores). The topics page shows one page of rows whatever the number of topics, its filter box narrows them down, its
refreshes redraw only that page, and the node list and a node's page stay short. Screenshots go to
tests/artifacts/ui/ (``many-topics.png``, ``many-nodes.png``).
"""

from __future__ import annotations

import pytest

from tests.admin.cluster import Cluster, http, wait_until
from tests.ui.test_pages import ADMIN_HEADERS, Tab, expect

NODES = 10
TOPICS_PER_NODE = 1000
PAGE_ROWS = 50


def topic_name(node: int, number: int) -> str:
    return f"tenant{number:04d}_n{node}"


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    # each nsqd starts with its 1,000 topics in nsqd.dat and registers them with lookupd as it connects
    cluster = Cluster(
        tmp_path_factory.mktemp("admin-many"),
        ["--admin-user=alice"],
        nodes=NODES,
        topics=lambda node: [topic_name(node, n) for n in range(TOPICS_PER_NODE)],
        history_interval="2s",
        stop_timeout=60.0,
    ).start()
    try:
        total = NODES * TOPICS_PER_NODE
        wait_until(
            lambda: len(_get(cluster.url + "/api/topics")["topics"]) == total,
            timeout=60,
            interval=0.5,
            message=f"{total} topics in the admin",
        )
        yield cluster
    finally:
        cluster.stop()


def _get(url: str) -> dict:
    return http("GET", url, timeout=30).json()


@pytest.fixture
def tab(browser, big):
    tab = Tab(browser, big, ADMIN_HEADERS)
    yield tab
    tab.close()


def test_topics_page_with_10000_topics_pages_and_filters(tab, big):
    page = tab.open("/topics")
    expect(page.locator(".subtitle")).to_contain_text("10,000 topics in the cluster")
    rows = page.locator("tr.topic-row")
    expect(rows).to_have_count(PAGE_ROWS)
    expect(page.locator(".pager-count")).to_have_text("1–50 of 10,000")
    expect(rows.first.get_by_role("link")).to_have_text(topic_name(0, 0))
    # the sparklines of the rows shown arrive with the rates, once two samples exist
    page.wait_for_function(
        "() => { const lines = [...document.querySelectorAll('tr.topic-row svg.sparkline')];"
        " return lines.length === 50 && lines.every(s => Number(s.dataset.points) >= 2); }",
        timeout=30_000,
    )
    tab.screenshot("many-topics")

    # a refresh redraws the 50 rows of the page, not the 10,000
    page.evaluate("window.__sameDocument = true")
    refreshed = page.evaluate("document.body.dataset.refreshed")
    page.wait_for_function("r => document.body.dataset.refreshed !== r", arg=refreshed, timeout=30_000)
    assert page.locator("tbody tr").count() == PAGE_ROWS
    assert page.evaluate("window.__sameDocument === true")

    search = page.get_by_label("Filter topics")
    search.fill("tenant0042_")
    expect(rows).to_have_count(NODES)
    expect(page.locator(".pager-count")).to_have_text("10 matching (of 10,000) topics")
    expect(rows.first.get_by_role("link")).to_have_text(topic_name(0, 42))
    search.fill("tenant012")  # tenant0120..0129 on every node: 100 topics, two pages
    expect(page.locator(".pager-count")).to_have_text("1–50 of 100 matching (of 10,000)")
    page.get_by_role("button", name="Next ›").click()
    expect(page.locator(".pager-count")).to_have_text("51–100 of 100 matching (of 10,000)")
    expect(rows).to_have_count(PAGE_ROWS)
    search.fill(topic_name(7, 999))
    expect(rows).to_have_count(1)
    expect(page.locator(".pager-count")).to_have_text("1 matching (of 10,000) topics")
    tab.screenshot("many-topics-filtered")
    page.get_by_role("link", name=topic_name(7, 999), exact=True).click()
    expect(page.locator("h1 .title-text")).to_have_text(topic_name(7, 999))


def test_nodes_pages_with_1000_topics_each(tab, big):
    page = tab.open("/nodes")
    expect(page.locator("a.chip.more")).to_have_count(NODES)
    expect(page.locator("a.chip.more").first).to_have_text("+ 988 more")
    tab.screenshot("many-nodes")
    page.locator("a.chip.more").first.click()
    expect(page.locator(".tile", has_text="Topics").locator(".tile-value")).to_have_text("1,000")
    rows = page.locator("tr.topic-row")
    expect(rows).to_have_count(25)
    page.get_by_label("Filter topics").fill("tenant0999")
    expect(rows).to_have_count(1)


def test_lookup_page_with_10000_produced_topics(tab, big):
    # every topic has a producer: the page says so without asking lookupd about each topic in turn
    page = tab.open("/lookup")
    expect(page.get_by_text("Every topic registered in lookupd has a producer.")).to_be_visible()
