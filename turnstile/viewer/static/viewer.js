// Turnstile's trajectory viewer: three views over the trainer's JSON routes, no dependencies.
// #/ sessions (filters, counts, sort) · #/group/<id> a group's samples · #/session/<id> a
// session's call tree and its trajectories token by token (rendered lazily, in chunks).
"use strict";

const CHUNK = 1000; // tokens rendered per chunk as it scrolls into view
const KEY = "turnstile.token";
let token = sessionStorage.getItem(KEY);
let waiting = null; // the pending token prompt

function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "style") el.style.cssText = v; // CSSOM: allowed by the page's CSP
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : String(kid));
  }
  return el;
}

const enc = encodeURIComponent;
const fmt = (x, d = 3) => (x === null || x === undefined ? "—" : Number(x).toFixed(d));
const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "—");

// --- the trainer's token: asked for when a route answers 401, kept in this tab only ---
function askToken(message) {
  if (waiting) return waiting;
  const form = document.getElementById("login");
  document.getElementById("login-why").textContent = message;
  form.hidden = false;
  document.getElementById("token").focus();
  waiting = new Promise((resolve) => {
    form.onsubmit = (ev) => {
      ev.preventDefault();
      token = document.getElementById("token").value.trim();
      sessionStorage.setItem(KEY, token);
      form.hidden = true;
      waiting = null;
      resolve();
    };
  });
  return waiting;
}

async function api(path) {
  for (;;) {
    const r = await fetch(path, { headers: token ? { Authorization: "Bearer " + token } : {} });
    if (r.status === 401 || r.status === 403) {
      const body = await r.json().catch(() => null);
      await askToken((body && body.error && body.error.message) || "The trainer's token, please.");
      continue;
    }
    if (!r.ok) {
      const body = await r.json().catch(() => null);
      throw new Error((body && body.error && body.error.message) || `${r.status} on ${path}`);
    }
    document.getElementById("forget").hidden = !token;
    return r;
  }
}
const getJSON = async (path) => (await api(path)).json();

