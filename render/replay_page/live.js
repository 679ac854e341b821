// The live dashboard: steps stream in over Server-Sent Events and the same panels (draw.js) show the newest one,
// or, paused, any of the last steps held here. The server sends only the newest step to a viewer that lags, so
// the steps held may have gaps; every record carries the facts about the requests it names.
(function () {
  "use strict";
  var D = window.MinisglDraw, $ = D.$, el = D.el;
  var config = JSON.parse(document.getElementById("dashboard-data").textContent);
  var steps = [], info = {}, lives = [], current = -1, following = true, radix = false, source = null, pending = false;
  var FIGURES = [["tokens_per_s", "tokens/s"], ["ttft_p50_ms", "TTFT p50 ms"], ["ttft_p90_ms", "TTFT p90 ms"],
    ["ttft_p99_ms", "TTFT p99 ms"], ["tpot_p50_ms", "TPOT p50 ms"], ["tpot_p90_ms", "TPOT p90 ms"],
    ["tpot_p99_ms", "TPOT p99 ms"], ["running", "running"], ["waiting", "waiting"], ["finished", "finished"]];

  function label(uid) {
    var r = info[uid];
    if (!r) return "";
    return r.prompt !== undefined ? r.prompt : r.prompt_tokens + " prompt tokens";
  }

  function showSettings() {
    var o = config.options, parts = [config.model];
    for (var key in o) if (o[key] !== null && o[key] !== "") parts.push(key + " " + o[key]);
    parts.push("the last " + config.history + " steps are kept for stepping back");
    if (!config.show_text) parts.push("prompts and completions hidden (--dashboard-show-text shows them)");
    $("settings").textContent = parts.join(" \u00b7 ");
  }

  function connect() {
    if (source) source.close();
    source = new EventSource(config.events_url + (radix ? "?radix=1" : ""));
    source.addEventListener("open", function () { $("connection").textContent = "\u25cf live"; $("connection").className = "live"; });
    source.addEventListener("error", function () { $("connection").textContent = "reconnecting\u2026"; $("connection").className = ""; });
    source.addEventListener("step", function (ev) { add(JSON.parse(ev.data)); });
    source.addEventListener("figures", function (ev) { figures(JSON.parse(ev.data)); });
  }

  function add(record) {
    if (steps.length && record.step <= steps[steps.length - 1].step) return;  // already held (a reconnect resends)
    for (var uid in record.requests || {}) info[uid] = record.requests[uid];
    var keep = following ? null : steps[current] && steps[current].step;
    steps.push(record);
    if (steps.length > config.history) steps.splice(0, steps.length - config.history);
    if (keep !== null) current = Math.max(0, indexOf(keep));
    schedule();
  }
  function indexOf(step) { for (var i = 0; i < steps.length; i++) if (steps[i].step >= step) return i; return steps.length - 1; }

  function schedule() { if (!pending) { pending = true; setTimeout(function () { pending = false; render(); }, 30); } }

  function render() {
    if (!steps.length) return;
    lives = D.lives(steps);
    var known = {};
    lives.forEach(function (l) { known[l.uid] = true; });
    for (var uid in info) if (!known[uid]) delete info[uid];  // facts about requests outside the window go
    if (following) current = steps.length - 1;
    $("slider").max = String(steps.length - 1);
    D.gantt(lives, steps.length, label, steps[0].step, steps[steps.length - 1].step);
    recent();
    show(current);
  }

  function show(i) {
    current = i;
    var e = steps[i];
    $("slider").value = String(i);
    $("step-label").textContent = "step " + e.step + " \u00b7 " + e.phase + (following ? " \u00b7 newest" : " \u00b7 paused");
    $("step-label").setAttribute("data-step", String(e.step));
    D.batch($("batch"), e, label);
    D.queue($("queue"), $("queue-title"), e, lives, i);
    D.kv($("kv"), e);
    if (radix) D.radix($("radix"), e.radix);
    D.ganttCursor(i, steps.length);
    var life = lives.filter(function (l) { return l.uid === D.followed; })[0];
    $("request-panel").hidden = D.followed === null;
    D.request($("request"), life, i, steps, life ? info[life.uid] : null);
  }

  function recent() {
    var box = D.clear($("generations"));
    var uids = lives.map(function (l) { return l.uid; }).reverse().slice(0, 40);
    if (!uids.length) { box.appendChild(el("div", { "class": "empty", text: "no requests yet" })); return; }
    var rows = uids.map(function (uid) {
      var r = info[uid] || {}, life = lives.filter(function (l) { return l.uid === uid; })[0];
      var text = r.completion !== undefined ? D.visible(r.completion) : "";
      return el("tr", { "data-uid": uid }, [el("td", {}, [D.uidTag(uid)]), el("td", { "class": "num", text: String(r.prompt_tokens || 0) }),
        el("td", { "class": "num", text: String(r.completion_tokens || 0) }), el("td", { text: r.finish_reason || D.STATE[life.states[life.states.length - 1]] }),
        el("td", { "class": "completion", text: text })]);
    });
    box.appendChild(el("div", { "class": "scroll" }, [el("table", {}, [el("thead", {}, [el("tr", {}, [
      el("th", { text: "uid" }), el("th", { "class": "num", text: "prompt" }), el("th", { "class": "num", text: "generated" }),
      el("th", { text: "state" }), el("th", { text: config.show_text ? "completion" : "" })])]), el("tbody", {}, rows)])]));
  }

  function figures(f) {
    $("figures-panel").hidden = false;
    var box = D.clear($("figures"));
    box.className = "figures";
    FIGURES.forEach(function (pair) {
      var v = f[pair[0]];
      box.appendChild(el("div", { "data-name": pair[0] }, [el("b", { text: v === null || v === undefined ? "-" : String(v) }), pair[1]]));
    });
  }

  function pause() { following = false; $("play").textContent = "\u25b6 live"; }
  function resume() { following = true; $("play").textContent = "\u23f8 pause"; render(); }

  showSettings();
  ["radix-toggle", "connection"].forEach(function (id) { $(id).hidden = false; });
  $("speed").hidden = true;
  $("play").textContent = "\u23f8 pause";
  $("play").title = "pause on this step / back to the newest (space)";
  document.querySelector("#generations-panel h2").textContent = "requests in the window";
  $("step-label").textContent = "waiting for the first step";
  $("play").addEventListener("click", function () { if (following) pause(); else resume(); });
  $("prev").addEventListener("click", function () { if (!steps.length) return; pause(); show(Math.max(0, current - 1)); });
  $("next").addEventListener("click", function () { if (!steps.length) return; pause(); show(Math.min(steps.length - 1, current + 1)); });
  $("slider").addEventListener("input", function () { if (!steps.length) return; pause(); show(Number($("slider").value)); });
  $("radix-toggle").addEventListener("click", function () {
    radix = !radix;
    $("radix-panel").hidden = !radix;
    $("radix-toggle").textContent = radix ? "hide radix tree" : "show radix tree";
    schedule();
    connect();  // the server asks the engine for the tree only while some viewer's stream wants it
  });
  D.listenKeys();
  D.onPick = function (i) { pause(); show(i); };
  D.onFollow = function () { render(); };
  D.listenGantt(function () { return steps.length; });
  connect();
})();
