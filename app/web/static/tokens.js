// The /tokens page: list, create and revoke tokens through /v1/tokens with the admin token pasted in.
(function () {
  const $ = (id) => document.getElementById(id);
  const KEY = "aiter-tuner-admin-token";
  const show = (msg) => { $("token-error").textContent = msg || ""; };

  async function call(method, path, body) {
    const headers = {"Authorization": "Bearer " + (sessionStorage.getItem(KEY) || "")};
    if (body) headers["Content-Type"] = "application/json";
    const r = await fetch(path, {method, headers, body: body ? JSON.stringify(body) : undefined});
    const data = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(data.detail || (r.status + " " + r.statusText));
    return data;
  }

  function cell(tr, text) { const td = document.createElement("td"); td.textContent = text; tr.appendChild(td); return td; }

  async function refresh() {
    if (!sessionStorage.getItem(KEY)) return;
    try {
      const rows = await call("GET", "/v1/tokens");
      show("");
      $("auth-state").textContent = "ok";
      const body = $("tokens").querySelector("tbody");
      body.innerHTML = "";
      for (const t of rows) {
        const tr = document.createElement("tr");
        tr.className = "token"; tr.dataset.id = t.id; tr.dataset.name = t.name;
        cell(tr, t.id); cell(tr, t.name); cell(tr, t.role);
        cell(tr, t.digests ? t.digests.map((d) => d.slice(0, 19) + "…").join(" ") : "all");
        cell(tr, t.created_at.slice(0, 19)); cell(tr, t.revoked ? "revoked" : "live");
        const td = cell(tr, "");
        if (!t.revoked) {
          const b = document.createElement("button");
          b.textContent = "Revoke"; b.className = "revoke";
          b.onclick = async () => {
            try { await call("DELETE", "/v1/tokens/" + t.id); await refresh(); } catch (e) { show(e.message); }
          };
          td.appendChild(b);
        }
        body.appendChild(tr);
      }
      $("tokens").hidden = false;
      $("tokens-empty").hidden = true;
    } catch (e) {
      $("auth-state").textContent = "";
      show(e.message);
    }
  }

  $("auth-form").onsubmit = (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, $("admin-token").value.trim());
    $("admin-token").value = "";
    refresh();
  };
  $("create-form").onsubmit = async (ev) => {
    ev.preventDefault();
    const digests = $("new-digests").value.split(/[\s,]+/).filter(Boolean);
    try {
      const t = await call("POST", "/v1/tokens", {name: $("new-name").value, role: $("new-role").value,
                                                 digests: digests.length ? digests : null});
      $("new-secret").textContent = t.token;
      $("new-secret-box").hidden = false;
      show("");
      await refresh();
    } catch (e) { show(e.message); }
  };
  refresh();
})();
