// The replay: every panel is drawn (draw.js) from the trace embedded in this page, for the step the slider is on.
(function () {
  "use strict";
  var D = window.MinisglDraw, $ = D.$, el = D.el;
  var data = JSON.parse(document.getElementById("trace-data").textContent);
  var steps = data.steps, lives = data.lives, labels = data.prompts, n = steps.length;
  var current = 0, timer = null;
  function label(uid) { return labels[uid] === undefined ? "uid" + uid : labels[uid]; }

  function showSettings() {
    var o = data.options, parts = [data.model];
    for (var key in o) if (o[key] !== null && o[key] !== "") parts.push(key + " " + o[key]);
    parts.push(labels.length + " requests", n + " steps");
    if (!data.results) parts.push("interrupted: no results");
    $("settings").textContent = parts.join(" \u00b7 ");
  }

  function buildGenerations() {
    var box = $("generations");
    if (!data.results) { box.appendChild(el("div", { "class": "empty", text: "the run was interrupted: no generations were recorded" })); return; }
    var rows = data.results.map(function (r) {
      var completion = r.finish_reason === "error" ? (r.error || "error") : D.visible(r.text);
      return el("tr", {}, [el("td", {}, [D.uidTag(r.uid)]), el("td", { "class": "hide-narrow", text: D.oneLine(label(r.uid)) }),
        el("td", { "class": "completion", text: completion }), el("td", { text: r.finish_reason }),
        el("td", { "class": "num", text: String(r.token_ids.length) }), el("td", { "class": "state-now", id: "now-" + r.uid })]);
    });
    box.appendChild(el("div", { "class": "scroll" }, [el("table", {}, [el("thead", {}, [el("tr", {}, [
      el("th", { text: "uid" }), el("th", { "class": "hide-narrow", text: "prompt" }), el("th", { text: "completion" }),
      el("th", { text: "finish" }), el("th", { "class": "num", text: "tokens" }), el("th", { text: "at this step" })])]),
      el("tbody", {}, rows)])]));
  }

  function result(uid) {
    var r = (data.results || []).filter(function (x) { return x.uid === uid; })[0];
    if (!r) return null;
    return { prompt_tokens: null, completion_tokens: r.token_ids.length, finish_reason: r.finish_reason, prompt: label(uid),
             completion: r.text };
  }

  function show(step) {
    current = step;
    $("slider").value = String(step);
    var e = steps[step];
    $("step-label").textContent = "step " + step + " / " + (n - 1) + " \u00b7 " + e.phase;
    $("step-label").setAttribute("data-step", String(e.step));
    D.batch($("batch"), e, label);
    D.queue($("queue"), $("queue-title"), e, lives, step);
    D.kv($("kv"), e);
    if (data.has_radix) D.radix($("radix"), e.radix);
    D.ganttCursor(step, n);
    lives.forEach(function (life) { var cell = $("now-" + life.uid); if (cell) cell.textContent = D.STATE[life.states[step]]; });
    var life = lives.filter(function (l) { return l.uid === D.followed; })[0];
    $("request-panel").hidden = !life;
    D.request($("request"), life, step, steps, life ? result(life.uid) : null);
  }

  function stop() { if (timer !== null) { clearInterval(timer); timer = null; } $("play").textContent = "\u25b6 play"; }
  function play() {
    if (current >= n - 1) show(0);
    $("play").textContent = "\u23f8 pause";
    timer = setInterval(function () { show(current + 1); if (current >= n - 1) stop(); }, Number($("speed").value));
  }

  showSettings();
  $("radix-panel").hidden = !data.has_radix;
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
  D.listenKeys();
  D.onPick = function (step) { stop(); show(step); };
  D.onFollow = function () { D.gantt(lives, n, label, 0, n - 1); show(current); };
  D.listenGantt(function () { return n; });
  D.gantt(lives, n, label, 0, n - 1);
  buildGenerations();
  show(0);
})();
