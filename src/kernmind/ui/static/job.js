// Live output of a running job: poll its text a second at a time until it has finished.
// The page works without this (a plain reload shows the same); this only saves the reloads.
(function () {
  var out = document.getElementById("job-output");
  var state = document.getElementById("job-state");
  if (!out || !out.dataset.poll) return;
  function tick() {
    fetch(out.dataset.poll, { credentials: "same-origin" }).then(function (r) {
      if (!r.ok) return null;
      var s = r.headers.get("X-Job-State");
      return r.text().then(function (t) { out.textContent = t; if (state && s) state.textContent = s; return s; });
    }).then(function (s) { if (s === "running") setTimeout(tick, 1000); });
  }
  setTimeout(tick, 1000);
})();
