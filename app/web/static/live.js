// Refresh the #live part of the page every few seconds without a full reload (no build step, no library).
// The server tags each page (ETag) from what it shows (app/web/routes.py): sent back, an unchanged page costs a
// bodiless 304, which the campaign page answers without rendering or checking its shapes.
(function () {
  const live = document.getElementById("live");
  if (!live) return;
  const every = Number(live.dataset.every || 5000);
  let tag = null;
  setInterval(async function () {
    const url = new URL(window.location.href);
    url.searchParams.set("partial", "1");
    try {
      const headers = {"Accept": "text/html"};
      if (tag) headers["If-None-Match"] = tag;
      const r = await fetch(url, {headers: headers, cache: "no-store"});
      if (r.status === 304) return;
      if (r.ok) {
        tag = r.headers.get("ETag");
        live.innerHTML = await r.text();
      }
    } catch (e) { /* keep the last view */ }
  }, every);
})();
