/* The admin's single-page shell: DOM building, the /api client, routing, live refresh, confirmation and
 * result messages. The pages themselves are in pages.js.
 *
 * Safety rule for this file and pages.js: data from the cluster (topic and channel names, client ids,
 * hostnames, user agents...) only ever reaches the page as text. Elements are created with
 * document.createElement and strings are added with textContent/append; innerHTML is never used.
 * Links are built from encodeURIComponent'ed path segments under the base path.
 */
(function () {
  "use strict";

  var CONFIG = JSON.parse(document.getElementById("nsqadmin-config").textContent);
  var BASE = CONFIG.BASE_PATH === "/" ? "" : CONFIG.BASE_PATH;
  var REFRESH_SECONDS = Math.min(10, Math.max(1, CONFIG.HISTORY_INTERVAL || 5));

  // -- DOM ------------------------------------------------------------------------------------------------
  /* h("td", {class: "num"}, "12", child, [more]) — strings and numbers become text nodes; null is skipped;
   * attributes named on* take functions (event listeners); "href" is an in-app path under the base path. */
  function h(tag, attrs) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (key) {
        var value = attrs[key];
        if (value === null || value === undefined || value === false) return;
        if (key.slice(0, 2) === "on" && typeof value === "function") {
          node.addEventListener(key.slice(2), value);
        } else if (key === "class") {
          node.className = value;
        } else if (key === "href") {
          node.setAttribute("href", BASE + value);
          node.setAttribute("data-internal", "");
        } else if (value === true) {
          node.setAttribute(key, "");
        } else {
          node.setAttribute(key, String(value));
        }
      });
    }
    for (var i = 2; i < arguments.length; i++) appendChild(node, arguments[i]);
    return node;
  }

  function appendChild(node, child) {
    if (child === null || child === undefined || child === false) return;
    if (Array.isArray(child)) { child.forEach(function (c) { appendChild(node, c); }); return; }
    if (child instanceof Node) { node.append(child); return; }
    node.append(document.createTextNode(String(child)));
  }

  function replaceChildren(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    for (var i = 1; i < arguments.length; i++) appendChild(node, arguments[i]);
  }

  function add(node) {
    for (var i = 1; i < arguments.length; i++) appendChild(node, arguments[i]);
    return node;
  }

  function seg(text) { return encodeURIComponent(text); }

  // -- formatting -----------------------------------------------------------------------------------------
  function fmtInt(n) {
    if (n === null || n === undefined) return "–";
    return Number(n).toLocaleString("en-US");
  }

  function fmtRate(r) {
    if (r === null || r === undefined) return "–";
    if (r >= 100) return Math.round(r).toLocaleString("en-US");
    return r.toFixed(r >= 10 ? 1 : 2);
  }

  function fmtDuration(ns) {
    var s = Math.floor(ns / 1e9);
    if (s < 60) return s + "s";
    var m = Math.floor(s / 60);
    if (m < 60) return m + "m " + (s % 60) + "s";
    var hrs = Math.floor(m / 60);
    if (hrs < 48) return hrs + "h " + (m % 60) + "m";
    return Math.floor(hrs / 24) + "d " + (hrs % 24) + "h";
  }

  function fmtLatency(ns) {
    if (ns === null || ns === undefined) return "–";
    if (ns >= 1e9) return (ns / 1e9).toFixed(2) + " s";
    if (ns >= 1e6) return (ns / 1e6).toFixed(1) + " ms";
    if (ns >= 1e3) return (ns / 1e3).toFixed(0) + " µs";
    return Math.round(ns) + " ns";
  }

  // -- API ------------------------------------------------------------------------------------------------
  function ApiError(status, message) {
    this.status = status;
    this.message = message || ("HTTP " + status);
  }

  function api(method, path, body) {
    var headers = {"Accept": "application/vnd.nsq; version=1.0", "X-UserAgent": CONFIG.USER_AGENT};
    var init = {method: method, headers: headers, credentials: "same-origin", cache: "no-store"};
    if (method !== "GET") {
      headers["Content-Type"] = "application/json";
      headers[CONFIG.CSRF_HEADER] = CONFIG.CSRF_TOKEN;
      init.body = JSON.stringify(body || {});
    }
    return fetch(BASE + "/api" + path, init).then(function (response) {
      return response.text().then(function (text) {
        var data = null;
        try { data = text ? JSON.parse(text) : {}; } catch (e) { data = {message: text}; }
        if (!response.ok) throw new ApiError(response.status, data && data.message);
        return data;
      });
    }, function () {
      throw new ApiError(0, "the admin server cannot be reached");
    });
  }

  // -- result messages ------------------------------------------------------------------------------------
  var flashTimer = null;

  function flash(kind, text) {
    var box = document.getElementById("flash");
    box.className = "flash " + kind;
    replaceChildren(box, h("span", null, text), h("button", {type: "button", "class": "flash-close",
      "aria-label": "Dismiss", onclick: function () { box.className = "flash"; replaceChildren(box); }}, "×"));
    box.hidden = false;
    clearTimeout(flashTimer);
    if (kind === "ok") {
      flashTimer = setTimeout(function () { box.className = "flash"; replaceChildren(box); }, 12000);
    }
  }

  // -- confirmation ---------------------------------------------------------------------------------------
  function confirmDialog(options) {
    var modal = document.getElementById("modal");
    return new Promise(function (resolve) {
      function close(answer) {
        modal.hidden = true;
        replaceChildren(modal);
        document.removeEventListener("keydown", onKey);
        resolve(answer);
      }
      function onKey(event) {
        if (event.key === "Escape") close(false);
      }
      var confirmButton = h("button", {type: "button", "class": options.danger ? "btn danger" : "btn primary",
        onclick: function () { close(true); }}, options.confirm || "Confirm");
      var dialog = h("div", {"class": "modal-box", role: "dialog", "aria-modal": "true",
        "aria-labelledby": "modal-title"},
        h("h2", {id: "modal-title"}, options.title),
        h("p", null, options.text),
        h("div", {"class": "modal-buttons"},
          h("button", {type: "button", "class": "btn", onclick: function () { close(false); }}, "Cancel"),
          confirmButton));
      replaceChildren(modal, dialog);
      modal.hidden = false;
      modal.onclick = function (event) { if (event.target === modal) close(false); };
      document.addEventListener("keydown", onKey);
      confirmButton.focus();
    });
  }

  /* Ask, call, report: every action goes through here so that each has a confirmation and a visible result. */
  function runAction(options) {
    return confirmDialog(options).then(function (yes) {
      if (!yes) return false;
      return options.call().then(function (data) {
        var warning = data && data.message ? " (" + data.message + ")" : "";
        flash(warning ? "warn" : "ok", options.done + warning);
        if (options.after) options.after();
        else refreshNow();
        return true;
      }, function (error) {
        var hint = error.message === "INVALID_CSRF_TOKEN" ? " — reload the page and try again" : "";
        flash("error", options.title + " failed: " + error.message + hint);
        refreshNow();
        return false;
      });
    });
  }

  // -- routing and refresh --------------------------------------------------------------------------------
  var pages = {};
  var routes = [];
  var current = null;
  var generation = 0;
  var timer = null;
  var live = true;

  function route(pattern, name) {
    routes.push({parts: pattern.split("/").filter(Boolean), name: name});
  }

  function resolve(path) {
    var parts = path.split("/").filter(Boolean);
    for (var i = 0; i < routes.length; i++) {
      var want = routes[i].parts;
      if (want.length !== parts.length) continue;
      var params = {};
      var ok = true;
      for (var j = 0; j < want.length && ok; j++) {
        if (want[j].charAt(0) === ":") {
          try { params[want[j].slice(1)] = decodeURIComponent(parts[j]); } catch (e) { ok = false; }
        } else if (want[j] !== parts[j]) {
          ok = false;
        }
      }
      if (ok) return {name: routes[i].name, params: params};
    }
    return null;
  }

  function appPath() {
    var path = window.location.pathname;
    if (BASE && path.indexOf(BASE) === 0) path = path.slice(BASE.length);
    return path || "/";
  }

  function navigate(path) {
    window.history.pushState(null, "", BASE + path);
    show();
    window.scrollTo(0, 0);
  }

  function show() {
    var main = document.getElementById("main");
    var found = resolve(appPath());
    generation++;
    clearTimeout(timer);
    document.querySelectorAll("[data-nav]").forEach(function (link) {
      link.classList.toggle("active", !!found && pages[found.name] && pages[found.name].section === link.getAttribute("data-nav"));
    });
    if (!found || !pages[found.name]) {
      current = null;
      document.title = "Not found · nsqadmin";
      replaceChildren(main, h("section", {"class": "card"}, h("h1", null, "Page not found"),
        h("p", null, "Nothing lives at this address. "), h("a", {href: "/topics"}, "Back to the topics")));
      return;
    }
    var page = pages[found.name];
    current = page.create(found.params);
    current.generation = generation;
    replaceChildren(main);
    current.mount(main);
    refreshNow();
  }

  function refreshNow() {
    clearTimeout(timer);
    var page = current;
    if (!page) return;
    var mine = page.generation;
    Promise.resolve().then(function () { return page.refresh(); }).then(function () {
      if (mine === generation) setPageError(page, null);
    }, function (error) {
      if (mine === generation) setPageError(page, error);
    }).then(function () {
      if (mine !== generation) return;
      document.body.setAttribute("data-refreshed", String(Date.now()));
      schedule();
    });
  }

  function schedule() {
    clearTimeout(timer);
    if (!live || !current) return;
    timer = setTimeout(refreshNow, (current.refreshSeconds || REFRESH_SECONDS) * 1000);
  }

  function setPageError(page, error) {
    if (!page.errorBox) return;
    if (!error) { page.errorBox.hidden = true; replaceChildren(page.errorBox); return; }
    page.errorBox.hidden = false;
    replaceChildren(page.errorBox, "Could not load this page's data: " + (error.message || String(error)) +
      ". Showing the last data received; retrying.");
  }

  function isCurrent(page) { return page.generation === generation; }

  function setLive(on) {
    live = on;
    var button = document.getElementById("live-toggle");
    button.textContent = on ? "Pause updates" : "Resume updates";
    button.setAttribute("aria-pressed", on ? "false" : "true");
    document.getElementById("live-dot").className = on ? "live-dot on" : "live-dot";
    document.getElementById("live-label").textContent = on ? "live, every " + REFRESH_SECONDS + "s" : "paused";
    if (on) refreshNow(); else clearTimeout(timer);
  }

  function boot() {
    document.getElementById("version").textContent = "v" + CONFIG.VERSION;
    document.querySelectorAll("a[data-nav]").forEach(function (link) {
      link.setAttribute("href", BASE + link.getAttribute("data-path"));
      link.setAttribute("data-internal", "");
    });
    var brand = document.querySelector("a.brand");
    brand.setAttribute("href", BASE + "/");
    brand.setAttribute("data-internal", "");
    document.getElementById("live-toggle").addEventListener("click", function () { setLive(!live); });
    document.addEventListener("click", function (event) {
      var link = event.target.closest ? event.target.closest("a[data-internal]") : null;
      if (!link || event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey ||
          event.shiftKey || event.altKey) return;
      event.preventDefault();
      var href = link.getAttribute("href");
      navigate(href.slice(BASE.length) || "/");
    });
    window.addEventListener("popstate", show);
    if (!CONFIG.IS_ADMIN) {
      document.getElementById("role").textContent = "read-only" + (CONFIG.USER ? " · " + CONFIG.USER : "");
      document.getElementById("role").hidden = false;
    } else if (CONFIG.USER) {
      document.getElementById("role").textContent = CONFIG.USER;
      document.getElementById("role").hidden = false;
    }
    setLive(true);
    show();
  }

  window.NSQAdmin = {
    CONFIG: CONFIG, BASE: BASE, h: h, add: add, replaceChildren: replaceChildren, seg: seg, api: api, flash: flash,
    runAction: runAction, navigate: navigate, refreshNow: refreshNow, isCurrent: isCurrent, route: route,
    pages: pages, fmtInt: fmtInt, fmtRate: fmtRate, fmtDuration: fmtDuration, fmtLatency: fmtLatency,
    REFRESH_SECONDS: REFRESH_SECONDS
  };

  document.addEventListener("DOMContentLoaded", boot);
})();
