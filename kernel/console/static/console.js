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

// The approvals inbox: polls for a change (one small read while nothing was asked or answered)
// and swaps in the fresh table; while the visitor is typing in a decide form it only says the
// inbox changed, so nothing typed is lost. Time left counts down every second, from the
// server's clock (the page's data-now) rather than the browser's.
(function () {
  var POLL_MS = 3000;
  var skew = 0; // server time minus browser time, in ms

  function typing(box) {
    var a = document.activeElement;
    if (a && box.contains(a) && (a.tagName === "INPUT" || a.tagName === "TEXTAREA")) return true;
    return Array.prototype.some.call(box.querySelectorAll("form.decide input[name=comment], form.decide input[name=decided_by]"),
      function (i) { return i.value !== ""; });
  }

  function stale(box) {
    if (document.getElementById("inbox-changed")) return;
    var p = document.createElement("p");
    p.id = "inbox-changed";
    p.className = "notice";
    p.setAttribute("role", "status");
    var a = document.createElement("a");
    a.href = window.location.href;
    a.textContent = "Approvals were asked or answered since this page loaded: reload";
    p.appendChild(a);
    box.parentNode.insertBefore(p, box);
  }

  function poll() {
    var box = document.getElementById("inbox");
    if (!box || !box.dataset.live) return;
    var url = box.dataset.live + "?seen=" + encodeURIComponent(box.dataset.seen || "");
    fetch(url, { credentials: "same-origin" })
      .then(function (r) {
        if (r.status === 204 || !r.ok) return null;
        if (typing(box)) { stale(box); return null; }
        return fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
          .then(function (page) { return page.ok ? page.text() : null; });
      })
      .then(function (html) {
        if (html === null) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("inbox");
        var now = document.getElementById("inbox");
        if (!fresh || !now || typing(now)) return;
        now.replaceWith(document.importNode(fresh, true));
        ["pending-total"].forEach(function (id) {
          var a = document.getElementById(id), b = doc.getElementById(id);
          if (a && b) a.textContent = b.textContent;
        });
        var counts = doc.querySelector("ul.counts"), mine = document.querySelector("ul.counts");
        if (counts && mine) mine.replaceWith(document.importNode(counts, true));
        setSkew();
        localTimes();
        tick();
      })
      .catch(function () { /* retried on the next tick */ })
      .finally(function () { window.setTimeout(poll, POLL_MS); });
  }

  function setSkew() {
    var el = document.querySelector("[data-now]");
    if (el) skew = Date.parse(el.dataset.now) - Date.now();
  }

  function left(ms) {
    var s = Math.floor(ms / 1000);
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + String(s % 60).padStart(2, "0") + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h " + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
    return Math.floor(s / 86400) + "d " + Math.floor(s % 86400 / 3600) + "h";
  }

  function tick() {
    var now = Date.now() + skew;
    document.querySelectorAll(".countdown[data-deadline]").forEach(function (el) {
      var ms = Date.parse(el.dataset.deadline) - now;
      el.textContent = ms > 0 ? left(ms) : "expiring";
      el.classList.toggle("expiring", ms <= 0);
    });
  }

  // Times are shown in UTC (and say so); hovering one shows it in the browser's own zone.
  function localTimes() {
    document.querySelectorAll("time.utc[datetime]").forEach(function (el) {
      var t = new Date(el.getAttribute("datetime"));
      if (!isNaN(t)) el.title = t.toLocaleString() + " (your time zone, " + Intl.DateTimeFormat().resolvedOptions().timeZone + ")";
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    setSkew();
    localTimes();
    if (document.querySelector(".countdown[data-deadline]")) { tick(); window.setInterval(tick, 1000); }
    if (document.getElementById("inbox")) window.setTimeout(poll, POLL_MS);
  });
})();
