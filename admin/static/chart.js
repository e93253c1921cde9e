/* Small SVG charts for the admin's sampled history: time-series line charts and sparklines.
 *
 * No dependencies and no build step. Every element is made with createElementNS and every label is set
 * with textContent, so nothing drawn here is ever parsed as markup. Values may be null (no sample, or no
 * rate for that step): lines break there instead of dropping to zero. Each chart's <svg> carries
 * data-points, the number of values it drew, which tests and curious people can read.
 */
(function () {
  "use strict";

  var SVG_NS = "http://www.w3.org/2000/svg";
  var COLORS = ["#2563eb", "#ea580c", "#059669", "#9333ea", "#db2777", "#0891b2", "#65a30d", "#b45309"];

  function svg(name, attrs, text) {
    var node = document.createElementNS(SVG_NS, name);
    if (attrs) {
      Object.keys(attrs).forEach(function (key) { node.setAttribute(key, String(attrs[key])); });
    }
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // The smallest "round" number (1, 2, 2.5, 5 times a power of ten) at or above value.
  function niceCeiling(value) {
    if (!(value > 0)) return 1;
    var power = Math.pow(10, Math.floor(Math.log10(value)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) {
      if (steps[i] * power >= value - 1e-9) return steps[i] * power;
    }
    return 10 * power;
  }

  function compact(value) {
    var abs = Math.abs(value);
    if (abs >= 1e9) return trim(value / 1e9) + "G";
    if (abs >= 1e6) return trim(value / 1e6) + "M";
    if (abs >= 1e4) return trim(value / 1e3) + "k";
    return trim(value);
  }

  function trim(value) {
    var text = Math.abs(value) >= 100 ? value.toFixed(0) : Math.abs(value) >= 10 ? value.toFixed(1) : value.toFixed(2);
    return text.indexOf(".") >= 0 ? text.replace(/0+$/, "").replace(/\.$/, "") : text;
  }

  function clock(seconds) {
    var date = new Date(seconds * 1000);
    function two(n) { return (n < 10 ? "0" : "") + n; }
    return two(date.getHours()) + ":" + two(date.getMinutes()) + ":" + two(date.getSeconds());
  }

  /* A line chart of one or more series over shared timestamps (Unix seconds).
   *   var chart = new LineChart(container, {title: "Messages / s", unit: "msg/s"});
   *   chart.update(timestamps, [{label: "published", values: [...]}, ...]);
   */
  function LineChart(container, options) {
    this.options = options || {};
    this.root = document.createElement("figure");
    this.root.className = "chart-box";
    var caption = document.createElement("figcaption");
    caption.textContent = this.options.title || "";
    this.legend = document.createElement("div");
    this.legend.className = "chart-legend";
    this.svg = svg("svg", {"class": "chart", role: "img", "aria-label": this.options.title || "chart"});
    this.tooltip = document.createElement("div");
    this.tooltip.className = "chart-tooltip";
    this.tooltip.hidden = true;
    this.root.append(caption, this.legend, this.svg, this.tooltip);
    container.append(this.root);
    this.timestamps = [];
    this.series = [];
    var self = this;
    this.svg.addEventListener("mousemove", function (event) { self._hover(event); });
    this.svg.addEventListener("mouseleave", function () { self._unhover(); });
  }

  LineChart.prototype.update = function (timestamps, series) {
    this.timestamps = timestamps || [];
    this.series = (series || []).map(function (s, i) {
      return {label: s.label, values: s.values || [], color: s.color || COLORS[i % COLORS.length]};
    });
    this._draw();
  };

  LineChart.prototype._draw = function () {
    var root = this.svg;
    while (root.firstChild) root.removeChild(root.firstChild);
    var width = Math.max(240, Math.round(this.root.clientWidth || 480));
    var height = this.options.height || 170;
    var pad = {left: 46, right: 12, top: 10, bottom: 24};
    root.setAttribute("viewBox", "0 0 " + width + " " + height);
    root.setAttribute("width", width);
    root.setAttribute("height", height);
    this.geometry = {width: width, height: height, pad: pad};

    var times = this.timestamps;
    var maxValue = 0;
    var points = 0;
    this.series.forEach(function (s) {
      s.values.forEach(function (v) {
        if (v !== null && v !== undefined) { points++; if (v > maxValue) maxValue = v; }
      });
    });
    root.setAttribute("data-points", String(points));
    this._drawLegend();

    var plotW = width - pad.left - pad.right;
    var plotH = height - pad.top - pad.bottom;
    if (points === 0 || times.length === 0) {
      root.append(svg("text", {x: width / 2, y: height / 2, "text-anchor": "middle", "class": "chart-empty"},
        "collecting samples…"));
      return;
    }
    var t0 = times[0];
    var t1 = times[times.length - 1];
    if (t1 - t0 < 1) t1 = t0 + 1;
    var top = niceCeiling(maxValue);
    var x = function (t) { return pad.left + (t - t0) / (t1 - t0) * plotW; };
    var y = function (v) { return pad.top + plotH - v / top * plotH; };
    this.scale = {x: x, y: y, t0: t0, t1: t1};

    var grid = svg("g", {"class": "chart-grid"});
    for (var i = 0; i <= 4; i++) {
      var value = top * i / 4;
      var gy = y(value);
      grid.append(svg("line", {x1: pad.left, x2: width - pad.right, y1: gy, y2: gy}));
      grid.append(svg("text", {x: pad.left - 6, y: gy + 4, "text-anchor": "end"}, compact(value)));
    }
    // at most one label per whole second, so a short history does not repeat a label
    var ticks = Math.max(1, Math.min(6, Math.floor(plotW / 90), Math.floor(t1 - t0)));
    var lastLabel = "";
    for (var j = 0; j <= ticks; j++) {
      var t = t0 + (t1 - t0) * j / ticks;
      var label = clock(t);
      if (label === lastLabel) continue;
      lastLabel = label;
      grid.append(svg("text", {x: x(t), y: height - 6, "text-anchor": j === 0 ? "start" : j === ticks ? "end" : "middle"},
        label));
    }
    root.append(grid);

    this.series.forEach(function (s) {
      var d = "";
      var pen = false;
      var group = svg("g", {"class": "chart-series"});
      s.values.forEach(function (v, k) {
        if (v === null || v === undefined || k >= times.length) { pen = false; return; }
        var px = x(times[k]).toFixed(1);
        var py = y(v).toFixed(1);
        d += (pen ? "L" : "M") + px + " " + py + " ";
        pen = true;
        if (s.values.length <= 150) {
          group.append(svg("circle", {cx: px, cy: py, r: 2, fill: s.color}));
        }
      });
      group.insertBefore(svg("path", {d: d.trim(), fill: "none", stroke: s.color, "stroke-width": 2,
        "stroke-linejoin": "round", "stroke-linecap": "round"}), group.firstChild);
      root.append(group);
    });
    this.cursor = svg("line", {"class": "chart-cursor", x1: 0, x2: 0, y1: pad.top, y2: pad.top + plotH,
      visibility: "hidden"});
    root.append(this.cursor);
  };

  LineChart.prototype._drawLegend = function () {
    var legend = this.legend;
    while (legend.firstChild) legend.removeChild(legend.firstChild);
    this.series.forEach(function (s) {
      var last = null;
      for (var i = s.values.length - 1; i >= 0; i--) {
        if (s.values[i] !== null && s.values[i] !== undefined) { last = s.values[i]; break; }
      }
      var item = document.createElement("span");
      item.className = "chart-key";
      var swatch = document.createElement("i");
      swatch.style.background = s.color;
      var label = document.createElement("span");
      label.textContent = s.label + (last === null ? "" : ": " + compact(last));
      item.append(swatch, label);
      legend.append(item);
    });
  };

  LineChart.prototype._hover = function (event) {
    if (!this.scale || !this.timestamps.length) return;
    var box = this.svg.getBoundingClientRect();
    var ratio = this.geometry.width / (box.width || this.geometry.width);
    var px = (event.clientX - box.left) * ratio;
    var best = 0;
    var bestDistance = Infinity;
    for (var i = 0; i < this.timestamps.length; i++) {
      var distance = Math.abs(this.scale.x(this.timestamps[i]) - px);
      if (distance < bestDistance) { bestDistance = distance; best = i; }
    }
    var cx = this.scale.x(this.timestamps[best]);
    this.cursor.setAttribute("x1", cx);
    this.cursor.setAttribute("x2", cx);
    this.cursor.setAttribute("visibility", "visible");
    var tip = this.tooltip;
    while (tip.firstChild) tip.removeChild(tip.firstChild);
    var head = document.createElement("b");
    head.textContent = clock(this.timestamps[best]);
    tip.append(head);
    this.series.forEach(function (s) {
      var row = document.createElement("div");
      var v = s.values[best];
      row.textContent = s.label + ": " + (v === null || v === undefined ? "–" : compact(v));
      tip.append(row);
    });
    tip.style.left = Math.min(box.width - 140, Math.max(0, cx / ratio + 12)) + "px";
    tip.hidden = false;
  };

  LineChart.prototype._unhover = function () {
    if (this.cursor) this.cursor.setAttribute("visibility", "hidden");
    this.tooltip.hidden = true;
  };

  /* A tiny line of recent values for table rows; null values leave gaps. */
  function sparkline(values, options) {
    options = options || {};
    var width = options.width || 110;
    var height = options.height || 22;
    var node = svg("svg", {"class": "sparkline", width: width, height: height, viewBox: "0 0 " + width + " " + height,
      "aria-hidden": "true"});
    var present = values.filter(function (v) { return v !== null && v !== undefined; });
    node.setAttribute("data-points", String(present.length));
    if (present.length === 0) return node;
    var top = Math.max.apply(null, present) || 1;
    var step = values.length > 1 ? (width - 2) / (values.length - 1) : 0;
    var d = "";
    var pen = false;
    values.forEach(function (v, i) {
      if (v === null || v === undefined) { pen = false; return; }
      var px = (1 + i * step).toFixed(1);
      var py = (height - 2 - v / top * (height - 4)).toFixed(1);
      d += (pen ? "L" : "M") + px + " " + py + " ";
      pen = true;
    });
    node.append(svg("path", {d: d.trim(), fill: "none", stroke: options.color || COLORS[0], "stroke-width": 1.5}));
    return node;
  }

  window.NSQChart = {LineChart: LineChart, sparkline: sparkline, compact: compact, COLORS: COLORS};
})();
