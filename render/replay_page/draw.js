// The panels of the page, drawn from step records: the saved replay (replay.js) and the live dashboard (live.js)
// both call these, so a step looks the same whichever way it reached the page.
// Text from a trace or a server is only ever set as textContent, never parsed as HTML.
(function () {
  "use strict";
  var D = window.MinisglDraw = {};
  var SVG = "http://www.w3.org/2000/svg";
  D.STATE = { " ": "not arrived", "w": "waiting", "P": "prefill", "D": "decode", "p": "paused", ".": "finished",
    "x": "preempted" };

  D.$ = function (id) { return document.getElementById(id); };
  var $ = D.$;
  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    for (var key in attrs || {}) {
      if (key === "text") node.textContent = attrs[key]; else node.setAttribute(key, attrs[key]);
    }
    (children || []).forEach(function (c) { node.appendChild(typeof c === "string" ? document.createTextNode(c) : c); });
    return node;
  }
  D.el = el;
  function svg(tag, attrs) {
    var node = document.createElementNS(SVG, tag);
    for (var key in attrs) node.setAttribute(key, attrs[key]);
    return node;
  }
  function uidColor(uid) { return "hsl(" + ((uid * 137.508) % 360).toFixed(1) + ", 55%, 52%)"; }
  D.followed = null;  // the request the reader clicked: highlighted everywhere, described in its own panel
  D.onFollow = function () {};
  function uidTag(uid) {
    var tag = el("span", { "class": "uid" + (uid === D.followed ? " followed" : ""), "data-uid": uid, title: "follow uid" + uid },
      [el("span", { "class": "swatch", style: "background:" + uidColor(uid) }), "uid" + uid]);
    tag.addEventListener("click", function (ev) { ev.stopPropagation(); D.followed = D.followed === uid ? null : uid; D.onFollow(); });
    return tag;
  }
  D.uidTag = uidTag;
  D.oneLine = function (text) { return text.replace(/\s+/g, " "); };
  D.visible = function (text) { return text.trim() ? text : text.replace(/ /g, "\u2423").replace(/\n/g, "\u21b5\n"); };
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }
  D.clear = clear;
  function plural(n, word) { return n + " " + word + (n === 1 ? "" : "s"); }

  // Each request's state per step, as render/lifecycle.py computes it, for steps that arrive one at a time.
  // A request first seen inside the window (its arrival scrolled out) counts as arriving where it is first seen.
  D.lives = function (steps) {
    var arrival = {}, order = [];
    function see(uid, i) { if (!(uid in arrival)) { arrival[uid] = i; order.push(uid); } }
    steps.forEach(function (e, i) {
      e.arrived.forEach(function (u) { if (!(u in arrival) || arrival[u] > i) { if (!(u in arrival)) order.push(u); arrival[u] = i; } });
      e.reqs.forEach(function (r) { see(r.uid, i); });
      e.waits.forEach(function (w) { see(w.uid, i); });
      e.finished.forEach(function (u) { see(u, i); });
      (e.preempted || []).forEach(function (u) { see(u, i); });
    });
    order.sort(function (a, b) { return a - b; });
    var started = {}, finish = {}, states = {};
    order.forEach(function (u) { states[u] = []; });
    steps.forEach(function (e, i) {
      var inBatch = {}, waiting = {}, preempted = {};
      e.reqs.forEach(function (r) { inBatch[r.uid] = true; });
      e.waits.forEach(function (w) { waiting[w.uid] = true; });
      (e.preempted || []).forEach(function (u) { preempted[u] = true; });
      order.forEach(function (u) {
        var s;
        if (inBatch[u]) { s = e.phase === "prefill" ? "P" : "D"; started[u] = true; }
        else if (preempted[u]) s = "x";
        else if (u in finish) s = ".";
        else if (i < arrival[u]) s = " ";
        else if (waiting[u] || !started[u]) s = "w";
        else s = "p";
        states[u].push(s);
      });
      e.finished.forEach(function (u) { if (!(u in finish)) finish[u] = i; });
    });
    return order.map(function (u) { return { uid: u, arrival: arrival[u], states: states[u].join("") }; });
  };

  D.batch = function (box, e, label) {
    clear(box);
    box.setAttribute("data-uids", e.reqs.map(function (r) { return r.uid; }).join(" "));
    box.setAttribute("data-phase", e.phase);
    box.appendChild(el("div", {}, [el("span", { "class": "phase " + e.phase, text: e.phase }),
      " \u00b7 " + plural(e.batch_size, "request") + " \u00b7 " + e.num_tokens +
      " tokens \u00b7 " + (e.elapsed_s * 1000).toFixed(1) + " ms" +
      (e.mask_fill_s ? " \u00b7 grammar masks " + (e.mask_fill_s * 1000).toFixed(2) + " ms" : "")]));
    if (e.note) box.appendChild(el("div", { "class": "note", text: e.note }));
    var rows = e.reqs.map(function (r) {
      var done = e.finished.indexOf(r.uid) >= 0;
      var uid = r.constrained ? [uidTag(r.uid), el("span", { "class": "grammar", title: "under a grammar", text: "\u00a7" })]
        : [uidTag(r.uid)];
      return el("tr", { "class": (done ? "done" : "") + (r.uid === D.followed ? " followed" : "") }, [el("td", {}, uid),
        el("td", { "class": "num", text: String(r.extend_len) }), el("td", { "class": "num", text: String(r.cached_len) }),
        el("td", { "class": "hide-narrow", text: D.oneLine(label(r.uid)).slice(0, 48) }),
        el("td", { text: done ? "finished" : "" })]);
    });
    box.appendChild(el("div", { "class": "scroll" }, [el("table", {}, [el("thead", {}, [el("tr", {}, [
      el("th", { text: "uid" }), el("th", { "class": "num", text: "extend" }), el("th", { "class": "num", text: "cached" }),
      el("th", { "class": "hide-narrow", text: "prompt" }), el("th", { text: "" })])]), el("tbody", {}, rows)])]));
  };

  D.queue = function (box, title, e, lives, step) {
    clear(box);
    var reasons = {};
    e.waits.forEach(function (w) { reasons[w.uid] = w; });
    var queued = lives.filter(function (l) { return l.states[step] === "w"; });
    var paused = lives.filter(function (l) { return l.states[step] === "p"; });
    title.textContent = "queue (" + queued.length + " waiting)";
    box.setAttribute("data-uids", queued.map(function (l) { return l.uid; }).join(" "));
    if (!queued.length) box.appendChild(el("div", { "class": "empty", text: "nobody is waiting" }));
    box.appendChild(el("ul", { "class": "queue" }, queued.map(function (l) {
      var w = reasons[l.uid], why = w ? w.text : (l.arrival === step ? "arrived before this step" : "waiting");
      return el("li", { "data-uid": l.uid, "data-kind": w ? w.kind : "" },
        [uidTag(l.uid), " ", el("span", { "class": "reason", text: why })]);
    })));
    if (e.arrived.length) box.appendChild(el("div", { "class": "reason", text: "arrived before this step: " +
      e.arrived.map(function (u) { return "uid" + u; }).join(" ") }));
    if (paused.length) box.appendChild(el("div", { "class": "reason", text: "running, not in this " + e.phase + " batch: " +
      paused.map(function (l) { return "uid" + l.uid; }).join(" ") }));
  };

  D.kv = function (box, e) {
    var kv = e.kv_parts, total = Math.max(kv.total, 1);
    clear(box);
    ["requests", "cached", "free", "total"].forEach(function (k) { box.setAttribute("data-" + k, String(kv[k])); });
    var bar = el("div", { "class": "kvbar" });
    function part(cls, pages, color, title) {
      if (pages <= 0) return;
      bar.appendChild(el("div", { "class": cls, title: title, style: "width:" + (100 * pages / total).toFixed(3) + "%" +
        (color ? ";background:" + color : "") }));
    }
    if (kv.by_request) kv.by_request.forEach(function (p) { part("req", p[1], uidColor(p[0]), "uid" + p[0] + ": " + p[1] + " pages"); });
    else part("req", kv.requests, "var(--decode)", "requests: " + kv.requests + " pages");
    part("cached", kv.cached, null, "prefix cache: " + kv.cached + " pages");
    part("free", kv.free, null, "free: " + kv.free + " pages");
    box.appendChild(bar);
    var words = kv.by_request ? kv.by_request.map(function (p) { return "uid" + p[0] + " " + p[1]; }) : ["requests " + kv.requests];
    words.push("prefix cache " + kv.cached, "free " + kv.free + " of " + kv.total + " pages");
    if (e.evicted_pages) words.push(e.evicted_pages + " evicted in this step");
    if (e.preempted && e.preempted.length) words.push(e.preempted_pages + " given back by preempting " +
      e.preempted.map(function (u) { return "uid" + u; }).join(" "));
    box.appendChild(el("div", { "class": "kvlegend", text: words.join(" \u00b7 ") }));
  };

  D.radix = function (box, nodes) {
    clear(box);
    if (!nodes) { box.appendChild(el("div", { "class": "empty", text: "not recorded in this step" })); return; }
    var children = {};
    nodes.forEach(function (node) { var p = node.parent_id === null ? "root" : node.parent_id; (children[p] = children[p] || []).push(node); });
    function branch(key, cls) {
      return el("ul", { "class": cls }, (children[key] || []).map(function (node) {
        var span = node.text !== null && node.text !== undefined ? " " + JSON.stringify(node.text) :
          node.first_tokens.length ? " [" + node.first_tokens.join(" ") + "]" : "";
        var words = [node.num_tokens + " tokens" + span + (node.first_tokens.length && node.num_tokens > node.first_tokens.length ? " \u2026" : ""),
          node.pages + " pages"];
        var item = el("li", {}, [el("span", { "class": "mono", text: "n" + node.node_id + " " }), words.join(" \u00b7 ")]);
        if (node.lock_count) item.appendChild(el("span", { "class": "locked", text: " \u00b7 locked \u00d7" + node.lock_count }));
        node.holders.forEach(function (u) { item.appendChild(document.createTextNode(" ")); item.appendChild(uidTag(u)); });
        if (children[node.node_id]) item.appendChild(branch(node.node_id, "tree"));
        return item;
      }));
    }
    box.appendChild(nodes.length ? branch("root", "tree root") : el("div", { "class": "empty", text: "empty tree" }));
  };

  // The timeline: one row per request, one column per step held; a click on the bars picks a step.
  D.gantt = function (lives, n, label, first, last) {
    var labelsBox = clear($("gantt-labels")), bars = clear($("gantt-bars"));
    lives.forEach(function (life) {
      labelsBox.appendChild(el("div", { title: label(life.uid), "class": life.uid === D.followed ? "followed" : "" },
        [uidTag(life.uid), " " + D.oneLine(label(life.uid))]));
      var row = svg("svg", { viewBox: "0 0 " + Math.max(n, 1) + " 1", preserveAspectRatio: "none", "data-uid": life.uid,
                            "class": life.uid === D.followed ? "followed" : "" });
      var i = 0;
      while (i < n) {
        var s = life.states[i], j = i;
        while (j < n && life.states[j] === s) j++;
        if ("wPDpx".indexOf(s) >= 0) row.appendChild(svg("rect", { x: i, y: s === "p" ? 0.3 : 0.12, width: j - i, height: s === "p" ? 0.4 : 0.76, "class": s }));
        i = j;
      }
      if (life.arrival < n) row.appendChild(svg("rect", { x: life.arrival, y: 0, width: Math.max(n, 1) / 400, height: 1, "class": "arrival" }));
      bars.appendChild(row);
    });
    bars.appendChild(el("div", { "class": "cursor", id: "gantt-cursor" }));
    $("axis-start").textContent = "step " + first;
    $("axis-end").textContent = "step " + last;
  };
  D.onPick = function () {};
  // space plays or pauses, the arrows step: the same keys on the saved replay and the live page
  D.listenKeys = function () {
    document.addEventListener("keydown", function (ev) {
      if (ev.target.tagName === "SELECT" || ev.target.tagName === "INPUT") return;
      var button = { " ": "play", ArrowRight: "next", ArrowLeft: "prev" }[ev.key];
      if (!button) return;
      if (ev.key === " ") ev.preventDefault();
      document.getElementById(button).click();
    });
  };
  D.listenGantt = function (count) {
    var bars = $("gantt-bars");
    bars.addEventListener("click", function (ev) {
      var rect = bars.getBoundingClientRect(), n = count();
      D.onPick(Math.min(n - 1, Math.max(0, Math.floor((ev.clientX - rect.left) / rect.width * n))));
    });
  };
  D.ganttCursor = function (step, n) {
    var cursor = $("gantt-cursor");
    cursor.style.left = (100 * step / Math.max(n, 1)) + "%";
    cursor.style.width = (100 / Math.max(n, 1)) + "%";
  };

  // The followed request: where it is at this step and its whole life in the steps held.
  D.request = function (box, life, index, steps, info) {
    clear(box);
    if (!life) { box.appendChild(el("div", { "class": "empty", text: "click a uid to follow a request" })); return; }
    var s = life.states, count = function (c) { return s.split(c).length - 1; };
    var seen = function (c) { var i = s.indexOf(c); return i < 0 ? null : steps[i].step; };
    var done = -1;
    steps.forEach(function (e, i) { if (done < 0 && e.finished.indexOf(life.uid) >= 0) done = i; });
    var facts = [["now", D.STATE[s[index]] || "not seen"],
      ["arrived", life.arrival < steps.length ? "before step " + steps[life.arrival].step : "-"],
      ["waited", plural(count("w"), "step")], ["prefilled", count("P") ? plural(count("P"), "step") + " from step " + seen("P") : "-"],
      ["decoded", plural(count("D"), "step")], ["preempted", count("x") ? plural(count("x"), "time") : "-"], ["finished", done >= 0 ? "in step " + steps[done].step : "-"]];
    if (info) {
      facts.push(["tokens", (info.prompt_tokens === null ? "" : info.prompt_tokens + " prompt, ") + info.completion_tokens + " generated"]);
      if (info.finish_reason) facts.push(["finish", info.finish_reason]);
    }
    box.appendChild(el("div", {}, [uidTag(life.uid)]));
    box.appendChild(el("dl", { "class": "facts" }, [].concat.apply([], facts.map(function (f) {
      return [el("dt", { text: f[0] }), el("dd", { text: f[1] })]; }))));
    if (info && info.prompt !== undefined) box.appendChild(el("div", { "class": "completion", text: "prompt: " + info.prompt }));
    if (info && info.completion !== undefined) box.appendChild(el("div", { "class": "completion", text: "completion: " + D.visible(info.completion) }));
  };
})();
