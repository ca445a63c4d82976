// The console's only script: live output of a running deployment over the
// API's events stream (EventSource resumes after a reconnect with
// Last-Event-ID), the focus on a refused form's errors, the job form's
// fields per source type, and the time zone hint. No inline scripts: the CSP
// allows only this file.
(function () {
  "use strict";
  var live = document.getElementById("live-output");
  if (live && window.EventSource) {
    var state = document.getElementById("live-state");
    var es = new EventSource(live.getAttribute("data-events"));
    var types = ["run_started", "play_started", "task_started", "host_ok", "host_changed",
      "host_failed", "host_unreachable", "host_skipped", "run_finished"];
    var add = function (ev) {
      var d;
      try { d = JSON.parse(ev.data); } catch (e) { return; }
      var parts = [d.time || "", d.type || ev.type];
      if (d.play) { parts.push("play=" + d.play); }
      if (d.task) { parts.push("task=" + d.task); }
      if (d.host) { parts.push("host=" + d.host); }
      if (d.status) { parts.push("status=" + d.status); }
      if (d.message) { parts.push(d.message); }
      // textContent: event fields are shown as text, never parsed as HTML.
      var line = document.createElement("div");
      line.className = "ev ev-" + (d.type || ev.type).replace(/[^a-z_]/g, "");
      line.textContent = parts.join("  ");
      live.appendChild(line);
      live.scrollTop = live.scrollHeight;
      if ((d.type || ev.type) === "run_finished") {
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
  // A refused form: its error summary gets the focus, so that a screen
  // reader or the keyboard starts there.
  var summary = document.getElementById("error-summary");
  if (summary) { summary.focus(); }
  // The job form shows the fields of the chosen source type only.
  var type = document.getElementById("f-source.type");
  if (type) {
    var show = function () {
      document.querySelectorAll("[data-for]").forEach(function (el) {
        el.hidden = el.getAttribute("data-for").split(" ").indexOf(type.value) < 0;
      });
    };
    type.addEventListener("change", show);
    show();
  }
  var reload = document.getElementById("live-reload");
  if (reload) {
    reload.addEventListener("click", function () { window.location.reload(); });
  }
})();
