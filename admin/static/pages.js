/* The admin's pages. Each page is {section, create(params)} where create returns an object with
 * mount(root) (builds the page's fixed frame once) and refresh() (fetches and redraws the changing parts;
 * called at once and then every few seconds without reloading the page). See app.js for the safety rule:
 * everything from the cluster is added as text.
 */
(function () {
  "use strict";

  var A = window.NSQAdmin;
  var h = A.h;
  var fmtInt = A.fmtInt;
  var fmtRate = A.fmtRate;
  var seg = A.seg;
  var IS_ADMIN = A.CONFIG.IS_ADMIN;
  var LineChart = window.NSQChart.LineChart;
  var sparkline = window.NSQChart.sparkline;

  // -- shared pieces --------------------------------------------------------------------------------------
  function frame(root, crumbs, title, subtitle) {
    var page = {};
    page.header = h("div", {"class": "page-head"});
    page.badges = h("span", {"class": "badges"});
    page.actions = h("div", {"class": "actions"});
    var trail = crumbs.length ? h("nav", {"class": "crumbs", "aria-label": "Breadcrumb"}, crumbs.map(function (c, i) {
      return [i ? h("span", {"class": "sep"}, "›") : null, c.href ? h("a", {href: c.href}, c.text) : h("span", null, c.text)];
    })) : null;
    page.subtitle = h("p", {"class": "subtitle"}, subtitle || "");
    page.header.append(h("div", null, trail, h("h1", null, h("span", {"class": "title-text"}, title), page.badges),
      page.subtitle), page.actions);
    page.error = h("div", {"class": "page-error", role: "alert", hidden: true});
    page.body = h("div", {"class": "page-body"});
    root.append(page.header, page.error, page.body);
    return page;
  }

  function card(title, extra) {
    var body = h("div", {"class": "card-body"});
    var el = h("section", {"class": "card"}, h("div", {"class": "card-head"}, h("h2", null, title), extra || null), body);
    return {el: el, body: body};
  }

  function tiles(items) {
    return h("div", {"class": "tiles"}, items.map(function (item) {
      return h("div", {"class": "tile" + (item.warn ? " warn" : "")}, h("div", {"class": "tile-value"}, item.value),
        h("div", {"class": "tile-label"}, item.label));
    }));
  }

  /* columns: [{label, num}] ; rows: arrays of cells (text or nodes), or {cls, cells} ; options.total: a last
   * row in bold ; options.empty: the text of an empty table */
  function table(columns, rows, options) {
    options = options || {};
    var body = h("tbody", null, tableRows(columns, rows, options.empty));
    var foot = options.total ? h("tfoot", null, tableRows(columns, [options.total])) : null;
    return h("div", {"class": "table-wrap"}, h("table", {"class": options.cls || "data"}, tableHead(columns), body, foot));
  }

  function tableHead(columns) {
    return h("thead", null, h("tr", null, columns.map(function (c) {
      return h("th", {"class": c.num ? "num" : null, scope: "col", title: c.title || null}, c.label);
    })));
  }

  function tableRows(columns, rows, empty) {
    if (!rows.length && empty) return [h("tr", null, h("td", {colspan: columns.length, "class": "empty"}, empty))];
    return rows.map(function (row) {
      var cells = row.cells || row;
      return h("tr", {"class": row.cls || null}, cells.map(function (cell, i) {
        return h("td", {"class": columns[i] && columns[i].num ? "num" : null}, cell);
      }));
    });
  }

  /* A table over many items with one page of them in the document: a filter box (a case-insensitive part of
   * each item's name), an optional sort and a pager. The frame is built once; update(items) (each refresh),
   * typing, sorting and paging redraw only the current page's rows, so a refresh costs the same with 10 items
   * or 10,000. options: noun ("topics"), name(item), rows(item) -> table rows, pageSize, empty (text),
   * sorts ({label: compare(a, b)}, the first is the default), onPage(items shown), called after each redraw. */
  function PagedTable(columns, options) {
    var self = this;
    function again() { self.page = 0; self.draw(); }
    this.columns = columns;
    this.options = options;
    this.items = [];
    this.shown = [];
    this.page = 0;
    this.filter = h("input", {type: "search", "class": "filter", placeholder: "Filter " + options.noun + "…",
      "aria-label": "Filter " + options.noun, autocomplete: "off", oninput: again});
    this.sort = options.sorts ? h("select", {"class": "sort", "aria-label": "Sort " + options.noun, onchange: again},
      Object.keys(options.sorts).map(function (label) { return h("option", {value: label}, label); })) : null;
    this.count = h("span", {"class": "pager-count", "aria-live": "polite"});
    this.prev = button("‹ Previous", {cls: "small", onclick: function () { self.page--; self.draw(); }});
    this.next = button("Next ›", {cls: "small", onclick: function () { self.page++; self.draw(); }});
    this.body = h("tbody");
    this.el = h("div", {"class": "paged"}, h("div", {"class": "table-tools"}, this.filter,
      this.sort ? h("label", {"class": "sort-label"}, "Sort by ", this.sort) : null,
      h("span", {"class": "pager"}, this.count, this.prev, this.next)),
      h("div", {"class": "table-wrap"}, h("table", {"class": "data"}, tableHead(columns), this.body)));
  }

  PagedTable.prototype.update = function (items) {
    this.items = items;
    this.draw();
  };

  PagedTable.prototype.draw = function () {
    var text = this.filter.value.trim().toLowerCase();
    var name = this.options.name;
    var found = text ? this.items.filter(function (item) { return name(item).toLowerCase().indexOf(text) >= 0; })
      : this.items.slice();
    if (this.sort) found.sort(this.options.sorts[this.sort.value]);
    var size = this.options.pageSize || 50;
    var pages = Math.max(1, Math.ceil(found.length / size));
    this.page = Math.min(Math.max(0, this.page), pages - 1);
    var first = this.page * size;
    this.shown = found.slice(first, first + size);
    var rows = [];
    var build = this.options.rows;
    this.shown.forEach(function (item) { rows.push.apply(rows, build(item)); });
    A.replaceChildren(this.body, tableRows(this.columns, rows, text ? "No " + this.options.noun + " match “" +
      this.filter.value.trim() + "”." : this.options.empty));
    var of = fmtInt(found.length) + (found.length !== this.items.length ? " matching (of " + fmtInt(this.items.length) + ")" : "");
    this.count.textContent = found.length > this.shown.length ? fmtInt(first + 1) + "–" + fmtInt(first + this.shown.length) + " of " + of
      : of + " " + this.options.noun;
    this.prev.hidden = this.next.hidden = pages === 1;
    this.prev.disabled = this.page === 0;
    this.next.disabled = this.page >= pages - 1;
    if (this.options.onPage) this.options.onPage(this.shown);
  };

  function badge(text, kind, title) { return h("span", {"class": "badge " + (kind || ""), title: title || null}, text); }

  function button(label, options) {
    return h("button", {type: "button", "class": "btn " + (options.cls || ""), onclick: options.onclick,
      title: options.title || null}, label);
  }

  function chartPair(container, first, second) {
    var grid = h("div", {"class": "charts"});
    container.append(grid);
    return [new LineChart(grid, first), new LineChart(grid, second)];
  }

  /* The published rate and the depth of a sampled history, in a chartPair. */
  function publishedAndQueued(charts, history) {
    charts[0].update(history.timestamps, [{label: "published/s", values: history.rate}]);
    charts[1].update(history.timestamps, [{label: "depth", values: history.depth}]);
  }

  function readOnlyNote() {
    return IS_ADMIN ? null : h("p", {"class": "note"}, "Read-only view: actions are available to admin users only.");
  }

  function e2eCard(title, rows) {
    var present = rows.filter(function (r) { return r.e2e && r.e2e.count > 0 && r.e2e.percentiles && r.e2e.percentiles.length; });
    if (!present.length) return null;
    var quantiles = present[0].e2e.percentiles.map(function (p) { return p.quantile; });
    var c = card(title);
    c.body.append(table([{label: "Node"}].concat(quantiles.map(function (q) {
      return {label: "p" + Math.round(q * 1000) / 10, num: true};
    })), present.map(function (r) {
      var byQ = {};
      r.e2e.percentiles.forEach(function (p) { byQ[p.quantile] = p; });
      return [r.label].concat(quantiles.map(function (q) {
        var p = byQ[q];
        if (!p) return "–";
        return p.min !== p.max ? A.fmtLatency(p.average) + " (" + A.fmtLatency(p.min) + "–" + A.fmtLatency(p.max) + ")"
          : A.fmtLatency(p.value);
      }));
    })));
    return c.el;
  }

  /* The latency card of a topic or channel summed over nodes: one row per node, and the total when several. */
  function nodesE2eCard(total) {
    var nodes = total.nodes || [];
    return e2eCard("End-to-end processing latency", nodes.map(function (n) {
      return {label: n.node, e2e: n.e2e_processing_latency};
    }).concat(nodes.length > 1 ? [{label: "All nodes", e2e: total.e2e_processing_latency}] : []));
  }

  function topicLink(topic) { return h("a", {href: "/topics/" + seg(topic)}, topic); }
  function channelLink(topic, channel) { return h("a", {href: "/topics/" + seg(topic) + "/" + seg(channel)}, channel); }
  function nodeLink(node, text) { return h("a", {href: "/nodes/" + seg(node)}, text || node); }

  function pausedBadge(paused) { return paused ? badge("paused", "paused") : null; }

  function tombstoneButton(topic, node) {
    if (!IS_ADMIN) return null;
    return button("Tombstone", {cls: "small danger-ghost", title: "Remove topic " + topic + " from " + node,
      onclick: function () {
        A.runAction({title: "Tombstone topic", danger: true, confirm: "Tombstone",
          text: "Tombstone topic “" + topic + "” on " + node + "? Lookupd stops listing the node for this topic and the topic is deleted on that node, with its messages.",
          call: function () { return A.api("DELETE", "/nodes/" + seg(node), {topic: topic}); },
          done: "Topic “" + topic + "” tombstoned on " + node + "."});
      }});
  }

  // -- topics ---------------------------------------------------------------------------------------------
  function byName(a, b) { return a < b ? -1 : a > b ? 1 : 0; }

  /* Sort names by a number of their entry in stats (largest first, then by name; names without one last). */
  function byStat(stats, field) {
    return function (a, b) {
      var x = stats()[a], y = stats()[b];
      var u = x && x[field] !== null ? x[field] : -1, v = y && y[field] !== null ? y[field] : -1;
      return v - u || byName(a, b);
    };
  }

  A.pages.topics = {section: "topics", create: function () {
    var page = {};
    var history = {topics: {}};
    var sparkTimer = null;
    function stats() { return history.topics || {}; }
    /* the sparklines of the topics on the page (the overview carries them only for the topics named) */
    function sparkQuery(names) { return "/history?spark=" + names.map(seg).join(","); }
    function fetchSparks(shown) {
      var missing = shown.filter(function (name) { return stats()[name] && !stats()[name].rates; });
      clearTimeout(sparkTimer);
      if (!missing.length) return;
      sparkTimer = setTimeout(function () {
        A.api("GET", sparkQuery(missing)).then(function (data) {
          if (!A.isCurrent(page)) return;
          missing.forEach(function (name) {
            var entry = stats()[name];
            if (entry && !entry.rates) entry.rates = ((data.topics || {})[name] || {}).rates || [];
          });
          page.table.draw();
        }, function () {});
      }, 150);
    }
    page.mount = function (root) {
      page.frame = frame(root, [], "Topics", "");
      page.errorBox = page.frame.error;
      var charts = card("Cluster throughput");
      page.charts = chartPair(charts.body, {title: "Messages published / s (all topics)"}, {title: "Messages queued (all topics and channels)"});
      page.table = new PagedTable([{label: "Topic"}, {label: "Depth", num: true}, {label: "Messages", num: true},
        {label: "Rate (msg/s)", num: true}, {label: "Recent rate"}], {
        noun: "topics", name: function (name) { return name; }, onPage: fetchSparks,
        sorts: {"name": byName, "depth": byStat(stats, "depth"), "rate": byStat(stats, "rate"),
          "messages": byStat(stats, "message_count")},
        empty: "No topics yet. Publish a message to an nsqd, or create a topic on the Lookup page.",
        rows: function (name) {
          var t = stats()[name];
          return [{cls: "topic-row", cells: [topicLink(name), t ? fmtInt(t.depth) : "–", t ? fmtInt(t.message_count) : "–",
            t ? fmtRate(t.rate) : "–", t ? sparkline(t.rates || []) : h("span", {"class": "muted"}, "no producer")]}];
        }});
      var list = card("All topics");
      list.body.append(page.table.el);
      page.frame.body.append(charts.el, list.el);
    };
    page.refresh = function () {
      return Promise.all([A.api("GET", "/topics"), A.api("GET", sparkQuery(page.table.shown))]).then(function (r) {
        if (!A.isCurrent(page)) return;
        var names = r[0].topics || [];
        history = r[1];
        page.frame.subtitle.textContent = fmtInt(names.length) + (names.length === 1 ? " topic" : " topics") +
          " in the cluster" + (r[0].message ? " — " + r[0].message : "");
        publishedAndQueued(page.charts, history);
        page.table.update(names);
      });
    };
    return page;
  }};

  /* The fixed part of a page about one topic, channel or node: the document title, the frame, the read-only
   * note, the tiles and a card with two charts (o: {name, crumbs, title, subtitle, charts: [first, second]});
   * the page appends its own parts after them. */
  function detailFrame(page, root, o) {
    document.title = o.name + " · nsqadmin";
    page.frame = frame(root, o.crumbs, o.title, o.subtitle);
    page.errorBox = page.frame.error;
    page.tiles = h("div");
    var charts = card("Throughput and depth");
    page.charts = chartPair(charts.body, {title: o.charts[0]}, {title: o.charts[1]});
    A.add(page.frame.body, readOnlyNote(), page.tiles, charts.el);
  }

  /* The pause, empty and delete buttons of a topic or channel page (admin users only). o: {kind ("topic" or
   * "channel"), name, path (under /api), pause, unpause, empty, remove (the confirmations' texts), back (where
   * the page goes after a deletion)}. page.paused, kept by showPaused, says what the first button does. */
  function queueActions(page, o) {
    if (!IS_ADMIN) return;
    var named = o.kind.charAt(0).toUpperCase() + o.kind.slice(1) + " “" + o.name + "” ";
    page.pauseButton = button("Pause " + o.kind, {onclick: function () {
      var action = page.paused ? "unpause" : "pause";
      A.runAction({title: (page.paused ? "Unpause " : "Pause ") + o.kind, confirm: page.paused ? "Unpause" : "Pause",
        text: page.paused ? o.unpause : o.pause,
        call: function () { return A.api("POST", o.path, {action: action}); },
        done: named + action + "d."});
    }});
    page.frame.actions.append(page.pauseButton,
      button("Empty queue", {cls: "warn", onclick: function () {
        A.runAction({title: "Empty " + o.kind, danger: true, confirm: "Empty", text: o.empty,
          call: function () { return A.api("POST", o.path, {action: "empty"}); }, done: named + "emptied."});
      }}),
      button("Delete " + o.kind, {cls: "danger", onclick: function () {
        A.runAction({title: "Delete " + o.kind, danger: true, confirm: "Delete", text: o.remove,
          call: function () { return A.api("DELETE", o.path); }, done: named + "deleted.",
          after: function () { A.navigate(o.back); }});
      }}));
  }

  function showPaused(page, kind, paused) {
    page.paused = paused;
    A.replaceChildren(page.frame.badges, pausedBadge(paused));
    if (page.pauseButton) page.pauseButton.textContent = (paused ? "Unpause " : "Pause ") + kind;
  }

  // -- topic ----------------------------------------------------------------------------------------------
  A.pages.topic = {section: "topics", create: function (params) {
    var topic = params.topic;
    var page = {};
    page.mount = function (root) {
      detailFrame(page, root, {name: topic, crumbs: [{text: "Topics", href: "/topics"}, {text: topic}], title: topic,
        subtitle: "Topic", charts: ["Messages published / s", "Messages queued"]});
      page.nodes = h("div");
      page.channels = h("div");
      page.e2e = h("div");
      A.add(page.frame.body, page.nodes, page.channels, page.e2e);
      queueActions(page, {kind: "topic", name: topic, path: "/topics/" + seg(topic), back: "/topics",
        pause: "Pause topic “" + topic + "” on every node? Messages keep queueing in the topic but no channel receives them until it is unpaused.",
        unpause: "Resume copying messages of “" + topic + "” to its channels on every node?",
        empty: "Delete every message queued in topic “" + topic + "” (memory and disk) on every node? Channel queues are not touched.",
        remove: "Delete topic “" + topic + "” with all its channels and messages on every node and in lookupd?"});
    };
    page.refresh = function () {
      return Promise.all([A.api("GET", "/topics/" + seg(topic)), A.api("GET", "/history/topics/" + seg(topic))]).then(function (r) {
        if (!A.isCurrent(page)) return;
        var t = r[0];
        var history = r[1];
        showPaused(page, "topic", !!t.paused);
        page.frame.subtitle.textContent = "Topic on " + (t.nodes || []).length + " node" + ((t.nodes || []).length === 1 ? "" : "s") +
          (t.message ? " — " + t.message : "");
        var lastRate = history.rate.length ? history.rate[history.rate.length - 1] : null;
        var inFlight = 0, deferred = 0;
        (t.channels || []).forEach(function (c) { inFlight += c.in_flight_count; deferred += c.deferred_count; });
        A.replaceChildren(page.tiles, tiles([
          {label: "Depth", value: fmtInt(t.depth)}, {label: "Memory + disk", value: fmtInt(t.memory_depth) + " + " + fmtInt(t.backend_depth)},
          {label: "Messages", value: fmtInt(t.message_count)}, {label: "Rate (msg/s)", value: fmtRate(lastRate)},
          {label: "In flight", value: fmtInt(inFlight)}, {label: "Deferred", value: fmtInt(deferred)},
          {label: "Channels", value: fmtInt((t.channels || []).length)}].concat(t.damaged_count ?
          [{label: "Damaged on disk", value: fmtInt(t.damaged_count), warn: true}] : [])));
        page.charts[0].update(history.timestamps, [{label: "published/s", values: history.rate}]);
        page.charts[1].update(history.timestamps, [{label: "topic depth", values: history.depth},
          {label: "channels depth", values: history.channel_depth}]);

        var nodeRates = history.node_rates || {};
        var nodeRows = (t.nodes || []).map(function (n) {
          var nf = 0, nd = 0;
          (n.channels || []).forEach(function (c) { nf += c.in_flight_count; nd += c.deferred_count; });
          return [nodeLink(n.node, n.hostname ? n.hostname + " (" + n.node + ")" : n.node), fmtInt(n.depth), fmtInt(n.memory_depth),
            fmtInt(n.backend_depth), fmtInt(nf), fmtInt(nd), fmtInt(n.message_count), fmtRate(nodeRates[n.node]),
            fmtInt((n.channels || []).length), pausedBadge(n.paused), tombstoneButton(topic, n.node)];
        });
        var nodes = card("Nodes");
        nodes.body.append(table([{label: "Node"}, {label: "Depth", num: true}, {label: "Memory", num: true}, {label: "Disk", num: true},
          {label: "In flight", num: true}, {label: "Deferred", num: true}, {label: "Messages", num: true},
          {label: "Rate (msg/s)", num: true}, {label: "Channels", num: true}, {label: "State"}, {label: ""}], nodeRows,
          {empty: "No node produces this topic.", total: nodeRows.length > 1 ? ["Total", fmtInt(t.depth), fmtInt(t.memory_depth),
            fmtInt(t.backend_depth), fmtInt(inFlight), fmtInt(deferred), fmtInt(t.message_count), fmtRate(lastRate), "", "", ""] : null}));
        A.replaceChildren(page.nodes, nodes.el);

        var channelRates = history.channel_rates || {};
        var channels = card("Channels");
        channels.body.append(table([{label: "Channel"}, {label: "Depth", num: true}, {label: "Memory", num: true},
          {label: "Disk", num: true}, {label: "In flight", num: true}, {label: "Deferred", num: true},
          {label: "Requeued", num: true}, {label: "Timed out", num: true}, {label: "Messages", num: true},
          {label: "Rate (msg/s)", num: true}, {label: "Connections", num: true}, {label: "State"}],
          (t.channels || []).map(function (c) {
            return [channelLink(topic, c.channel_name), fmtInt(c.depth), fmtInt(c.memory_depth), fmtInt(c.backend_depth),
              fmtInt(c.in_flight_count), fmtInt(c.deferred_count), fmtInt(c.requeue_count), fmtInt(c.timeout_count),
              fmtInt(c.message_count), fmtRate(channelRates[c.channel_name]), fmtInt(c.client_count), pausedBadge(c.paused)];
          }), {empty: "No channels: messages stay in the topic until a consumer subscribes or a channel is created."}));
        A.replaceChildren(page.channels, channels.el);
        A.replaceChildren(page.e2e, nodesE2eCard(t));
      });
    };
    return page;
  }};

  // -- channel --------------------------------------------------------------------------------------------
  function features(c) {
    var list = [];
    if (c.tls) list.push(badge(c.tls_version || "TLS", "feature", c.tls_cipher_suite || null));
    if (c.snappy) list.push(badge("snappy", "feature"));
    if (c.deflate) list.push(badge("deflate", "feature"));
    if (c.sample_rate) list.push(badge("sample " + c.sample_rate + "%", "feature"));
    if (c.authed) list.push(badge(c.auth_identity ? "auth: " + c.auth_identity : "authed", "feature", c.auth_identity_url || null));
    return list.length ? list : h("span", {"class": "muted"}, "plain");
  }

  A.pages.channel = {section: "topics", create: function (params) {
    var topic = params.topic;
    var channel = params.channel;
    var page = {};
    var path = "/topics/" + seg(topic) + "/" + seg(channel);
    page.mount = function (root) {
      detailFrame(page, root, {name: topic + "/" + channel, title: channel, subtitle: "Channel of topic " + topic,
        crumbs: [{text: "Topics", href: "/topics"}, {text: topic, href: "/topics/" + seg(topic)}, {text: channel}],
        charts: ["Messages / s into the channel", "Depth, in flight and deferred"]});
      page.nodes = h("div");
      page.clients = h("div");
      page.e2e = h("div");
      A.add(page.frame.body, page.nodes, page.clients, page.e2e);
      queueActions(page, {kind: "channel", name: channel, path: path, back: "/topics/" + seg(topic),
        pause: "Pause channel “" + channel + "” on every node? Messages keep queueing but consumers receive nothing until it is unpaused.",
        unpause: "Resume delivering messages of channel “" + channel + "” to its consumers?",
        empty: "Delete every message queued in channel “" + channel + "” (memory and disk) on every node? Messages in flight are not touched.",
        remove: "Delete channel “" + channel + "” of topic “" + topic + "” with its messages on every node and in lookupd?"});
    };
    page.refresh = function () {
      return Promise.all([A.api("GET", path), A.api("GET", "/history" + path)]).then(function (r) {
        if (!A.isCurrent(page)) return;
        var c = r[0];
        var history = r[1];
        if (c.channel_name === undefined) {
          A.replaceChildren(page.frame.badges, badge("not found", "paused"));
          A.replaceChildren(page.tiles, h("p", {"class": "note"}, "No node has this channel." + (c.message ? " " + c.message : "")));
          A.replaceChildren(page.nodes);
          A.replaceChildren(page.clients);
          return;
        }
        showPaused(page, "channel", !!c.paused);
        if (c.message) page.frame.subtitle.textContent = "Channel of topic " + topic + " — " + c.message;
        var lastRate = history.rate.length ? history.rate[history.rate.length - 1] : null;
        A.replaceChildren(page.tiles, tiles([
          {label: "Depth", value: fmtInt(c.depth)}, {label: "In flight", value: fmtInt(c.in_flight_count)},
          {label: "Deferred", value: fmtInt(c.deferred_count)}, {label: "Requeued", value: fmtInt(c.requeue_count)},
          {label: "Timed out", value: fmtInt(c.timeout_count), warn: c.timeout_count > 0},
          {label: "Messages", value: fmtInt(c.message_count)}, {label: "Rate (msg/s)", value: fmtRate(lastRate)},
          {label: "Connections", value: fmtInt(c.client_count)}].concat(c.damaged_count ?
          [{label: "Damaged on disk", value: fmtInt(c.damaged_count), warn: true}] : [])));
        page.charts[0].update(history.timestamps, [{label: "messages/s", values: history.rate}]);
        page.charts[1].update(history.timestamps, [{label: "depth", values: history.depth},
          {label: "in flight", values: history.in_flight}, {label: "deferred", values: history.deferred}]);

        var nodeRows = (c.nodes || []).map(function (n) {
          return [nodeLink(n.node, n.hostname ? n.hostname + " (" + n.node + ")" : n.node), fmtInt(n.depth), fmtInt(n.memory_depth),
            fmtInt(n.backend_depth), fmtInt(n.in_flight_count), fmtInt(n.deferred_count), fmtInt(n.requeue_count),
            fmtInt(n.timeout_count), fmtInt(n.message_count), fmtInt(n.client_count), pausedBadge(n.paused)];
        });
        var nodes = card("Nodes");
        nodes.body.append(table([{label: "Node"}, {label: "Depth", num: true}, {label: "Memory", num: true}, {label: "Disk", num: true},
          {label: "In flight", num: true}, {label: "Deferred", num: true}, {label: "Requeued", num: true},
          {label: "Timed out", num: true}, {label: "Messages", num: true}, {label: "Connections", num: true}, {label: "State"}],
          nodeRows, {total: nodeRows.length > 1 ? ["Total", fmtInt(c.depth), fmtInt(c.memory_depth), fmtInt(c.backend_depth),
            fmtInt(c.in_flight_count), fmtInt(c.deferred_count), fmtInt(c.requeue_count), fmtInt(c.timeout_count),
            fmtInt(c.message_count), fmtInt(c.client_count), ""] : null}));
        var logNodes = (c.nodes || []).filter(function (n) { return n.log; });
        if (logNodes.length) {
          // a log channel (read by offset): each node's offsets; they are per node and never summed
          var offsets = card("Log offsets");
          offsets.body.append(table([{label: "Node"}, {label: "Start", num: true}, {label: "Committed", num: true},
            {label: "End", num: true}, {label: "Uncommitted", num: true}],
            logNodes.map(function (n) {
              return [nodeLink(n.node, n.hostname ? n.hostname + " (" + n.node + ")" : n.node), fmtInt(n.log.start),
                fmtInt(n.log.committed), fmtInt(n.log.end), fmtInt(n.log.end - n.log.committed)];
            })));
          A.replaceChildren(page.nodes, nodes.el, offsets.el);
        } else {
          A.replaceChildren(page.nodes, nodes.el);
        }

        var clients = card("Consumers (" + (c.clients || []).length + ")");
        clients.body.append(table([{label: "Client"}, {label: "User agent"}, {label: "Node"}, {label: "Address"},
          {label: "RDY", num: true, title: "ready count: messages the client accepts in flight"},
          {label: "In flight", num: true}, {label: "Finished", num: true}, {label: "Requeued", num: true},
          {label: "Messages", num: true}, {label: "Connected", num: true}, {label: "Features"}],
          (c.clients || []).map(function (cl) {
            return {cls: "client-row", cells: [
              h("div", {"class": "client-name"}, h("span", {"class": "client-host"}, cl.hostname || "–"),
                cl.client_id && cl.client_id !== cl.hostname ? h("span", {"class": "client-id"}, cl.client_id) : null),
              h("span", {"class": "user-agent"}, cl.user_agent || "–"), nodeLink(cl.node), cl.remote_address,
              fmtInt(cl.ready_count), fmtInt(cl.in_flight_count), fmtInt(cl.finish_count), fmtInt(cl.requeue_count),
              fmtInt(cl.message_count), A.fmtDuration(cl.connected), features(cl)]};
          }), {empty: "No consumer is connected to this channel."}));
        A.replaceChildren(page.clients, clients.el);
        A.replaceChildren(page.e2e, nodesE2eCard(c));
      });
    };
    return page;
  }};

  // -- nodes ----------------------------------------------------------------------------------------------
  var NODE_CHIPS = 12;

  /* A node's first topics as chips; the rest are counted, with a link to the node's page that lists them. */
  function topicChips(topics, node) {
    var chips = topics.slice(0, NODE_CHIPS).map(function (t) {
      var link = topicLink(t.topic);
      link.className = "chip" + (t.tombstoned ? " tombstoned" : "");
      if (t.tombstoned) link.title = "tombstoned on this node";
      return link;
    });
    var more = topics.length - chips.length;
    return h("div", {"class": "chips"}, chips, more > 0 ? h("a", {href: "/nodes/" + seg(node), "class": "chip more"},
      "+ " + fmtInt(more) + " more") : null);
  }

  A.pages.nodes = {section: "nodes", create: function () {
    var page = {};
    page.mount = function (root) {
      document.title = "Nodes · nsqadmin";
      var source = A.CONFIG.NSQLOOKUPD.length ? "Registered with nsqlookupd at " + A.CONFIG.NSQLOOKUPD.join(", ")
        : "nsqd nodes given on the command line";
      page.frame = frame(root, [], "Nodes", source);
      page.errorBox = page.frame.error;
      page.list = h("div");
      page.frame.body.append(page.list);
    };
    page.refresh = function () {
      return Promise.all([A.api("GET", "/nodes"), A.api("GET", "/history?spark=")]).then(function (r) {
        if (!A.isCurrent(page)) return;
        var nodes = r[0].nodes || [];
        var history = r[1].nodes || {};
        var rows = nodes.map(function (n) {
          var name = n.broadcast_address.indexOf(":") >= 0 ? "[" + n.broadcast_address + "]:" + n.http_port : n.broadcast_address + ":" + n.http_port;
          var sample = history[name];
          return [nodeLink(name, n.hostname), n.broadcast_address, String(n.tcp_port), String(n.http_port),
            [n.version, n.out_of_date ? badge("out of date", "paused", "older than the newest node") : null],
            String((n.remote_addresses || []).length || "–"),
            sample ? fmtRate(sample.rate) : "–", sample ? fmtInt(sample.depth) : "–",
            topicChips(n.topics || [], name)];
        });
        var c = card(nodes.length + (nodes.length === 1 ? " node" : " nodes"));
        c.body.append(table([{label: "Hostname"}, {label: "Broadcast address"}, {label: "TCP", num: true},
          {label: "HTTP", num: true}, {label: "Version"}, {label: "Lookupd links", num: true},
          {label: "Rate (msg/s)", num: true}, {label: "Depth", num: true}, {label: "Topics"}], rows,
          {empty: "No nsqd node is registered."}));
        if (r[0].message) c.body.append(h("p", {"class": "note"}, r[0].message));
        A.replaceChildren(page.list, c.el);
      });
    };
    return page;
  }};

  // -- node -----------------------------------------------------------------------------------------------
  A.pages.node = {section: "nodes", create: function (params) {
    var node = params.node;
    var page = {};
    page.mount = function (root) {
      detailFrame(page, root, {name: node, crumbs: [{text: "Nodes", href: "/nodes"}, {text: node}], title: node,
        subtitle: "nsqd node", charts: ["Messages published / s on this node", "Messages queued on this node"]});
      page.table = new PagedTable([{label: "Topic / channel"}, {label: "Depth", num: true}, {label: "Memory", num: true},
        {label: "Disk", num: true}, {label: "In flight", num: true}, {label: "Messages", num: true},
        {label: "Channels / consumers", num: true}, {label: "State"}, {label: ""}], {
        noun: "topics", name: function (t) { return t.topic_name; }, empty: "This node has no topics.", pageSize: 25,
        rows: function (t) {
          return [{cls: "topic-row", cells: [topicLink(t.topic_name), fmtInt(t.depth), fmtInt(t.memory_depth),
            fmtInt(t.backend_depth), "", fmtInt(t.message_count), fmtInt(t.channels.length), pausedBadge(t.paused),
            tombstoneButton(t.topic_name, node)]}].concat(t.channels.map(function (c) {
            return {cls: "channel-row", cells: [h("span", {"class": "indent"}, "↳ ", channelLink(t.topic_name, c.channel_name)),
              fmtInt(c.depth), fmtInt(c.memory_depth), fmtInt(c.backend_depth), fmtInt(c.in_flight_count),
              fmtInt(c.message_count), fmtInt(c.client_count) + " conn.", pausedBadge(c.paused), ""]};
          }));
        }});
      var list = card("Topics and channels");
      list.body.append(page.table.el);
      page.replication = h("div");
      A.add(page.frame.body, page.replication, list.el);
    };
    page.refresh = function () {
      return Promise.all([A.api("GET", "/nodes/" + seg(node)), A.api("GET", "/history/nodes/" + seg(node))]).then(function (r) {
        if (!A.isCurrent(page)) return;
        var data = r[0];
        var history = r[1];
        var topics = data.topics || [];
        var channelCount = 0;
        topics.forEach(function (t) { channelCount += t.channels.length; });
        if (topics.length && topics[0].hostname) page.frame.subtitle.textContent = "nsqd node on host " + topics[0].hostname;
        A.replaceChildren(page.tiles, tiles([{label: "Messages", value: fmtInt(data.total_messages)},
          {label: "Consumers", value: fmtInt(data.total_clients)}, {label: "Topics", value: fmtInt(topics.length)},
          {label: "Channels", value: fmtInt(channelCount)}]));
        publishedAndQueued(page.charts, history);
        page.table.update(topics);
        A.replaceChildren(page.replication, data.replication ? replicationCard(node, data.replication) : null);
      });
    };
    return page;
  }};

  // a trionsq node's replication: its peers (state, what they have not acknowledged) and the origins it holds
  // copies for, each with a takeover button (the node then delivers that origin's unfinished messages)
  function replicationCard(node, r) {
    var kind = r.state === "replicating" ? "ok" : (r.state === "degraded" ? "warn" : "");
    var c = card("Replication", badge(r.state, kind));
    var peers = (r.peers || []).map(function (p) {
      return [p.address, badge(p.state, p.state === "connected" ? "ok" : "warn"), fmtInt(p.pending_messages),
        fmtInt(p.pending_bytes), p.lagging ? badge("needs backfill", "warn") : ""];
    });
    if (r.state !== "off") {
      c.body.append(h("p", null, "Publishes are acknowledged once " + r.acks_required + " peer(s) hold them; when fewer are " +
        "reachable this node " + (r.degraded_mode === "accept" ? "accepts them unreplicated" : "refuses them") + ". " +
        fmtInt(r.unreplicated_messages) + " message(s) not yet held by enough peers."));
      c.body.append(table([{label: "Peer"}, {label: "State"}, {label: "Messages not acknowledged", num: true},
        {label: "Bytes not acknowledged", num: true}, {label: ""}], peers, {empty: "No peers."}));
    }
    var replicas = (r.replicas || []).map(function (o) {
      var takeover = !IS_ADMIN || !o.held_messages ? "" : button("Take over", {cls: "small danger-ghost",
        title: "Deliver the messages held for " + o.node + " from " + node, onclick: function () {
          A.runAction({title: "Take over " + o.node, danger: true, confirm: "Take over",
            text: "Make " + node + " deliver now the " + o.held_messages + " unfinished message(s) it holds for " + o.node +
              "? Do it only when that node is gone: while it lives, both deliver them (duplicates).",
            call: function () { return A.api("POST", "/nodes/" + seg(node), {action: "takeover", origin: o.node}); },
            done: "Messages of " + o.node + " adopted by " + node + "."});
        }});
      return [o.node, badge(o.state, o.state === "connected" ? "ok" : (o.state === "gone" ? "warn" : "")),
        fmtInt(o.held_messages), fmtInt(o.held_bytes), fmtInt(o.epoch), takeover];
    });
    c.body.append(table([{label: "Copies held for"}, {label: "Origin"}, {label: "Messages", num: true},
      {label: "Bytes", num: true}, {label: "Epoch", num: true}, {label: ""}], replicas,
      {empty: "This node holds no copies for other nodes."}));
    c.body.append(h("p", null, "Takeovers: " + fmtInt(r.takeovers) + ", messages adopted: " + fmtInt(r.adopted_messages) +
      ", duplicates after takeover: " + fmtInt(r.duplicates_after_takeover || 0) + "."));
    return c.el;
  }

  // -- counter --------------------------------------------------------------------------------------------
  A.pages.counter = {section: "counter", create: function () {
    var page = {refreshSeconds: 1};
    var shown = null;
    var target = 0;
    var lastTotal = null;
    var lastTime = null;
    var animating = false;
    function animate() {
      if (!A.isCurrent(page)) { animating = false; return; }
      var gap = target - shown;
      shown = Math.abs(gap) < 1 ? target : shown + gap * 0.15;
      page.number.textContent = fmtInt(Math.round(shown));
      if (shown !== target) requestAnimationFrame(animate); else animating = false;
    }
    page.mount = function (root) {
      document.title = "Counter · nsqadmin";
      page.frame = frame(root, [], "Message counter", "Messages delivered into every channel of the cluster, live");
      page.errorBox = page.frame.error;
      page.number = h("div", {"class": "counter-number", id: "counter-total"}, "–");
      page.rate = h("div", {"class": "counter-rate"}, "measuring…");
      page.frame.body.append(h("section", {"class": "card counter"}, page.number, page.rate));
    };
    page.refresh = function () {
      return A.api("GET", "/counter").then(function (data) {
        if (!A.isCurrent(page)) return;
        var total = 0;
        Object.keys(data.stats || {}).forEach(function (key) { total += data.stats[key].message_count; });
        var now = Date.now() / 1000;
        if (lastTotal !== null && total >= lastTotal && now > lastTime) {
          page.rate.textContent = fmtRate((total - lastTotal) / (now - lastTime)) + " messages / s";
        }
        lastTotal = total;
        lastTime = now;
        target = total;
        if (shown === null) { shown = total; page.number.textContent = fmtInt(total); }
        page.number.setAttribute("data-total", String(total));
        if (!animating) { animating = true; requestAnimationFrame(animate); }
      });
    };
    return page;
  }};

  // -- lookup ---------------------------------------------------------------------------------------------
  A.pages.lookup = {section: "lookup", create: function () {
    var page = {};
    var usesLookupd = A.CONFIG.NSQLOOKUPD.length > 0;
    var inactive = {};
    function inactiveTopicRow(topic) {
      var channels = inactive[topic] || [];
      return [[topicLink(topic), h("div", {"class": "chips"}, channels.map(function (channel) {
        return h("span", {"class": "chip"}, channel, IS_ADMIN ? h("button", {type: "button", "class": "chip-x",
          title: "Delete channel " + channel, "aria-label": "Delete channel " + channel, onclick: function () {
            A.runAction({title: "Delete channel", danger: true, confirm: "Delete",
              text: "Delete channel “" + channel + "” of topic “" + topic + "” from lookupd?",
              call: function () { return A.api("DELETE", "/topics/" + seg(topic) + "/" + seg(channel)); },
              done: "Channel “" + channel + "” deleted."});
          }}, "×") : null);
      })), IS_ADMIN ? button("Delete topic", {cls: "small danger-ghost", onclick: function () {
        A.runAction({title: "Delete topic", danger: true, confirm: "Delete",
          text: "Delete topic “" + topic + "” and its channels from lookupd?",
          call: function () { return A.api("DELETE", "/topics/" + seg(topic)); },
          done: "Topic “" + topic + "” deleted."});
      }}) : null]];
    }
    page.mount = function (root) {
      document.title = "Lookup · nsqadmin";
      page.frame = frame(root, [], "Lookup", usesLookupd ? "nsqlookupd at " + A.CONFIG.NSQLOOKUPD.join(", ")
        : "No nsqlookupd configured: topics are created directly on every nsqd node");
      page.errorBox = page.frame.error;
      page.list = h("div");
      if (IS_ADMIN) {
        var topicInput = h("input", {type: "text", name: "topic", id: "create-topic", required: true, maxlength: 64,
          pattern: "[.a-zA-Z0-9_\\-]+(#ephemeral)?", placeholder: "topic name", autocomplete: "off"});
        var channelInput = h("input", {type: "text", name: "channel", id: "create-channel", maxlength: 64,
          pattern: "[.a-zA-Z0-9_\\-]+(#ephemeral)?", placeholder: "channel name (optional)", autocomplete: "off"});
        var form = h("form", {"class": "create-form", onsubmit: function (event) {
          event.preventDefault();
          var topic = topicInput.value.trim();
          var channel = channelInput.value.trim();
          var what = channel ? "topic “" + topic + "” with channel “" + channel + "”" : "topic “" + topic + "”";
          A.runAction({title: "Create " + (channel ? "topic and channel" : "topic"), confirm: "Create",
            text: "Create " + what + (usesLookupd ? " in lookupd" + (channel ? " and on the nodes that have the topic" : "") : " on every node") + "?",
            call: function () { return A.api("POST", "/topics", {topic: topic, channel: channel}); },
            done: "Created " + what + "."}).then(function (ok) { if (ok) { topicInput.value = ""; channelInput.value = ""; } });
        }},
          h("label", {"for": "create-topic"}, "Topic"), topicInput,
          h("label", {"for": "create-channel"}, "Channel"), channelInput,
          h("button", {type: "submit", "class": "btn primary"}, "Create"));
        var create = card("Create a topic or channel");
        create.body.append(h("p", {"class": "note"}, "Names use letters, digits, “.”, “_” and “-” (at most 64 characters), optionally ending in #ephemeral."), form);
        page.frame.body.append(create.el);
      } else {
        A.add(page.frame.body, readOnlyNote());
      }
      page.frame.body.append(page.list);
    };
    page.refresh = function () {
      if (!usesLookupd) {
        A.replaceChildren(page.list);
        return Promise.resolve();
      }
      return A.api("GET", "/topics?inactive=true").then(function (data) {
        if (!A.isCurrent(page)) return;
        if (!page.table) {
          page.table = new PagedTable([{label: "Topic"}, {label: "Channels"}, {label: ""}], {
            noun: "topics", name: function (name) { return name; }, rows: inactiveTopicRow,
            empty: "Every topic registered in lookupd has a producer."});
          var c = card("Topics without producers");
          c.body.append(h("p", {"class": "note"}, "Topics and channels registered in lookupd that no nsqd node produces right now. Consumers looking them up wait for a producer."),
            page.table.el);
          A.replaceChildren(page.list, c.el);
        }
        inactive = data.topics || {};
        page.table.update(Object.keys(inactive).sort());
      });
    };
    return page;
  }};

  A.route("/", "topics");
  A.route("/topics", "topics");
  A.route("/topics/:topic", "topic");
  A.route("/topics/:topic/:channel", "channel");
  A.route("/nodes", "nodes");
  A.route("/nodes/:node", "node");
  A.route("/counter", "counter");
  A.route("/lookup", "lookup");
})();
