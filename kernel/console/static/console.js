// The console's one script: a running execution's timeline polls for new events and swaps itself
// in place. The server renders (and escapes) every fragment; nothing here builds HTML from data.
"use strict";
(function () {
  var INTERVAL_MS = 1500;

  function poll() {
    var el = document.getElementById("timeline");
    if (!el || !el.dataset.live) return;
    var url = el.dataset.live + "&seen=" + encodeURIComponent(el.dataset.seen || "");
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) {
        if (r.status === 204) return null;
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) {
        if (html === null) return;
        var open = {};
        el.querySelectorAll("details[open]").forEach(function (d, i) { open[i] = true; });
        var tpl = document.createElement("template");
        tpl.innerHTML = html;
        var fresh = tpl.content.getElementById("timeline");
        if (!fresh) return;
        fresh.querySelectorAll("details").forEach(function (d, i) { if (open[i]) d.open = true; });
        el.replaceWith(fresh);
      })
      .catch(function () { /* a failed poll is retried on the next tick */ })
      .finally(function () {
        var now = document.getElementById("timeline");
        if (now && now.dataset.live) window.setTimeout(poll, INTERVAL_MS);
      });
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (document.getElementById("timeline")) window.setTimeout(poll, INTERVAL_MS);
  });
})();
