// corral web page: list runs, start one, watch its events live, cancel.
//
// Reloading mid-run continues where the page was: the events shown so far and the offset
// of the last one are kept in sessionStorage (per run), the page re-renders them, and the
// stream resumes with ?after=<that offset> (EventSource itself resends Last-Event-ID on
// reconnects). Agent output is hostile: everything is rendered with textContent.

const $ = (sel) => document.querySelector(sel);
const TOKEN_KEY = "corral:token";
const runKey = (id) => `corral:run:${id}`;

// What tests (and curious people) can read: offsets as they arrived in this page load.
const stats = { received: [], dupes: 0, gaps: 0, resumedFrom: null };
window.corral = stats;

let current = null; // { id, last, events: [[offset, event]], source, view }
let saveTimer = null;

// ---------------------------------------------------------------- HTTP

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

// Where the app is mounted ("" at the root, "/corral" when a web app mounts it there): the
// API lies beside the page.
const BASE = location.pathname.replace(/\/[^/]*$/, "");

async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(BASE + path, { ...options, headers });
  if (res.status === 401) {
    askForToken();
    throw new Error("the server wants an API token");
  }
  const body = res.status === 204 ? null : await res.json().catch(() => null);
  if (!res.ok) {
    throw new Error(body && body.error ? body.error.message : `HTTP ${res.status}`);
  }
  return body;
}

function askForToken() {
  $("#token-form").hidden = false;
  $("#conn").textContent = "token required";
}

$("#token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("#token").value.trim());
  $("#token-form").hidden = true;
  refreshRuns();
  if (current) watch(current.id);
});

// ---------------------------------------------------------------- runs list

function fmtTime(t) { return t ? new Date(t * 1000).toLocaleTimeString() : ""; }

async function refreshRuns() {
  let data;
  try {
    data = await api("/v1/runs?limit=50");
  } catch (err) {
    $("#conn").textContent = String(err.message || err);
    return;
  }
  $("#conn").textContent = "";
  const body = $("#runs tbody");
  body.replaceChildren();
  for (const run of data.runs) {
    const tr = document.createElement("tr");
    tr.dataset.runId = run.run_id;
    if (current && current.id === run.run_id) tr.classList.add("selected");
    const id = document.createElement("td");
    id.className = "id";
    id.textContent = run.run_id;
    const status = document.createElement("td");
    status.textContent = run.status + (run.cancel_requested && run.status === "running" ? " (cancelling)" : "");
    const started = document.createElement("td");
    started.textContent = fmtTime(run.started_at);
    tr.append(id, status, started);
    tr.addEventListener("click", () => select(run.run_id));
    body.append(tr);
    if (current && current.id === run.run_id) showRecord(run);
  }
}

function showRecord(run) {
  const status = $("#run-status");
  status.textContent = run.status;
  status.className = `status ${run.status}`;
  $("#cancel").disabled = run.status !== "running" || run.cancel_requested;
  const parts = [`thread ${run.thread_id}`];
  if (run.command) parts.push(run.command.map((a) => (/[\s'"]/.test(a) || !a ? JSON.stringify(a) : a)).join(" "));
  if (run.exit_code !== null && run.exit_code !== undefined) parts.push(`exit ${run.exit_code}`);
  $("#run-meta").textContent = parts.join(" · ");
  $("#run-usage").textContent = usageText(run.usage);
}

// Token usage and cost of an agent run (from the model proxy; priced on the server).
function usageText(usage) {
  if (!usage) return "";
  const n = (v) => Number(v || 0).toLocaleString();
  let text = `${n(usage.input_tokens)} tokens in · ${n(usage.output_tokens)} out · `
    + `${n(usage.cache_read_tokens)} cache read · ${n(usage.requests)} model requests`;
  if (usage.cost_usd !== undefined) text += ` · $${Number(usage.cost_usd).toFixed(4)}`;
  if (usage.unpriced && usage.unpriced.length) text += ` (unpriced: ${usage.unpriced.join(", ")})`;
  return text;
}

// ---------------------------------------------------------------- start / cancel

function splitCommand(text) {
  const trimmed = text.trim();
  if (trimmed.startsWith("[")) return JSON.parse(trimmed);
  const out = [];
  const re = /"((?:[^"\\]|\\.)*)"|'([^']*)'|(\S+)/g;
  let m;
  while ((m = re.exec(trimmed)) !== null) {
    out.push(m[1] !== undefined ? m[1].replace(/\\(.)/g, "$1") : m[2] !== undefined ? m[2] : m[3]);
  }
  return out;
}

$("#start-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const err = $("#start-error");
  err.hidden = true;
  try {
    const command = splitCommand($("#command").value);
    const thread = $("#thread").value.trim() || `thread-${crypto.randomUUID().slice(0, 8)}`;
    const created = await api("/v1/runs", {
      method: "POST",
      body: JSON.stringify({
        thread_id: thread, command,
        file_events: $("#file-diffs").checked ? "diff" : $("#file-events").checked,
      }),
    });
    await refreshRuns();
    select(created.run_id);
  } catch (e2) {
    err.textContent = String(e2.message || e2);
    err.hidden = false;
  }
});

