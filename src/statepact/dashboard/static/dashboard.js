// statepact dashboard: re-fetch each [data-live] fragment every data-every milliseconds and
// swap it in. The server renders (and escapes) the fragment; this script never builds HTML
// from data. Pages work without it: it only saves pressing reload.
"use strict";
(function () {
  function refresh(box) {
    if (document.hidden) { return; }
    fetch(box.getAttribute("data-live"), { credentials: "same-origin", cache: "no-store" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html !== null && html !== box.dataset.last) {
          box.dataset.last = html;
          const parsed = new DOMParser().parseFromString(html, "text/html");
          box.replaceChildren(...parsed.body.childNodes);
        }
      })
      .catch(function () { /* the next tick tries again */ });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(function (box) {
      const every = Math.max(500, parseInt(box.getAttribute("data-every"), 10) || 2000);
      setInterval(function () { refresh(box); }, every);
    });
  });
})();
