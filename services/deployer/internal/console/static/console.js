// The console's only script: live output of a running deployment over the
// API's events stream (EventSource resumes after a reconnect with
// Last-Event-ID), the focus on a refused form's errors, the job form's
// fields per source type, times in the reader's time zone, and the dark
// mode toggle. No inline scripts: the CSP
// allows only this file.
(function () {
  "use strict";
  // ansi appends text to el, its ANSI SGR colour codes (ESC[...m) turned
  // into spans of classes ansi-<code>; everything goes in as text.
  function ansi(el, text) {
    var re = /\u001b\[([0-9;]*)m/g, last = 0, cls = "", m;
    var put = function (s) {
      if (!s) { return; }
      if (!cls) { el.appendChild(document.createTextNode(s)); return; }
      var span = document.createElement("span");
      span.className = cls;
      span.textContent = s;
      el.appendChild(span);
    };
    while ((m = re.exec(text)) !== null) {
      put(text.slice(last, m.index));
      last = re.lastIndex;
      var codes = m[1].split(";").filter(function (c) { return c !== "" && c !== "0"; });
      cls = codes.map(function (c) { return "ansi-" + c.replace(/[^0-9]/g, ""); }).join(" ");
    }
    put(text.slice(last));
  }
  var live = document.getElementById("live-output");
  if (live && window.EventSource) {
    var state = document.getElementById("live-state");
    var badge = document.getElementById("run-status");
    var started = document.getElementById("run-started");
    var es = new EventSource(live.getAttribute("data-events"));
    var types = ["run_started", "play_started", "task_started", "host_ok", "host_changed",
      "host_failed", "host_unreachable", "host_skipped", "run_finished"];
    // The output reads like ansible-playbook's: a play's header once, a
    // task's header once, then a line per host result.
    var play = null, task = null;
    var hostWords = { host_ok: "ok", host_changed: "changed", host_skipped: "skipping",
      host_failed: "fatal", host_unreachable: "fatal" };
    // line appends text (ANSI colours rendered as spans, never as HTML),
    // titled with the event's time.
    var line = function (cls, text, time) {
      var div = document.createElement("div");
      div.className = "ev " + cls;
      if (time) { div.title = time; }
      ansi(div, text);
      live.appendChild(div);
    };
    var setStatus = function (s) {
      if (!badge || !s) { return; }
      badge.textContent = s;
      badge.className = "badge st-" + s.replace(/[^A-Za-z_]/g, "");
    };
    var add = function (ev) {
      var d;
      try { d = JSON.parse(ev.data); } catch (e) { return; }
      var type = (d.type || ev.type).replace(/[^a-z_]/g, "");
      // Follow the output only while the reader is at its end.
      var atEnd = live.scrollHeight - live.scrollTop - live.clientHeight < 40;
      if (d.play && d.play !== play) {
        play = d.play;
        task = null;
        line("ev-play", "PLAY [" + d.play + "]", d.time);
      }
      if (d.task && d.task !== task) {
        task = d.task;
        line("ev-task", "TASK [" + d.task + "]", d.time);
      }
      if (hostWords[type]) {
        var text = hostWords[type] + ": [" + (d.host || "?") + "]";
        if (type === "host_failed") { text += ": FAILED!"; }
        if (type === "host_unreachable") { text += ": UNREACHABLE!"; }
        if (d.message) { text += " => " + d.message; }
        line("ev-" + type, text, d.time);
      } else if (type === "run_started") {
        line("ev-run_started", "run started", d.time);
        setStatus("running");
        if (started && d.time) { started.textContent = d.time; }
      } else if (type === "run_finished") {
        line("ev-run_finished", "run finished: " + (d.status || "") + (d.message && d.message !== d.status ? " (" + d.message + ")" : ""), d.time);
        setStatus(d.status);
      }
      if (atEnd) { live.scrollTop = live.scrollHeight; }
      if (type === "run_finished") {
        es.close();
        if (state) { state.textContent = "finished: reload the page for the full log"; }
        var more = document.getElementById("live-reload");
        if (more) { more.hidden = false; }
      }
    };
    types.forEach(function (t) { es.addEventListener(t, add); });
    es.onopen = function () { if (state) { state.textContent = "following live"; } };
    es.onerror = function () {
      if (state && es.readyState !== EventSource.CLOSED) { state.textContent = "reconnecting..."; }
    };
  }
  // Dark mode: the system's setting, unless the toggle chose (kept in
  // this browser).
  var root = document.documentElement, saved = null;
  try { saved = window.localStorage.getItem("theme"); } catch (e) { saved = null; }
  if (saved === "dark" || saved === "light") { root.setAttribute("data-theme", saved); }
  var toggle = document.getElementById("theme-toggle");
  if (toggle) {
    var isDark = function () {
      var t = root.getAttribute("data-theme");
      return t ? t === "dark" : window.matchMedia("(prefers-color-scheme: dark)").matches;
    };
    var mark = function () { toggle.setAttribute("aria-pressed", isDark() ? "true" : "false"); };
    toggle.hidden = false;
    mark();
    toggle.addEventListener("click", function () {
      var t = isDark() ? "light" : "dark";
      root.setAttribute("data-theme", t);
      try { window.localStorage.setItem("theme", t); } catch (e) { /* private mode: this page only */ }
      mark();
    });
  }
  // Times: the reader's own time zone and how long ago, UTC on hover.
  var ago = function (ms) {
    var s = Math.round(Math.abs(ms) / 1000), fut = ms < 0;
    var t = s < 60 ? s + " s" : s < 3600 ? Math.round(s / 60) + " min" : s < 172800 ? Math.round(s / 3600) + " h" : Math.round(s / 86400) + " days";
    return fut ? "in " + t : t + " ago";
  };
  document.querySelectorAll("time[datetime]").forEach(function (el) {
    var d = new Date(el.getAttribute("datetime"));
    if (isNaN(d.getTime())) { return; }
    el.textContent = d.toLocaleString() + " (" + ago(Date.now() - d.getTime()) + ")";
  });
  // A refused form: its error summary gets the focus, so that a screen
  // reader or the keyboard starts there.
  var summary = document.getElementById("error-summary");
  if (summary) { summary.focus(); }
  // The job form shows the fields of the chosen source and inventory
  // types only: a field's data-for-field names the select it follows.
  var fieldsFor = document.querySelectorAll("[data-for]");
  var show = function () {
    fieldsFor.forEach(function (el) {
      var sel = document.getElementById("f-" + el.getAttribute("data-for-field"));
      if (sel) { el.hidden = el.getAttribute("data-for").split(" ").indexOf(sel.value) < 0; }
    });
  };
  ["f-source.type", "f-inventory.type"].forEach(function (id) {
    var sel = document.getElementById(id);
    if (sel) { sel.addEventListener("change", show); }
  });
  show();
  // Search in a stored log: the lines without the text are hidden, and
  // the count of those with it is said; each line keeps its link (#L<n>).
  var search = document.getElementById("log-search");
  if (search) {
    var lines = document.querySelectorAll("#full-log .log-line");
    var matches = document.getElementById("log-matches");
    search.addEventListener("input", function () {
      var q = search.value.toLowerCase(), n = 0;
      lines.forEach(function (l) {
        var text = l.textContent.slice(l.firstChild.textContent.length).toLowerCase();
        var hit = q === "" || text.indexOf(q) >= 0;
        l.hidden = !hit;
        if (hit) { n++; }
      });
      matches.textContent = q === "" ? "" : n + " of " + lines.length + " lines";
    });
  }
  var reload = document.getElementById("live-reload");
  if (reload) {
    reload.addEventListener("click", function () { window.location.reload(); });
  }
})();