$("#cancel").addEventListener("click", async () => {
  if (!current) return;
  $("#cancel").disabled = true;
  try {
    showRecord(await api(`/v1/runs/${encodeURIComponent(current.id)}/cancel`, { method: "POST" }));
  } catch (e) {
    banner(String(e.message || e), "bad");
  }
  refreshRuns();
});

// ---------------------------------------------------------------- watching

function loadSaved(id) {
  try {
    const saved = JSON.parse(sessionStorage.getItem(runKey(id)) || "null");
    if (saved && Number.isInteger(saved.last) && Array.isArray(saved.events)) return saved;
  } catch (_) { /* a damaged entry: start over */ }
  return { last: 0, events: [] };
}

function save() {
  saveTimer = null;
  if (!current) return;
  try {
    sessionStorage.setItem(runKey(current.id), JSON.stringify({ last: current.last, events: current.events }));
  } catch (_) {
    // Too big for sessionStorage: forget it, so a reload replays from the start instead of
    // showing a transcript with a hole.
    sessionStorage.removeItem(runKey(current.id));
  }
}

function scheduleSave() { if (saveTimer === null) saveTimer = setTimeout(save, 200); }
window.addEventListener("pagehide", save);

function select(id) {
  if (location.hash !== `#run=${encodeURIComponent(id)}`) {
    history.replaceState(null, "", `#run=${encodeURIComponent(id)}`);
  }
  watch(id);
}

function resetView() {
  for (const sel of ["#transcript", "#errors", "#events", "#files-list"]) $(sel).replaceChildren();
  $("#files").hidden = true;
  $("#file-diff").hidden = true;
  $("#file-diff").textContent = "";
  $("#event-count").textContent = "0";
  return { messages: new Map(), tools: new Map(), files: new Set(), diffs: new Map() };
}

function watch(id) {
  if (current && current.source) current.source.close();
  if (current && current.id !== id) save();
  const saved = loadSaved(id);
  current = { id, last: saved.last, events: [], source: null, view: resetView() };
  $("#empty").hidden = true;
  $("#run").hidden = false;
  $("#run-title").textContent = id;
  for (const [offset, event] of saved.events) show(offset, event, false);
  stats.resumedFrom = current.last;
  document.querySelectorAll("#runs tbody tr").forEach((tr) =>
    tr.classList.toggle("selected", tr.dataset.runId === id));
  api(`/v1/runs/${encodeURIComponent(id)}`).then(showRecord).catch((e) => banner(String(e.message || e), "bad"));
  connect();
}

function connect() {
  const run = current;
  let url = `/v1/runs/${encodeURIComponent(run.id)}/events?after=${run.last}`;
  if (token()) url += `&token=${encodeURIComponent(token())}`;
  const source = new EventSource(BASE + url);
  run.source = source;
  source.onmessage = (msg) => {
    if (current !== run) return;
    const offset = Number(msg.lastEventId);
    stats.received.push(offset);
    if (offset <= run.last) { stats.dupes += 1; return; }
    if (offset !== run.last + 1) stats.gaps += 1;
    let event;
    try { event = JSON.parse(msg.data); } catch (_) { event = { type: "UNPARSEABLE", data: msg.data }; }
    show(offset, event, true);
    // A run's log ends with its terminal event; the server then closes the stream (its
    // ": end" comment is invisible here), so stop now rather than reconnect to a 204.
    if (event.type === "RUN_FINISHED" || event.type === "RUN_ERROR") {
      source.close();
      $("#conn").textContent = "";
      refreshRuns();
      api(`/v1/runs/${encodeURIComponent(run.id)}`).then(showRecord).catch(() => {});
    }
  };
  source.onopen = () => { $("#conn").textContent = "live"; };
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) {
      $("#conn").textContent = "";
      // 204 (nothing more) or a refusal; the record says which.
      api(`/v1/runs/${encodeURIComponent(run.id)}`).then(showRecord).catch(() => {});
    } else {
      $("#conn").textContent = "reconnecting…";
    }
  };
}

