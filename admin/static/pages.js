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

  /* columns: [{label, num}] ; rows: arrays of cells (text or nodes) ; options.total: a last row in bold */
  function table(columns, rows, options) {
    options = options || {};
    var head = h("tr", null, columns.map(function (c) {
      return h("th", {"class": c.num ? "num" : null, scope: "col", title: c.title || null}, c.label);
    }));
    var body = h("tbody", null, rows.map(function (row) {
      var cells = row.cells || row;
      return h("tr", {"class": row.cls || null}, cells.map(function (cell, i) {
        return h("td", {"class": columns[i] && columns[i].num ? "num" : null}, cell);
      }));
    }));
    var foot = options.total ? h("tfoot", null, h("tr", null, options.total.map(function (cell, i) {
      return h("td", {"class": columns[i] && columns[i].num ? "num" : null}, cell);
    }))) : null;
    if (!rows.length && options.empty) {
      body.append(h("tr", null, h("td", {colspan: columns.length, "class": "empty"}, options.empty)));
    }
    return h("div", {"class": "table-wrap"}, h("table", {"class": options.cls || "data"}, h("thead", null, head), body, foot));
  }

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
  A.pages.topics = {section: "topics", create: function () {
    var page = {};
    page.mount = function (root) {
      page.frame = frame(root, [], "Topics", "");
      page.errorBox = page.frame.error;
      var charts = card("Cluster throughput");
      page.charts = chartPair(charts.body, {title: "Messages published / s (all topics)"}, {title: "Messages queued (all topics and channels)"});
      page.list = h("div");
      page.frame.body.append(charts.el, page.list);
    };
    page.refresh = function () {
      return Promise.all([A.api("GET", "/topics"), A.api("GET", "/history")]).then(function (r) {
        if (!A.isCurrent(page)) return;
        var names = r[0].topics || [];
        var history = r[1];
        page.frame.subtitle.textContent = names.length + (names.length === 1 ? " topic" : " topics") +
          " in the cluster" + (r[0].message ? " — " + r[0].message : "");
        page.charts[0].update(history.timestamps, [{label: "published/s", values: history.rate}]);
        page.charts[1].update(history.timestamps, [{label: "depth", values: history.depth}]);
        var rows = names.map(function (name) {
          var t = history.topics[name];
          return [topicLink(name), t ? fmtInt(t.depth) : "–", t ? fmtInt(t.message_count) : "–",
            t ? fmtRate(t.rate) : "–", t ? sparkline(t.rates) : h("span", {"class": "muted"}, "no producer")];
        });
        A.replaceChildren(page.list, card("All topics").el);
        page.list.querySelector(".card-body").append(table([{label: "Topic"}, {label: "Depth", num: true},
          {label: "Messages", num: true}, {label: "Rate (msg/s)", num: true}, {label: "Recent rate"}], rows,
          {empty: "No topics yet. Publish a message to an nsqd, or create a topic on the Lookup page."}));
      });
    };
    return page;
  }};

  // -- topic ----------------------------------------------------------------------------------------------
  A.pages.topic = {section: "topics", create: function (params) {
    var topic = params.topic;
    var page = {};
    var paused = false;
    page.mount = function (root) {
      document.title = topic + " · nsqadmin";
      page.frame = frame(root, [{text: "Topics", href: "/topics"}, {text: topic}], topic, "Topic");
      page.errorBox = page.frame.error;
      page.tiles = h("div");
      var charts = card("Throughput and depth");
      page.charts = chartPair(charts.body, {title: "Messages published / s"}, {title: "Messages queued"});
      page.nodes = h("div");
      page.channels = h("div");
      page.e2e = h("div");
      A.add(page.frame.body, readOnlyNote(), page.tiles, charts.el, page.nodes, page.channels, page.e2e);
      if (IS_ADMIN) {
        page.pauseButton = button("Pause topic", {onclick: function () {
          var action = paused ? "unpause" : "pause";
          A.runAction({title: (paused ? "Unpause" : "Pause") + " topic", confirm: paused ? "Unpause" : "Pause",
            text: paused ? "Resume copying messages of “" + topic + "” to its channels on every node?"
              : "Pause topic “" + topic + "” on every node? Messages keep queueing in the topic but no channel receives them until it is unpaused.",
            call: function () { return A.api("POST", "/topics/" + seg(topic), {action: action}); },
            done: "Topic “" + topic + "” " + action + "d."});
        }});
        page.frame.actions.append(page.pauseButton,
          button("Empty queue", {cls: "warn", onclick: function () {
            A.runAction({title: "Empty topic", danger: true, confirm: "Empty",
              text: "Delete every message queued in topic “" + topic + "” (memory and disk) on every node? Channel queues are not touched.",
              call: function () { return A.api("POST", "/topics/" + seg(topic), {action: "empty"}); },
              done: "Topic “" + topic + "” emptied."});
          }}),
          button("Delete topic", {cls: "danger", onclick: function () {
            A.runAction({title: "Delete topic", danger: true, confirm: "Delete",
              text: "Delete topic “" + topic + "” with all its channels and messages on every node and in lookupd?",
              call: function () { return A.api("DELETE", "/topics/" + seg(topic)); },
              done: "Topic “" + topic + "” deleted.",
              after: function () { A.navigate("/topics"); }});
          }}));
      }
    };
    page.refresh = function () {
      return Promise.all([A.api("GET", "/topics/" + seg(topic)), A.api("GET", "/history/topics/" + seg(topic))]).then(function (r) {
        if (!A.isCurrent(page)) return;
        var t = r[0];
        var history = r[1];
        paused = !!t.paused;
        A.replaceChildren(page.frame.badges, pausedBadge(paused));
        if (page.pauseButton) page.pauseButton.textContent = paused ? "Unpause topic" : "Pause topic";
        page.frame.subtitle.textContent = "Topic on " + (t.nodes || []).length + " node" + ((t.nodes || []).length === 1 ? "" : "s") +
          (t.message ? " — " + t.message : "");
        var lastRate = history.rate.length ? history.rate[history.rate.length - 1] : null;
        var inFlight = 0, deferred = 0;
        (t.channels || []).forEach(function (c) { inFlight += c.in_flight_count; deferred += c.deferred_count; });
        A.replaceChildren(page.tiles, tiles([
          {label: "Depth", value: fmtInt(t.depth)}, {label: "Memory + disk", value: fmtInt(t.memory_depth) + " + " + fmtInt(t.backend_depth)},
          {label: "Messages", value: fmtInt(t.message_count)}, {label: "Rate (msg/s)", value: fmtRate(lastRate)},
          {label: "In flight", value: fmtInt(inFlight)}, {label: "Deferred", value: fmtInt(deferred)},
          {label: "Channels", value: fmtInt((t.channels || []).length)}]));
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
        A.replaceChildren(page.e2e, e2eCard("End-to-end processing latency", (t.nodes || []).map(function (n) {
          return {label: n.node, e2e: n.e2e_processing_latency};
        }).concat((t.nodes || []).length > 1 ? [{label: "All nodes", e2e: t.e2e_processing_latency}] : [])));
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
    var paused = false;
    var path = "/topics/" + seg(topic) + "/" + seg(channel);
    page.mount = function (root) {
      document.title = topic + "/" + channel + " · nsqadmin";
      page.frame = frame(root, [{text: "Topics", href: "/topics"}, {text: topic, href: "/topics/" + seg(topic)}, {text: channel}],
        channel, "Channel of topic " + topic);
      page.errorBox = page.frame.error;
      page.tiles = h("div");
      var charts = card("Throughput and depth");
      page.charts = chartPair(charts.body, {title: "Messages / s into the channel"}, {title: "Depth, in flight and deferred"});
      page.nodes = h("div");
      page.clients = h("div");
      page.e2e = h("div");
      A.add(page.frame.body, readOnlyNote(), page.tiles, charts.el, page.nodes, page.clients, page.e2e);
      if (IS_ADMIN) {
        page.pauseButton = button("Pause channel", {onclick: function () {
          var action = paused ? "unpause" : "pause";
          A.runAction({title: (paused ? "Unpause" : "Pause") + " channel", confirm: paused ? "Unpause" : "Pause",
            text: paused ? "Resume delivering messages of channel “" + channel + "” to its consumers?"
              : "Pause channel “" + channel + "” on every node? Messages keep queueing but consumers receive nothing until it is unpaused.",
            call: function () { return A.api("POST", path, {action: action}); },
            done: "Channel “" + channel + "” " + action + "d."});
        }});
        page.frame.actions.append(page.pauseButton,
          button("Empty queue", {cls: "warn", onclick: function () {
            A.runAction({title: "Empty channel", danger: true, confirm: "Empty",
              text: "Delete every message queued in channel “" + channel + "” (memory and disk) on every node? Messages in flight are not touched.",
              call: function () { return A.api("POST", path, {action: "empty"}); },
              done: "Channel “" + channel + "” emptied."});
          }}),
          button("Delete channel", {cls: "danger", onclick: function () {
            A.runAction({title: "Delete channel", danger: true, confirm: "Delete",
              text: "Delete channel “" + channel + "” of topic “" + topic + "” with its messages on every node and in lookupd?",
              call: function () { return A.api("DELETE", path); },
              done: "Channel “" + channel + "” deleted.",
              after: function () { A.navigate("/topics/" + seg(topic)); }});
          }}));
      }
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
        paused = !!c.paused;
        A.replaceChildren(page.frame.badges, pausedBadge(paused));
        if (page.pauseButton) page.pauseButton.textContent = paused ? "Unpause channel" : "Pause channel";
        if (c.message) page.frame.subtitle.textContent = "Channel of topic " + topic + " — " + c.message;
        var lastRate = history.rate.length ? history.rate[history.rate.length - 1] : null;
        A.replaceChildren(page.tiles, tiles([
          {label: "Depth", value: fmtInt(c.depth)}, {label: "In flight", value: fmtInt(c.in_flight_count)},
          {label: "Deferred", value: fmtInt(c.deferred_count)}, {label: "Requeued", value: fmtInt(c.requeue_count)},
          {label: "Timed out", value: fmtInt(c.timeout_count), warn: c.timeout_count > 0},
          {label: "Messages", value: fmtInt(c.message_count)}, {label: "Rate (msg/s)", value: fmtRate(lastRate)},
          {label: "Connections", value: fmtInt(c.client_count)}]));
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
        A.replaceChildren(page.nodes, nodes.el);

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
        A.replaceChildren(page.e2e, e2eCard("End-to-end processing latency", (c.nodes || []).map(function (n) {
          return {label: n.node, e2e: n.e2e_processing_latency};
        }).concat((c.nodes || []).length > 1 ? [{label: "All nodes", e2e: c.e2e_processing_latency}] : [])));
      });
    };
    return page;
  }};

  // -- nodes ----------------------------------------------------------------------------------------------
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
      return Promise.all([A.api("GET", "/nodes"), A.api("GET", "/history")]).then(function (r) {
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
            h("div", {"class": "chips"}, (n.topics || []).map(function (t) {
              var link = topicLink(t.topic);
              link.className = "chip" + (t.tombstoned ? " tombstoned" : "");
              if (t.tombstoned) link.title = "tombstoned on this node";
              return link;
            }))];
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
      document.title = node + " · nsqadmin";
      page.frame = frame(root, [{text: "Nodes", href: "/nodes"}, {text: node}], node, "nsqd node");
      page.errorBox = page.frame.error;
      page.tiles = h("div");
      var charts = card("Throughput and depth");
      page.charts = chartPair(charts.body, {title: "Messages published / s on this node"}, {title: "Messages queued on this node"});
      page.topics = h("div");
      page.replication = h("div");
      A.add(page.frame.body, readOnlyNote(), page.tiles, charts.el, page.replication, page.topics);
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
        page.charts[0].update(history.timestamps, [{label: "published/s", values: history.rate}]);
        page.charts[1].update(history.timestamps, [{label: "depth", values: history.depth}]);
        var rows = [];
        topics.forEach(function (t) {
          rows.push({cls: "topic-row", cells: [topicLink(t.topic_name), fmtInt(t.depth), fmtInt(t.memory_depth),
            fmtInt(t.backend_depth), "", fmtInt(t.message_count), fmtInt(t.channels.length), pausedBadge(t.paused),
            tombstoneButton(t.topic_name, node)]});
          t.channels.forEach(function (c) {
            rows.push({cls: "channel-row", cells: [h("span", {"class": "indent"}, "↳ ", channelLink(t.topic_name, c.channel_name)),
              fmtInt(c.depth), fmtInt(c.memory_depth), fmtInt(c.backend_depth), fmtInt(c.in_flight_count),
              fmtInt(c.message_count), fmtInt(c.client_count) + " conn.", pausedBadge(c.paused), ""]});
          });
        });
        var c = card("Topics and channels");
        c.body.append(table([{label: "Topic / channel"}, {label: "Depth", num: true}, {label: "Memory", num: true},
          {label: "Disk", num: true}, {label: "In flight", num: true}, {label: "Messages", num: true},
          {label: "Channels / consumers", num: true}, {label: "State"}, {label: ""}], rows, {empty: "This node has no topics."}));
        A.replaceChildren(page.topics, c.el);
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
      ", messages received twice: " + fmtInt(r.duplicates_received) + "."));
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
        var topics = data.topics || {};
        var names = Object.keys(topics).sort();
        var rows = names.map(function (topic) {
          var channels = topics[topic] || [];
          return [topicLink(topic), h("div", {"class": "chips"}, channels.map(function (channel) {
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
          }}) : null];
        });
        var c = card("Topics without producers");
        c.body.append(h("p", {"class": "note"}, "Topics and channels registered in lookupd that no nsqd node produces right now. Consumers looking them up wait for a producer."),
          table([{label: "Topic"}, {label: "Channels"}, {label: ""}], rows, {empty: "Every topic registered in lookupd has a producer."}));
        A.replaceChildren(page.list, c.el);
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
