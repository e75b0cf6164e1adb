// Refresh the #live part of the page every few seconds without a full reload (no build step, no library).
(function () {
  const live = document.getElementById("live");
  if (!live) return;
  const every = Number(live.dataset.every || 5000);
  setInterval(async function () {
    const url = new URL(window.location.href);
    url.searchParams.set("partial", "1");
    try {
      const r = await fetch(url, {headers: {"Accept": "text/html"}});
      if (r.ok) live.innerHTML = await r.text();
    } catch (e) { /* keep the last view */ }
  }, every);
})();
