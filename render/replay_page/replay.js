// The replay: every panel is drawn from the trace embedded in this page, for the step the slider is on.
// Text from the trace is only ever set as textContent, never parsed as HTML.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("trace-data").textContent);
  var steps = data.steps, lives = data.lives, labels = data.prompts, n = steps.length;
  var STATE = { " ": "not arrived", "w": "waiting", "P": "prefill", "D": "decode", "p": "paused", ".": "finished" };
  var SVG = "http://www.w3.org/2000/svg";
  var current = 0, timer = null;

  function $(id) { return document.getElementById(id); }
  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    for (var key in attrs || {}) {
      if (key === "text") node.textContent = attrs[key]; else node.setAttribute(key, attrs[key]);
    }
    (children || []).forEach(function (c) { node.appendChild(typeof c === "string" ? document.createTextNode(c) : c); });
    return node;
  }
  function svg(tag, attrs) {
    var node = document.createElementNS(SVG, tag);
    for (var key in attrs) node.setAttribute(key, attrs[key]);
    return node;
  }
  function uidColor(uid) { return "hsl(" + ((uid * 137.508) % 360).toFixed(1) + ", 55%, 52%)"; }
  function uidTag(uid) {
    return el("span", { "class": "uid" }, [el("span", { "class": "swatch", style: "background:" + uidColor(uid) }), "uid" + uid]);
  }
  function oneLine(text) { return text.replace(/\s+/g, " "); }
  function visible(text) { return text.trim() ? text : text.replace(/ /g, "\u2423").replace(/\n/g, "\u21b5\n"); }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }

  function showSettings() {
    var o = data.options, parts = [data.model];
    for (var key in o) if (o[key] !== null && o[key] !== "") parts.push(key + " " + o[key]);
    parts.push(labels.length + " requests", n + " steps");
    if (!data.results) parts.push("interrupted: no results");
    $("settings").textContent = parts.join(" \u00b7 ");
  }

  function showBatch(step) {
    var e = steps[step], box = clear($("batch"));
    box.setAttribute("data-uids", e.reqs.map(function (r) { return r.uid; }).join(" "));
    box.setAttribute("data-phase", e.phase);
    box.appendChild(el("div", {}, [el("span", { "class": "phase " + e.phase, text: e.phase }),
      " \u00b7 " + e.batch_size + " request" + (e.batch_size === 1 ? "" : "s") + " \u00b7 " + e.num_tokens +
      " tokens \u00b7 " + (e.elapsed_s * 1000).toFixed(1) + " ms"]));
    if (e.note) box.appendChild(el("div", { "class": "note", text: e.note }));
    var rows = e.reqs.map(function (r) {
      var done = e.finished.indexOf(r.uid) >= 0;
      return el("tr", { "class": done ? "done" : "" }, [el("td", {}, [uidTag(r.uid)]),
        el("td", { "class": "num", text: String(r.extend_len) }), el("td", { "class": "num", text: String(r.cached_len) }),
        el("td", { "class": "hide-narrow", text: oneLine(labels[r.uid]).slice(0, 48) }),
        el("td", { text: done ? "finished" : "" })]);
    });
    box.appendChild(el("div", { "class": "scroll" }, [el("table", {}, [el("thead", {}, [el("tr", {}, [
      el("th", { text: "uid" }), el("th", { "class": "num", text: "extend" }), el("th", { "class": "num", text: "cached" }),
      el("th", { "class": "hide-narrow", text: "prompt" }), el("th", { text: "" })])]), el("tbody", {}, rows)])]));
  }

  function showQueue(step) {
    var e = steps[step], box = clear($("queue")), reasons = {};
    e.waits.forEach(function (w) { reasons[w.uid] = w.text; });
    var queued = lives.filter(function (l) { return l.states[step] === "w"; });
    var paused = lives.filter(function (l) { return l.states[step] === "p"; });
    $("queue-title").textContent = "queue (" + queued.length + " waiting)";
    box.setAttribute("data-uids", queued.map(function (l) { return l.uid; }).join(" "));
    if (!queued.length) box.appendChild(el("div", { "class": "empty", text: "nobody is waiting" }));
    var list = el("ul", { "class": "queue" }, queued.map(function (l) {
      var why = reasons[l.uid] || (l.arrival === step ? "arrived before this step" : "waiting");
      return el("li", {}, [uidTag(l.uid), " ", el("span", { "class": "reason", text: why })]);
    }));
    box.appendChild(list);
    if (e.arrived.length) box.appendChild(el("div", { "class": "reason", text: "arrived before this step: " +
      e.arrived.map(function (u) { return "uid" + u; }).join(" ") }));
    if (paused.length) box.appendChild(el("div", { "class": "reason", text: "running, not in this " + e.phase + " batch: " +
      paused.map(function (l) { return "uid" + l.uid; }).join(" ") }));
  }

  function showKV(step) {
    var e = steps[step], kv = e.kv_parts, box = clear($("kv")), total = Math.max(kv.total, 1);
    var bar = el("div", { "class": "kvbar" });
    function part(cls, pages, color, title) {
      if (pages <= 0) return;
      var d = el("div", { "class": cls, title: title, style: "width:" + (100 * pages / total).toFixed(3) + "%" +
        (color ? ";background:" + color : "") });
      bar.appendChild(d);
    }
    if (kv.by_request) kv.by_request.forEach(function (p) { part("req", p[1], uidColor(p[0]), "uid" + p[0] + ": " + p[1] + " pages"); });
    else part("req", kv.requests, "var(--decode)", "requests: " + kv.requests + " pages");
    part("cached", kv.cached, null, "prefix cache: " + kv.cached + " pages");
    part("free", kv.free, null, "free: " + kv.free + " pages");
    box.appendChild(bar);
    var words = kv.by_request ? kv.by_request.map(function (p) { return "uid" + p[0] + " " + p[1]; }) : ["requests " + kv.requests];
    words.push("prefix cache " + kv.cached, "free " + kv.free + " of " + kv.total + " pages");
    if (e.evicted_pages) words.push(e.evicted_pages + " evicted in this step");
    box.appendChild(el("div", { "class": "kvlegend", text: words.join(" \u00b7 ") }));
  }

  function showRadix(step) {
    var panel = $("radix-panel");
    if (!data.has_radix) { panel.hidden = true; return; }
    var nodes = steps[step].radix, box = clear($("radix"));
    if (!nodes) { box.appendChild(el("div", { "class": "empty", text: "not recorded in this step" })); return; }
    var children = {};
    nodes.forEach(function (node) { var p = node.parent_id === null ? "root" : node.parent_id; (children[p] = children[p] || []).push(node); });
    function branch(key, cls) {
      return el("ul", { "class": cls }, (children[key] || []).map(function (node) {
        var span = node.text !== null && node.text !== undefined ? JSON.stringify(node.text) : "[" + node.first_tokens.join(" ") + "]";
        var words = [node.num_tokens + " tokens " + span + (node.num_tokens > node.first_tokens.length ? " \u2026" : ""),
          node.pages + " pages"];
        var item = el("li", {}, [el("span", { "class": "mono", text: "n" + node.node_id + " " }), words.join(" \u00b7 ")]);
        if (node.lock_count) item.appendChild(el("span", { "class": "locked", text: " \u00b7 locked \u00d7" + node.lock_count }));
        if (node.holders.length) item.appendChild(document.createTextNode(" \u00b7 " + node.holders.map(function (u) { return "uid" + u; }).join(" ")));
        if (children[node.node_id]) item.appendChild(branch(node.node_id, "tree"));
        return item;
      }));
    }
    box.appendChild(nodes.length ? branch("root", "tree root") : el("div", { "class": "empty", text: "empty tree" }));
  }

  function buildGantt() {
    var labelsBox = $("gantt-labels"), bars = $("gantt-bars");
    lives.forEach(function (life) {
      labelsBox.appendChild(el("div", { title: labels[life.uid] }, [uidTag(life.uid), " " + oneLine(labels[life.uid])]));
      var row = svg("svg", { viewBox: "0 0 " + Math.max(n, 1) + " 1", preserveAspectRatio: "none", "data-uid": life.uid });
      var i = 0;
      while (i < n) {
        var s = life.states[i], j = i;
        while (j < n && life.states[j] === s) j++;
        if ("wPDp".indexOf(s) >= 0) row.appendChild(svg("rect", { x: i, y: s === "p" ? 0.3 : 0.12, width: j - i, height: s === "p" ? 0.4 : 0.76, "class": s }));
        i = j;
      }
      if (life.arrival < n) row.appendChild(svg("rect", { x: life.arrival, y: 0, width: Math.max(n, 1) / 400, height: 1, "class": "arrival" }));
      bars.appendChild(row);
    });
    var cursor = el("div", { "class": "cursor", id: "gantt-cursor" });
    bars.appendChild(cursor);
    bars.addEventListener("click", function (ev) {
      var rect = bars.getBoundingClientRect();
      show(Math.min(n - 1, Math.max(0, Math.floor((ev.clientX - rect.left) / rect.width * n))));
    });
    $("axis-end").textContent = "step " + (n - 1);
  }

  function showGantt(step) {
    var cursor = $("gantt-cursor");
    cursor.style.left = (100 * step / n) + "%";
    cursor.style.width = (100 / n) + "%";
  }

  function buildGenerations() {
    var box = $("generations");
    if (!data.results) { box.appendChild(el("div", { "class": "empty", text: "the run was interrupted: no generations were recorded" })); return; }
    var rows = data.results.map(function (r) {
      var completion = r.finish_reason === "error" ? (r.error || "error") : visible(r.text);
      return el("tr", {}, [el("td", {}, [uidTag(r.uid)]), el("td", { "class": "hide-narrow", text: oneLine(labels[r.uid]) }),
        el("td", { "class": "completion", text: completion }), el("td", { text: r.finish_reason }),
        el("td", { "class": "num", text: String(r.token_ids.length) }), el("td", { "class": "state-now", id: "now-" + r.uid })]);
    });
    box.appendChild(el("div", { "class": "scroll" }, [el("table", {}, [el("thead", {}, [el("tr", {}, [
      el("th", { text: "uid" }), el("th", { "class": "hide-narrow", text: "prompt" }), el("th", { text: "completion" }),
      el("th", { text: "finish" }), el("th", { "class": "num", text: "tokens" }), el("th", { text: "at this step" })])]),
      el("tbody", {}, rows)])]));
  }

  function showGenerations(step) {
    lives.forEach(function (life) { var cell = $("now-" + life.uid); if (cell) cell.textContent = STATE[life.states[step]]; });
  }

  function show(step) {
    current = step;
    $("slider").value = String(step);
    var e = steps[step];
    $("step-label").textContent = "step " + step + " / " + (n - 1) + " \u00b7 " + e.phase;
    showBatch(step); showQueue(step); showKV(step); showRadix(step); showGantt(step); showGenerations(step);
  }

  function stop() { if (timer !== null) { clearInterval(timer); timer = null; } $("play").textContent = "\u25b6 play"; }
  function play() {
    if (current >= n - 1) show(0);
    $("play").textContent = "\u23f8 pause";
    timer = setInterval(function () { show(current + 1); if (current >= n - 1) stop(); }, Number($("speed").value));
  }

  showSettings();
  if (!n) {
    $("step-label").textContent = "no steps in this trace";
    ["slider", "play", "prev", "next"].forEach(function (id) { $(id).disabled = true; });
    return;
  }
  $("slider").max = String(n - 1);
  $("slider").addEventListener("input", function () { stop(); show(Number($("slider").value)); });
  $("play").addEventListener("click", function () { if (timer === null) play(); else stop(); });
  $("prev").addEventListener("click", function () { stop(); show(Math.max(0, current - 1)); });
  $("next").addEventListener("click", function () { stop(); show(Math.min(n - 1, current + 1)); });
  $("speed").addEventListener("change", function () { if (timer !== null) { stop(); play(); } });
  document.addEventListener("keydown", function (ev) {
    if (ev.target.tagName === "SELECT" || ev.target.tagName === "INPUT") return;
    if (ev.key === " ") { ev.preventDefault(); $("play").click(); }
    else if (ev.key === "ArrowRight") $("next").click();
    else if (ev.key === "ArrowLeft") $("prev").click();
  });
  buildGantt(); buildGenerations();
  show(0);
})();