async function download(path, name) {
  const blob = await (await api(path)).blob();
  const a = h("a", { href: URL.createObjectURL(blob), download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

// --- routing ---
function parseHash() {
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  return { parts: (path || "/").split("/").filter(Boolean).map(decodeURIComponent),
           params: new URLSearchParams(query || "") };
}

function crumbs(...items) {
  const nav = document.getElementById("crumbs");
  nav.replaceChildren(...items.filter(Boolean).map((it) => (it.href ? h("a", { href: it.href }, it.text)
                                                    : h("span", {}, it.text))));
}

async function route() {
  const main = document.getElementById("main");
  const { parts, params } = parseHash();
  try {
    if (parts[0] === "session" && parts[1]) await sessionView(main, parts[1], params);
    else if (parts[0] === "group" && parts[1]) await groupView(main, parts[1]);
    else await listView(main, params);
  } catch (err) {
    main.replaceChildren(h("p", { class: "error" }, String(err.message || err)));
  }
}

// --- sessions ---
const FILTERS = ["group", "status", "model", "min_reward", "max_reward", "new_segments",
                 "since", "until", "sort", "order"];

function select(name, value, options) {
  return h("select", { name, id: "f-" + name },
    options.map(([v, label]) => h("option", { value: v, selected: v === value }, label)));
}

async function listView(main, params) {
  crumbs({ text: "sessions" });
  const q = new URLSearchParams();
  for (const k of FILTERS) if (params.get(k)) q.set(k, params.get(k));
  const page = await getJSON("/v1/viewer/sessions?" + q.toString());
  const v = (k) => params.get(k) || "";
  const toEpoch = (s) => (s ? String(Date.parse(s) / 1000) : "");
  const fromEpoch = (s) => {
    if (!s) return "";
    const d = new Date(Number(s) * 1000);
    return new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 16);
  };
  const form = h("form", { id: "filters", class: "filters" },
    h("label", {}, "group ", select("group", v("group"),
      [["", "any"], ...page.groups.map((g) => [g, g])])),
    h("label", {}, "status ", select("status", v("status"),
      [["", "any"], ["open", "open"], ["closed", "closed"]])),
    h("label", {}, "model ", select("model", v("model"),
      [["", "any"], ...page.models.map((m) => [m, m])])),
    h("label", {}, "reward ≥ ", h("input", { name: "min_reward", id: "f-min_reward",
      type: "number", step: "any", value: v("min_reward"), size: 6 })),
    h("label", {}, "≤ ", h("input", { name: "max_reward", id: "f-max_reward", type: "number",
      step: "any", value: v("max_reward"), size: 6 })),
    h("label", {}, "new segments ", select("new_segments", v("new_segments"),
      [["", "any"], ["true", "yes"], ["false", "no"]])),
    h("label", {}, "from ", h("input", { name: "since", id: "f-since", type: "datetime-local",
      value: fromEpoch(v("since")) })),
    h("label", {}, "to ", h("input", { name: "until", id: "f-until", type: "datetime-local",
      value: fromEpoch(v("until")) })),
    h("label", {}, "sort ", select("sort", v("sort") || "created",
      ["created", "reward", "calls", "errors", "segments", "sampled", "length"]
        .map((s) => [s, s]))),
    select("order", v("order") || "desc", [["desc", "↓"], ["asc", "↑"]]),
    h("a", { href: "#/", class: "reset" }, "clear"));
  form.addEventListener("change", () => {
    const next = new URLSearchParams();
    for (const el of form.elements) {
      if (!el.name || !el.value) continue;
      next.set(el.name, el.type === "datetime-local" ? toEpoch(el.value) : el.value);
    }
    location.hash = "#/?" + next.toString();
  });
  form.addEventListener("submit", (ev) => ev.preventDefault());
  const c = page.counts;
  const counts = h("p", { id: "counts", class: "counts" },
    h("b", {}, `${page.matched} of ${page.total} sessions`), ` · open ${c.open} · closed ${c.closed}`,
    ` · with new segments ${c.with_new_segments} · with errors ${c.with_errors}`,
    ` · rewarded ${c.rewarded}, mean ${fmt(page.mean_reward)}`,
    page.matched > page.data.length ? ` · first ${page.data.length} shown` : "");
  const head = ["session", "group", "sample", "status", "reward", "calls", "errors",
                "new segments", "sampled", "length", "drift", "model", "created"];
  const rows = page.data.map((s) => h("tr", { class: "session-row", "data-id": s.id },
    h("td", {}, h("a", { href: "#/session/" + enc(s.id) }, s.id)),
    h("td", {}, s.group_id ? h("a", { href: "#/group/" + enc(s.group_id) }, s.group_id) : "—"),
    h("td", { class: "num" }, s.sample_index ?? "—"),
    h("td", {}, h("span", { class: "badge " + s.status }, s.status)),
    h("td", { class: "num" }, fmt(s.reward)),
    h("td", { class: "num" }, s.calls),
    h("td", { class: "num" + (s.errors + s.aborted ? " bad" : "") }, s.errors + s.aborted),
    h("td", { class: "num" }, s.segments),
    h("td", { class: "num" }, s.sampled),
    h("td", { class: "num" }, s.length),
    drift(s.canary),
    h("td", {}, s.models.join(", ") || "—"),
    h("td", {}, when(s.created))));
  main.replaceChildren(h("h1", {}, "Sessions"), form, counts,
    h("table", { id: "sessions", class: "grid" },
      h("thead", {}, h("tr", {}, head.map((t) => h("th", {}, t)))), h("tbody", {}, rows)));
}

// The drift canary's cell (serve --canary-fraction): calls whose prompt a text pipeline would
// have encoded to other token IDs, of those checked, and where the first of them lay.
function drift(c) {
  if (!c) return h("td", { class: "num", title: "canary off" }, "—");
  const where = Object.entries(c.where).map(([k, n]) => `${k} ${n}`).join(", ");
  const first = c.first_drift;
  const title = first ? `first: call ${first.call_id}, token ${first.position} (${first.where}): ` +
    `recorded ${JSON.stringify(first.recorded)}, text pipeline ${JSON.stringify(first.text_pipeline)}`
    : `${c.checked} checked, all clean`;
  return h("td", { class: "num" + (c.drifted ? " bad" : ""), title },
    c.checked ? `${c.drifted}/${c.checked}` + (where ? ` · ${where}` : "") : "—");
}

// --- a group ---
function bar(value, max, cls) {
  const w = max > 0 && value !== null ? Math.max(0, (100 * value) / max) : 0;
  return h("div", { class: "bar " + cls, title: String(value) },
    h("span", { style: `width:${w.toFixed(1)}%` }), h("em", {}, value === null ? "—" : value));
}

async function groupView(main, gid) {
  crumbs({ text: "sessions", href: "#/" }, { text: "group " + gid });
  const page = await getJSON(`/v1/viewer/sessions?group=${enc(gid)}&limit=5000`);
  const samples = page.data.slice().sort((a, b) => (a.sample_index ?? 1e9) - (b.sample_index ?? 1e9));
  const rewards = samples.map((s) => s.reward).filter((r) => r !== null);
  const lo = Math.min(0, ...rewards), hi = Math.max(0, ...rewards);
  const maxSampled = Math.max(1, ...samples.map((s) => s.sampled));
  const maxLen = Math.max(1, ...samples.map((s) => s.length));
  const best = rewards.length ? Math.max(...rewards) : null;
  const mean = rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : null;
  const rows = samples.map((s) => h("tr", { class: "sample-row" + (s.reward === best ? " best" : ""),
                                           "data-id": s.id },
    h("td", { class: "num" }, s.sample_index ?? "—"),
    h("td", {}, h("a", { href: "#/session/" + enc(s.id) }, s.id)),
    h("td", {}, h("span", { class: "badge " + s.status }, s.status)),
    h("td", { class: "wide" }, bar(s.reward === null ? null : +(s.reward - lo).toFixed(6),
                                   hi - lo, "reward"), h("small", {}, "reward " + fmt(s.reward))),
    h("td", { class: "wide" }, bar(s.sampled, maxSampled, "sampled")),
    h("td", { class: "wide" }, bar(s.length, maxLen, "length")),
    h("td", { class: "num" }, s.calls), h("td", { class: "num" }, s.segments),
    h("td", { class: "num" + (s.errors + s.aborted ? " bad" : "") }, s.errors + s.aborted)));
  main.replaceChildren(h("h1", {}, "Group " + gid),
    h("p", { class: "counts", id: "group-summary" }, `${samples.length} samples · rewarded ${rewards.length}`,
      ` · mean reward ${fmt(mean)} · best ${fmt(best)} · spread ${fmt(rewards.length ? hi - lo : null)}`),
    h("table", { id: "group", class: "grid" }, h("thead", {}, h("tr", {},
      ["sample", "session", "status", "reward", "sampled tokens", "longest sample", "calls",
       "new segments", "errors"].map((t) => h("th", {}, t)))), h("tbody", {}, rows)));
}

// --- a session ---
function callNode(c, kids, siblings) {
  const cls = ["call", "status-" + c.status];
  const u = c.usage || {};
  const t = c.timings || {};
  const line = h("div", { class: "call-line" },
    h("b", {}, "#" + c.seq), " ", h("code", {}, c.id), " ",
    h("span", { class: "badge " + c.status }, c.status),
    c.segment_reason ? h("span", { class: "segment", title: c.segment_detail || "" },
                         "segment: " + c.segment_reason) : null,
    siblings > 1 ? h("span", { class: "badge sibling" }, `branch of ${siblings}`) : null,
    c.seam ? h("span", { class: "badge seam" }, "seam: " + c.seam) : null,
    ` +${c.prompt_delta_ids.length} prompt / ${c.completion_ids.length} sampled`,
    c.reused_prefix_len ? ` (reused ${c.reused_prefix_len})` : "",
    ` · ${c.finish_reason || "no finish"} · v ${c.weight_version ?? "—"}`,
    t.latency_s !== undefined ? ` · ${(t.latency_s * 1000).toFixed(0)} ms` : "");
  const detail = h("details", {}, h("summary", {}, "sampling, timings, usage"),
    h("pre", {}, JSON.stringify({ sampling: c.sampling, timings: c.timings, usage: u,
      weight_version: c.weight_version, policy_version: c.policy_version, engine: c.engine,
      model: c.model, logprob_kind: c.logprob_kind, warnings: c.warnings }, null, 1)));
  return h("li", { class: cls.join(" "), "data-call": c.id }, line,
    c.segment_detail ? h("div", { class: "segment-detail" }, c.segment_detail) : null,
    c.error ? h("div", { class: "call-error" }, "error: " + c.error) : null,
    c.message && c.message.content ? h("div", { class: "reply" }, String(c.message.content).slice(0, 300)) : null,
    detail, kids.length ? h("ul", {}, kids) : null);
}

function callTree(calls) {
  const children = new Map();
  for (const c of calls) {
    const p = c.parent_id && calls.some((x) => x.id === c.parent_id) ? c.parent_id : null;
    if (!children.has(p)) children.set(p, []);
    children.get(p).push(c);
  }
  // A chain of single children (an agent loop) stays at one level; only branches (retries,
  // regenerations, new segments) indent.
  const build = (parent) => {
    const kids = children.get(parent) || [];
    const out = [];
    for (const c of kids) {
      const next = children.get(c.id) || [];
      out.push(callNode(c, next.length > 1 ? build(c.id) : [], parent === null ? 1 : kids.length));
      if (next.length === 1) out.push(...build(c.id));
    }
    return out;
  };
  return h("ul", { class: "tree", id: "calls" }, build(null));
}

function sideBySide(t) {
  const d = t.divergence;
  if (!d) return null;
  const show = (side, cls) => h("div", { class: cls }, h("h5", {}, cls),
    h("pre", {}, side.text ?? "(no tokenizer: IDs only)"), h("code", {}, JSON.stringify(side.ids)));
  return h("div", { class: "diverged", id: "divergence" },
    h("h4", {}, `${t.segment_reason}: prompt token ${d.index} is the first that differs from `
      + `call ${d.call_id}` + (d.same_text ? " (same text, different tokens)" : "")
      + ` · from token ${d.window_start}:`),
    h("div", { class: "sides" }, show(d.recorded, "recorded"), show(d.sent, "sent")));
}

const imageURLs = new Map(); // sha256 -> Promise of its data: URL (one read per image)
function imageURL(sid, sha) {
  const key = sid + "/" + sha;
  if (!imageURLs.has(key)) {
    imageURLs.set(key, api(`/v1/sessions/${enc(sid)}/images/${enc(sha)}`)
      .then((r) => r.blob())
      .then((b) => new Promise((resolve, reject) => {
        const fr = new FileReader();
        fr.onload = () => resolve(fr.result);
        fr.onerror = () => reject(fr.error);
        fr.readAsDataURL(b);
      })));
  }
  return imageURLs.get(key);
}

function tokenView(t, calls, sid) {
  const n = t.token_ids.length;
  const marks = new Map(); // index -> elements placed before that token
  const mark = (i, el) => { if (!marks.has(i)) marks.set(i, []); marks.get(i).push(el); };
  t.turns.forEach((turn, k) => {
    mark(turn.prompt_start, h("span", { class: "turn-mark" }, `turn ${k + 1} · call #${turn.seq}`));
    if (turn.seam) mark(turn.prompt_start, h("span", { class: "seam-mark" }, "seam: " + turn.seam));
  });
  // each image at its block: fetched with the trainer's token from the session's image route
  // (only that session's images), shown as a data: URL (the page's CSP allows no other source)
  const inImage = new Map(); // token index -> the image block holding it
  for (const im of t.images || []) {
    const img = h("img", { class: "image-mark", alt: `image ${im.sha256.slice(0, 12)}`,
      "data-sha256": im.sha256, "data-offset": im.offset, "data-length": im.length,
      title: `image ${im.sha256} (${im.mime}): tokens ${im.offset}..${im.offset + im.length - 1}` });
    imageURL(sid, im.sha256).then((url) => { img.src = url; },
      (err) => { img.alt = "image not read: " + err.message; img.classList.add("bad"); });
    mark(im.offset, img);
    for (let i = im.offset; i < im.offset + im.length; i++) inImage.set(i, im);
  }
  const drift = t.divergence ? t.divergence.index : -1;
  if (drift >= 0 && drift < n) {
    mark(drift, h("span", { class: "drift-mark" }, t.segment_reason === "drift" ? "drift" : "differs"));
  }
  const callAt = (i) => t.turns.find((x) => i >= x.prompt_start && i < x.completion_end);
  const box = h("div", { class: "tokens", id: "tokens" });
  const text = (i) => {
    if (!t.pieces) return `⟨${t.token_ids[i]}⟩`;
    const p = t.pieces[i];
    return p === "" ? "∅" : p.replace(/\n/g, "↵\n");
  };
  const render = (chunk) => {
    const start = +chunk.dataset.start, end = Math.min(n, start + CHUNK);
    const frag = document.createDocumentFragment();
    for (let i = start; i < end; i++) {
      for (const m of marks.get(i) || []) frag.append(m);
      const s = t.loss_mask[i] === 1;
      const el = document.createElement("span");
      el.className = "tok " + (s ? "s" : "p") + (i === drift ? " drift" : "") +
        (inImage.has(i) ? " img" : "");
      el.dataset.i = i;
      if (s) {
        const lp = t.logprobs[i];
        if (lp === null) el.classList.add("unknown");
        else el.style.setProperty("--u", (1 - Math.exp(lp)).toFixed(3));
      }
      el.textContent = text(i);
      frag.append(el);
    }
    chunk.replaceChildren(frag);
    chunk.classList.add("rendered");
    chunk.style.minHeight = "";
  };
  const seen = new IntersectionObserver((entries) => {
    for (const e of entries) if (e.isIntersecting) { seen.unobserve(e.target); render(e.target); }
  }, { rootMargin: "800px 0px" });
  const perLine = Math.max(40, Math.floor((document.body.clientWidth - 80) / 8));
  for (let start = 0; start < n; start += CHUNK) {
    let chars = 0, lines = 0;
    for (let i = start; i < Math.min(n, start + CHUNK); i++) {
      const p = t.pieces ? t.pieces[i] : "⟨000000⟩";
      chars += p.length;
      lines += (p.match(/\n/g) || []).length;
    }
    const chunk = h("div", { class: "chunk", "data-start": start,
                             style: `min-height:${(1.6 * (lines + chars / perLine)).toFixed(1)}em` });
    box.append(chunk);
    seen.observe(chunk);
  }
  const tip = document.getElementById("tip");
  box.addEventListener("mouseover", (ev) => {
    const el = ev.target.closest(".tok");
    if (!el) return;
    const i = +el.dataset.i, s = t.loss_mask[i] === 1, lp = t.logprobs[i];
    const turn = callAt(i);
    tip.replaceChildren(
      h("div", {}, h("b", {}, s ? "sampled" : "prompt"), ` token ${i} of ${n}`),
      h("div", {}, "id ", h("span", { class: "tip-id" }, t.token_ids[i])),
      h("div", {}, "text ", h("code", { class: "tip-text" },
        t.pieces ? JSON.stringify(t.pieces[i]) : "(no tokenizer)")),
      h("div", {}, "logprob ", h("span", { class: "tip-logprob" },
        s ? (lp === null ? "not reported" : String(lp)) : "—"),
        s && lp !== null ? ` (p = ${Math.exp(lp).toFixed(4)})` : ""),
      h("div", {}, "version ", h("span", { class: "tip-version" }, t.versions[i] ?? "—")),
      turn ? h("div", {}, "call ", h("code", {}, turn.call_id)) : null);
    const r = el.getBoundingClientRect();
    tip.hidden = false;
    tip.style.left = `${Math.min(r.left + scrollX, scrollX + innerWidth - 320)}px`;
    tip.style.top = `${r.bottom + scrollY + 4}px`;
  });
  box.addEventListener("mouseleave", () => { tip.hidden = true; });
  return box;
}

async function sessionView(main, sid, params) {
  const mode = params.get("mode") === "per_call" ? "per_call" : "merged";
  const [s, calls, trajs] = await Promise.all([
    getJSON(`/v1/sessions/${enc(sid)}`),
    getJSON(`/v1/sessions/${enc(sid)}/calls`),
    getJSON(`/v1/viewer/sessions/${enc(sid)}/trajectories?mode=${mode}`)]);
  crumbs({ text: "sessions", href: "#/" },
    s.group_id ? { text: "group " + s.group_id, href: "#/group/" + enc(s.group_id) } : null,
    { text: sid });
  const pick = Math.min(+(params.get("t") || 0), Math.max(0, trajs.data.length - 1));
  const link = (m, k) => `#/session/${enc(sid)}?mode=${m}&t=${k}`;
  const t = trajs.data[pick];
  const sampled = t ? t.loss_mask.reduce((a, b) => a + b, 0) : 0;
  main.replaceChildren(
    h("h1", {}, "Session ", h("code", {}, sid)),
    h("p", { class: "counts" }, h("span", { class: "badge " + s.status }, s.status),
      ` · group ${s.group_id ?? "—"} · sample ${s.sample_index ?? "—"} · task ${s.task_id ?? "—"}`,
      ` · reward ${fmt(s.reward)} ${Object.keys(s.rewards).length ? JSON.stringify(s.rewards) : ""}`,
      s.termination_reason ? ` · ended: ${s.termination_reason}` : "",
      ` · ${calls.data.length} calls · created ${when(s.created)}`),
    h("details", { id: "call-tree", open: calls.data.length <= 200 },
      h("summary", {}, h("h2", {}, `Calls (${calls.data.length})`)), callTree(calls.data)),
    h("h2", {}, "Trajectories"),
    h("p", { class: "pickers" }, "mode ",
      ["merged", "per_call"].map((m) => h("a", { href: link(m, 0), class: m === mode ? "on" : "" }, m)),
      " · sample ",
      trajs.data.map((x, k) => h("a", { href: link(mode, k), class: k === pick ? "on" : "",
        title: x.call_ids.join(" → ") }, `${k + 1} (${x.token_ids.length})`)),
      " · download ",
      h("button", { type: "button", id: "dl-json", onclick: () =>
        download(`/v1/sessions/${enc(sid)}/trajectories?mode=${mode}`, `${sid}-${mode}.json`) }, "JSON"),
      h("button", { type: "button", id: "dl-parquet", onclick: () =>
        download(`/v1/viewer/sessions/${enc(sid)}/trajectories.parquet?mode=${mode}`,
                 `${sid}-${mode}.parquet`) }, "Parquet")),
    t ? h("div", { id: "trajectory", "data-id": t.id },
      h("p", { class: "segment-break" }, "segment ", h("b", { class: "reason" }, t.segment_reason || "—"),
        t.segment_detail ? h("span", { class: "segment-detail" }, " " + t.segment_detail) : null),
      h("p", { class: "legend" }, `${t.token_ids.length} tokens, ${sampled} sampled over `,
        `${t.num_turns} turns · `, h("span", { class: "tok p" }, "prompt"), " ",
        h("span", { class: "tok s", style: "--u:0.05" }, "sampled, sure"), " ",
        h("span", { class: "tok s", style: "--u:0.9" }, "sampled, unsure"),
        trajs.tokenizer ? ` · text by ${trajs.tokenizer}` : " · no tokenizer: IDs shown"),
      sideBySide(t), tokenView(t, calls.data, sid))
      : h("p", { class: "muted" }, "No completed call yet: nothing to stitch."));
}

document.getElementById("forget").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  token = null;
  route();
});
window.addEventListener("hashchange", route);
route();