// ---------------------------------------------------------------- rendering

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function banner(text, kind) { $("#errors").append(el("div", `banner ${kind}`, text)); }

function message(view, id, role) {
  let node = view.messages.get(id);
  if (!node) {
    node = el("div", "msg");
    node.append(el("span", "role", role || "assistant"), el("span", "text"));
    view.messages.set(id, node);
    $("#transcript").append(node);
  }
  return node.querySelector(".text");
}

function tool(view, id, name) {
  let card = view.tools.get(id);
  if (!card) {
    card = el("div", "tool");
    card.append(el("strong", "name", name || "tool"), el("pre", "args"), el("pre", "result"));
    view.tools.set(id, card);
    $("#transcript").append(card);
  }
  return card;
}

const FILE_TOOLS = /edit|write|patch|create|str_replace|multiedit|apply/i;

function fileChanged(view, path) {
  if (typeof path !== "string" || !path || view.files.has(path)) return;
  view.files.add(path);
  $("#files").hidden = false;
  const item = el("li", "", path);
  item.dataset.path = path;
  // A file's latest patch (sandbox.file.diff), shown as text on click.
  item.addEventListener("click", () => {
    const diff = view.diffs.get(path);
    $("#file-diff").textContent = diff === undefined ? `${path}: no patch (start the run with diffs)` : diff || `${path}: no changes against the start`;
    $("#file-diff").hidden = false;
  });
  $("#files-list").append(item);
}

function filesFromArgs(view, card) {
  if (!FILE_TOOLS.test(card.querySelector(".name").textContent)) return;
  try {
    const args = JSON.parse(card.querySelector(".args").textContent);
    for (const key of ["file_path", "path", "filename", "file"]) fileChanged(view, args[key]);
  } catch (_) { /* arguments are not JSON */ }
}

function show(offset, event, live) {
  const run = current;
  const view = run.view;
  run.events.push([offset, event]);
  run.last = offset;
  if (live) scheduleSave();
  const item = el("li", "", `${offset} ${JSON.stringify(event)}`);
  item.dataset.offset = String(offset);
  item.dataset.type = String(event.type);
  $("#events").append(item);
  $("#event-count").textContent = String(run.events.length);
  switch (event.type) {
    case "TEXT_MESSAGE_START":
      message(view, event.messageId, event.role);
      break;
    case "TEXT_MESSAGE_CONTENT":
    case "TEXT_MESSAGE_CHUNK":
      message(view, event.messageId).textContent += event.delta || "";
      break;
    case "REASONING_MESSAGE_CONTENT":
    case "THINKING_TEXT_MESSAGE_CONTENT":
      message(view, `reasoning-${event.messageId || ""}`, "reasoning").textContent += event.delta || "";
      break;
    case "TOOL_CALL_START":
      tool(view, event.toolCallId, event.toolCallName);
      break;
    case "TOOL_CALL_ARGS":
      tool(view, event.toolCallId).querySelector(".args").textContent += event.delta || "";
      break;
    case "TOOL_CALL_END":
      filesFromArgs(view, tool(view, event.toolCallId));
      break;
    case "TOOL_CALL_RESULT":
      tool(view, event.toolCallId).querySelector(".result").textContent = String(event.content ?? "");
      break;
    case "RUN_ERROR":
      banner(`run error: ${event.message || ""}${event.code ? ` (${event.code})` : ""}`, "bad");
      break;
    case "RUN_FINISHED":
      banner("run finished", "good");
      break;
    case "CUSTOM":
      if (event.name === "sandbox.file.diff" && event.value && typeof event.value.path === "string") {
        view.diffs.set(event.value.path, String(event.value.diff ?? ""));
        fileChanged(view, event.value.path);
      } else if (/file/i.test(event.name || "")) {
        const value = event.value || {};
        fileChanged(view, value.path);
        for (const change of value.changes || []) fileChanged(view, change && change.path);
      } else if (event.name !== "corral.stdout.bytes") {
        $("#transcript").append(el("div", "custom", `${event.name}`));
      }
      break;
    default:
      break;
  }
}

// ---------------------------------------------------------------- start-up

function runFromHash() {
  const m = /^#run=(.+)$/.exec(location.hash);
  return m ? decodeURIComponent(m[1]) : null;
}

window.addEventListener("hashchange", () => { const id = runFromHash(); if (id) watch(id); });
refreshRuns();
setInterval(refreshRuns, 3000);
const initial = runFromHash();
if (initial) watch(initial);
