// corral web page: start an agent or command run, watch a thread as a conversation (each
// run's prompt, the assistant's messages, tool calls, reasoning, approvals, file changes,
// usage), detach, cancel.
//
// Reloading mid-run continues where the page was: the events shown so far and the offset
// of the last one are kept in sessionStorage (per run), the page re-renders them, and each
// stream resumes with ?after=<that offset> (EventSource itself resends Last-Event-ID on
// reconnects). Agent output, tool arguments, file names and prompts are hostile: the page
// only ever sets textContent, never HTML.

const $ = (sel) => document.querySelector(sel);
const TOKEN_KEY = "corral:token";
const runKey = (id) => `corral:run:${id}`;
const detachedKey = (id) => `corral:detached:${id}`;
const TERMINAL = new Set(["RUN_FINISHED", "RUN_ERROR"]);
const APPROVAL_REQUEST = "corral.approval_request";
const APPROVAL_RESOLVED = "corral.approval_resolved";
const PROMPT = "corral.prompt";
const DECIDED = { allow: "allowed", deny: "denied", timeout: "timed out" };

// What tests (and curious people) can read, per run: offsets as they arrived in this page
// load, duplicates and gaps seen, the offset a reload resumed after.
const stats = { runs: {} };
window.corral = stats;

let view = null; // { runId, threadId, turns: Map<run id, Turn>, detached }
let saveTimer = null;

// ---------------------------------------------------------------- HTTP

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

// Where the app is mounted ("" at the root, "/corral" when a web app mounts it there): the
// API lies beside the page.
const BASE = location.pathname.replace(/\/[^/]*$/, "");
const enc = encodeURIComponent;

async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  // The server refuses a state-changing request that a page on another site could send
  // without a preflight: a bodiless POST (cancel) carries this header.
  if ((options.method || "GET") !== "GET") headers["X-Corral-Request"] = "1";
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
  loadHarnesses();
  refreshRuns();
  if (view) watch(view.runId);
});

// ---------------------------------------------------------------- small helpers

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = String(text);
  return node;
}

// A time today; with its date (and year, when not this one) on another day.
function fmtTime(t) {
  if (!t) return "";
  const d = new Date(t * 1000);
  const now = new Date();
  const time = d.toLocaleTimeString();
  if (d.toDateString() === now.toDateString()) return time;
  const opts = { month: "short", day: "numeric" };
  if (d.getFullYear() !== now.getFullYear()) opts.year = "numeric";
  return `${d.toLocaleDateString(undefined, opts)} ${time}`;
}
const fullTime = (t) => (t ? new Date(t * 1000).toString() : "");
const errText = (e) => String((e && e.message) || e);

function shellWords(argv) {
  return argv.map((a) => (/[\s'"]/.test(a) || !a ? JSON.stringify(a) : a)).join(" ");
}

// Token usage and cost of an agent run (from the model proxy; priced on the server).
function usageText(usage) {
  if (!usage) return "";
  const n = (v) => Number(v || 0).toLocaleString();
  const usd = (v) => `$${Number(v).toFixed(4)}`;
  let text = `${n(usage.input_tokens)} tokens in · ${n(usage.output_tokens)} out · `
    + `${n(usage.cache_read_tokens)} cache read · ${n(usage.requests)} model requests`;
  const costs = usage.cost_by_model || {};
  const unpriced = usage.unpriced || [];
  // A model without a price is never counted as free: say the cost is unknown instead.
  if (unpriced.length && !Object.keys(costs).length) {
    text += ` · cost unknown (no price for ${unpriced.join(", ")})`;
  } else if (usage.cost_usd !== undefined) {
    text += ` · ${usd(usage.cost_usd)}`;
    if (unpriced.length) text += ` + unpriced: ${unpriced.join(", ")}`;
  }
  const models = Object.keys(usage.models || {}).sort();
  if (models.length > 1 || Object.keys(costs).length) {
    text += " · " + models.map((m) => {
      const used = usage.models[m] || {};
      return `${m}: ${n(used.input_tokens)} in, ${n(used.output_tokens)} out`
        + (m in costs ? `, ${usd(costs[m])}` : "");
    }).join("; ");
  }
  return text;
}

// ---------------------------------------------------------------- runs list

// The list shows the newest `runsShown` runs; "Show older runs" asks for the next page.
const RUNS_PAGE = 50;
const RUNS_MAX = 1000;  // the API's largest page
let runsShown = RUNS_PAGE;

async function refreshRuns() {
  let data;
  try {
    data = await api(`/v1/runs?limit=${runsShown}`);
  } catch (err) {
    $("#conn").textContent = errText(err);
    return;
  }
  if ($("#conn").textContent === "token required") $("#conn").textContent = "";
  const body = $("#runs tbody");
  body.replaceChildren();
  for (const run of data.runs) {
    const tr = document.createElement("tr");
    tr.dataset.runId = run.run_id;
    tr.tabIndex = 0;
    tr.setAttribute("aria-label", `run ${run.run_id}, ${run.status}`);
    if (view && view.runId === run.run_id) tr.classList.add("selected");
    tr.append(el("td", "id", run.run_id),
      el("td", "", run.status + (run.cancel_requested && run.status === "running" ? " (cancelling)" : "")
        + (run.undone_at ? " (undone)" : "")),
      el("td", "when", fmtTime(run.started_at)));
    tr.lastChild.title = fullTime(run.started_at);
    tr.addEventListener("click", () => select(run.run_id));
    tr.addEventListener("keydown", (e) => { if (e.key === "Enter") select(run.run_id); });
    body.append(tr);
    const turn = view && view.turns.get(run.run_id);
    if (turn) showRecord(turn, run);
  }
  const more = $("#more-runs");
  more.hidden = data.runs.length < runsShown || runsShown >= RUNS_MAX;
  more.textContent = `Show older runs (${data.runs.length} shown)`;
  // A run started elsewhere on the thread being watched joins the conversation.
  if (view && data.runs.some((r) => r.thread_id === view.threadId && !view.turns.has(r.run_id))) {
    loadThread(view);
  }
}

// ---------------------------------------------------------------- threads

async function refreshThreads() {
  let data;
  try {
    data = await api("/v1/threads?limit=50");
  } catch {
    return; // refreshRuns says why
  }
  const body = $("#threads tbody");
  body.replaceChildren();
  for (const t of data.threads) {
    const tr = document.createElement("tr");
    tr.dataset.threadId = t.thread_id;
    tr.tabIndex = 0;
    tr.setAttribute("aria-label", `thread ${t.thread_id}, ${t.runs} runs, ${t.last_status}`);
    tr.append(el("td", "id", t.thread_id), el("td", "", String(t.runs)),
      el("td", "", t.last_status), el("td", "", t.title));
    const open = async () => {
      try {
        const thread = await api(`/v1/threads/${enc(t.thread_id)}`);
        const last = thread.runs[thread.runs.length - 1];
        if (last) select(last.run_id);
      } catch (e) {
        $("#conn").textContent = errText(e);
      }
    };
    tr.addEventListener("click", open);
    tr.addEventListener("keydown", (e) => { if (e.key === "Enter") open(); });
    body.append(tr);
  }
}

// Undo: the thread's files and conversation go back to before its last turn (which stays
// in the history, marked undone).
$("#undo").addEventListener("click", async () => {
  if (!view || !view.threadId) return;
  try {
    const thread = await api(`/v1/threads/${enc(view.threadId)}/undo`, { method: "POST" });
    const undone = thread.runs.filter((r) => r.undone_at)
      .sort((a, b) => a.undone_at - b.undone_at).map((r) => r.run_id);
    $("#errors").append(el("div", "banner good",
      `undone: ${undone[undone.length - 1]}; the files and conversation are as before it`));
  } catch (e) {
    $("#errors").append(el("div", "banner bad", errText(e)));
  }
  refreshRuns();
  refreshThreads();
});

// Fork: a new thread from the state after the selected run; the next run goes to it.
$("#fork-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  if (!view || !view.threadId) return;
  const name = $("#fork-as").value.trim();
  try {
    await api(`/v1/threads/${enc(view.threadId)}/fork`,
      { method: "POST", body: JSON.stringify({ as: name, at: view.runId }) });
    $("#thread").value = name;
    $("#errors").append(el("div", "banner good",
      `forked as ${name} from the state after ${view.runId}: the next run goes to it`));
  } catch (err) {
    $("#errors").append(el("div", "banner bad", errText(err)));
  }
  refreshThreads();
});

// ---------------------------------------------------------------- start / cancel / detach

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

function kind() { return $("#kind-command").checked ? "command" : "agent"; }

function showKind() {
  $("#agent-fields").hidden = kind() !== "agent";
  $("#command-fields").hidden = kind() !== "command";
}
for (const radio of document.querySelectorAll('input[name="kind"]')) radio.addEventListener("change", showKind);

async function loadHarnesses() {
  let data;
  try { data = await api("/v1/harnesses"); } catch (_) { return; }
  const agents = data.harnesses.filter((h) => h !== "command");
  // harnesses the server allows but cannot start now: shown, disabled, with the reason
  const missing = (data.unavailable || []).filter((u) => u.name !== "command");
  const select = $("#harness");
  const suggested = data.suggested_harness;
  const chosen = select.value || (agents.includes(suggested) ? suggested : agents[0]);
  select.replaceChildren(
    ...agents.map((h) => { const o = el("option", "", h); o.value = h; return o; }),
    ...missing.map((u) => {
      const o = el("option", "", `${u.name} (${u.code === "harness_not_installed" ? "not installed" : "not ready"})`);
      o.value = u.name; o.disabled = true; o.title = u.reason; return o;
    }),
  );
  if (agents.includes(chosen)) select.value = chosen;
  $("#kind-agent").disabled = agents.length === 0;
  $("#kind-command").disabled = !data.harnesses.includes("command");
  // the page starts on what can start: an agent when one can, else a command
  if (agents.length === 0 || suggested === "command") $("#kind-command").checked = true;
  showKind();
}

$("#start-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const err = $("#start-error");
  err.hidden = true;
  try {
    const thread = $("#thread").value.trim() || `thread-${crypto.randomUUID().slice(0, 8)}`;
    const body = { thread_id: thread, file_events: $("#file-diffs").checked ? "diff" : $("#file-events").checked };
    if (kind() === "command") {
      body.command = splitCommand($("#command").value);
      if (!body.command.length) throw new Error("type a command to run");
    } else {
      body.prompt = $("#prompt").value;
      if (!body.prompt.trim()) throw new Error("type a prompt for the agent");
      body.harness = $("#harness").value;
      if ($("#model").value.trim()) body.model = $("#model").value.trim();
    }
    const created = await api("/v1/runs", { method: "POST", body: JSON.stringify(body) });
    if (kind() === "agent") $("#prompt").value = "";
    refreshRuns();
    select(created.run_id);
  } catch (e2) {
    err.textContent = errText(e2);
    err.hidden = false;
  }
});

$("#cancel").addEventListener("click", async () => {
  if (!view) return;
  const turn = view.turns.get(view.runId);
  $("#cancel").disabled = true;
  try {
    const record = await api(`/v1/runs/${enc(view.runId)}/cancel`, { method: "POST" });
    if (turn) showRecord(turn, record);
  } catch (e) {
    $("#errors").append(el("div", "banner bad", errText(e)));
  }
  refreshRuns();
});

// The next run of the conversation goes to this thread.
$("#more-runs").addEventListener("click", () => {
  runsShown = Math.min(runsShown + RUNS_PAGE, RUNS_MAX);
  refreshRuns();
});

$("#reply").addEventListener("click", () => {
  if (!view || !view.threadId) return;
  $("#thread").value = view.threadId;
  (kind() === "agent" ? $("#prompt") : $("#command")).focus();
});

// Detach stops watching (every stream of the view closes; the server keeps driving the
// run); Watch picks up after the last event shown.
$("#detach").addEventListener("click", () => {
  if (!view) return;
  view.detached = !view.detached;
  // a reload keeps the page detached, as it was
  if (view.detached) sessionStorage.setItem(detachedKey(view.runId), "1");
  else sessionStorage.removeItem(detachedKey(view.runId));
  for (const turn of view.turns.values()) {
    if (view.detached) closeStream(turn); else if (!turn.done) connect(turn);
  }
  showDetached();
});

function showDetached() {
  const button = $("#detach");
  button.textContent = view.detached ? "Watch" : "Detach";
  button.setAttribute("aria-label", view.detached ? "Watch again" : "Detach: stop watching (the run keeps going)");
  $("#conn").textContent = view.detached ? "detached: the run keeps going" : $("#conn").textContent;
}

// ---------------------------------------------------------------- saving

function loadSaved(id) {
  try {
    const saved = JSON.parse(sessionStorage.getItem(runKey(id)) || "null");
    if (saved && Number.isInteger(saved.last) && Array.isArray(saved.events)) return saved;
  } catch (_) { /* a damaged entry: start over */ }
  return { last: 0, events: [] };
}

function save() {
  saveTimer = null;
  if (!view) return;
  for (const turn of view.turns.values()) {
    if (!turn.dirty) continue;
    turn.dirty = false;
    try {
      sessionStorage.setItem(runKey(turn.id), JSON.stringify({ last: turn.last, events: turn.events }));
    } catch (_) {
      // Too big for sessionStorage: forget it, so a reload replays from the start instead
      // of showing a conversation with a hole.
      sessionStorage.removeItem(runKey(turn.id));
    }
  }
}

function scheduleSave() { if (saveTimer === null) saveTimer = setTimeout(save, 200); }
window.addEventListener("pagehide", save);

// ---------------------------------------------------------------- the thread view

function select(id) {
  if (location.hash !== `#run=${enc(id)}`) history.replaceState(null, "", `#run=${enc(id)}`);
  watch(id);
}

function closeStream(turn) {
  if (turn.source) turn.source.close();
  turn.source = null;
}

function watch(id) {
  if (view) {
    save();
    for (const turn of view.turns.values()) closeStream(turn);
  }
  view = { runId: id, threadId: null, turns: new Map(), detached: sessionStorage.getItem(detachedKey(id)) === "1" };
  $("#transcript").replaceChildren();
  $("#errors").replaceChildren();
  $("#events").replaceChildren();
  $("#event-count").textContent = "0";
  $("#run-title").textContent = id;
  $("#run-status").textContent = "";
  $("#run-meta").textContent = "";
  $("#run-usage").textContent = "";
  showDetached();
  $("#empty").hidden = true;
  $("#run").hidden = false;
  document.querySelectorAll("#runs tbody tr").forEach((tr) =>
    tr.classList.toggle("selected", tr.dataset.runId === id));
  const mine = view;
  api(`/v1/runs/${enc(id)}`).then((record) => {
    if (view !== mine) return;
    mine.threadId = record.thread_id;
    addTurn(mine, record);
    return loadThread(mine);
  }).catch((e) => $("#errors").append(el("div", "banner bad", errText(e))));
}

// Every run of the thread, oldest first, each a turn of the conversation.
async function loadThread(v) {
  const data = await api(`/v1/runs?thread_id=${enc(v.threadId)}&limit=100`);
  if (view !== v) return;
  for (const record of data.runs.slice().reverse()) addTurn(v, record);
}

function addTurn(v, record) {
  let turn = v.turns.get(record.run_id);
  if (turn) { showRecord(turn, record); return; }
  const saved = loadSaved(record.run_id);
  const node = el("section", "turn");
  node.dataset.runId = record.run_id;
  node.setAttribute("aria-label", `run ${record.run_id}`);
  if (record.run_id === v.runId) node.classList.add("selected");
  const head = el("div", "turn-head");
  const link = el("a", "id", record.run_id);
  link.href = `#run=${enc(record.run_id)}`;
  head.append(link, el("span", "status"), el("span", "when muted", fmtTime(record.started_at)));
  head.lastChild.title = fullTime(record.started_at);
  node.append(head, el("div", "items"), el("p", "usage muted"));
  turn = { id: record.run_id, record, node, last: 0, events: [], source: null, done: false, dirty: false,
    messages: new Map(), tools: new Map(), files: new Map(), approvals: new Map(), promptShown: false };
  stats.runs[turn.id] = { received: [], dupes: 0, gaps: 0, resumedFrom: saved.last };
  v.turns.set(turn.id, turn);
  // in start order, whatever order the records came in
  const later = [...$("#transcript").children].find((s) => {
    const other = v.turns.get(s.dataset.runId);
    return other && other.record.started_at > record.started_at;
  });
  $("#transcript").insertBefore(node, later || null);
  showPrompt(turn, null);
  for (const [offset, event] of saved.events) show(turn, offset, event, false);
  showRecord(turn, record);
  // detached: only runs that ended (nothing live) are read
  if (!turn.done && (!v.detached || record.status !== "running")) connect(turn);
}

// The run's command (from its record) or, for an agent run, its prompt (the CUSTOM
// corral.prompt event after RUN_STARTED), first in its turn.
function showPrompt(turn, prompt) {
  if (turn.promptShown) return;
  const items = turn.node.querySelector(".items");
  if (turn.record.command) {
    items.prepend(el("div", "msg command", `$ ${shellWords(turn.record.command)}`));
  } else if (prompt !== null) {
    const msg = el("div", "msg user");
    msg.append(el("span", "role", "prompt"), el("span", "text", prompt));
    items.prepend(msg);
  } else {
    return;
  }
  turn.promptShown = true;
}

function showRecord(turn, record) {
  turn.record = record;
  const status = turn.node.querySelector(".turn-head .status");
  status.textContent = record.status;
  status.className = `status ${record.status}`;
  const selected = view && turn.id === view.runId;
  // once: the selected run's usage is the header's line; the thread's other turns keep theirs
  turn.node.querySelector(".usage").textContent = selected ? "" : usageText(record.usage);
  if (!selected) return;
  const top = $("#run-status");
  top.textContent = record.status + (record.cancel_requested && record.status === "running" ? " (cancelling)" : "");
  top.className = `status ${record.status}`;
  $("#cancel").disabled = record.status !== "running" || record.cancel_requested;
  $("#detach").disabled = record.status !== "running" && !view.detached;
  const parts = [`thread ${record.thread_id}`, record.harness || "command"];
  if (record.command) parts.push(shellWords(record.command));
  if (record.exit_code !== null && record.exit_code !== undefined) parts.push(`exit ${record.exit_code}`);
  if (record.error) parts.push(record.error.message);
  $("#run-meta").textContent = parts.join(" · ");
  $("#run-usage").textContent = usageText(record.usage);
}

function refreshRecord(turn) {
  api(`/v1/runs/${enc(turn.id)}`).then((r) => showRecord(turn, r)).catch(() => {});
}

function connect(turn) {
  closeStream(turn);
  let url = `/v1/runs/${enc(turn.id)}/events?after=${turn.last}`;
  if (token()) url += `&token=${enc(token())}`;
  const source = new EventSource(BASE + url);
  const mine = stats.runs[turn.id];
  turn.source = source;
  source.onmessage = (msg) => {
    if (turn.source !== source) return;
    const offset = Number(msg.lastEventId);
    mine.received.push(offset);
    if (offset <= turn.last) { mine.dupes += 1; return; }
    if (offset !== turn.last + 1) mine.gaps += 1;
    let event;
    try { event = JSON.parse(msg.data); } catch (_) { event = { type: "UNPARSEABLE", data: msg.data }; }
    show(turn, offset, event, true);
  };
  source.onopen = () => { if (!view.detached) $("#conn").textContent = "live"; };
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) {
      // 204 (nothing more) or a refusal; the record says which.
      closeStream(turn);
      refreshRecord(turn);
    } else {
      $("#conn").textContent = "reconnecting…";
    }
  };
}

// ---------------------------------------------------------------- rendering one event

function message(turn, id, role) {
  let node = turn.messages.get(id);
  if (!node) {
    const output = turn.record.harness === "command";
    node = el("div", `msg ${role === "user" ? "user" : "assistant"}`);
    node.append(el("span", "role", output ? "output" : role || "assistant"), el("span", "text"));
    turn.messages.set(id, node);
    turn.node.querySelector(".items").append(node);
  }
  return node.querySelector(".text");
}

function reasoning(turn, id) {
  const key = `reasoning:${id || ""}`;
  let node = turn.messages.get(key);
  if (!node) {
    node = el("details", "reasoning");
    node.append(el("summary", "", "Reasoning"), el("div", "text"));
    turn.messages.set(key, node);
    turn.node.querySelector(".items").append(node);
  }
  return node.querySelector(".text");
}

function tool(turn, id, name) {
  let card = turn.tools.get(id);
  if (!card) {
    card = el("details", "tool");
    card.dataset.toolCallId = String(id);
    const summary = el("summary");
    summary.append(el("span", "name", name || "tool"), el("span", "state muted", "running"));
    card.append(summary, el("div", "label", "Arguments"), el("pre", "args"),
      el("div", "label", "Result"), el("pre", "result"));
    turn.tools.set(id, card);
    turn.node.querySelector(".items").append(card);
  }
  return card;
}

function fileCard(turn, path) {
  let card = turn.files.get(path);
  if (!card) {
    card = el("details", "file");
    card.dataset.path = path;
    const summary = el("summary");
    summary.append(el("span", "change"), el("span", "path", path));
    card.append(summary, el("pre", "patch", "no patch (start the run with patches)"));
    turn.files.set(path, card);
    turn.node.querySelector(".items").append(card);
  }
  return card;
}

function approvalCard(turn, value) {
  const id = String(value.approvalId);
  const card = el("div", "approval");
  card.dataset.approvalId = id;
  card.setAttribute("role", "group");
  card.setAttribute("aria-label", `approval for ${value.tool}`);
  const args = el("pre", "args", JSON.stringify(value.args ?? null, null, 2));
  const allow = el("button", "allow", "Allow");
  const deny = el("button", "deny", "Deny");
  allow.type = deny.type = "button";
  allow.setAttribute("aria-label", `Allow ${value.tool}`);
  deny.setAttribute("aria-label", `Deny ${value.tool}`);
  const answer = el("p", "answer muted", "waiting for your answer");
  const buttons = el("div", "buttons");
  buttons.append(allow, deny);
  card.append(el("strong", "", "Approval: "), el("span", "tool-name", value.tool), args, buttons, answer);
  const decide = async (decision) => {
    allow.disabled = deny.disabled = true;
    try {
      await api(`/v1/runs/${enc(turn.id)}/approvals/${enc(id)}`, {
        method: "POST", body: JSON.stringify({ decision }) });
      // the run's corral.approval_resolved may have arrived before this answer did: the
      // card then says what the run decided, and stays that way
      if (!card.classList.contains("resolved")) {
        answer.textContent = `${decision === "allow" ? "allowed" : "denied"}; waiting for the run`;
      }
    } catch (e) {
      if (!card.classList.contains("resolved")) {
        answer.textContent = errText(e);
        answer.className = "answer error";
      }
    }
  };
  allow.addEventListener("click", () => decide("allow"));
  deny.addEventListener("click", () => decide("deny"));
  turn.approvals.set(id, card);
  turn.node.querySelector(".items").append(card);
}

function resolveApproval(card, text) {
  card.classList.add("resolved");
  card.querySelector(".buttons").remove();
  const answer = card.querySelector(".answer");
  answer.textContent = text;
  answer.className = "answer muted";
}

function prettyArgs(pre) {
  try { pre.textContent = JSON.stringify(JSON.parse(pre.textContent), null, 2); } catch (_) { /* not JSON */ }
}

function show(turn, offset, event, live) {
  turn.events.push([offset, event]);
  turn.last = offset;
  if (live) { turn.dirty = true; scheduleSave(); }
  if (view && turn.id === view.runId) {
    const item = el("li", "", `${offset} ${JSON.stringify(event)}`);
    item.dataset.offset = String(offset);
    item.dataset.type = String(event.type);
    $("#events").append(item);
    $("#event-count").textContent = String(turn.events.length);
  }
  const items = turn.node.querySelector(".items");
  const value = (event && typeof event.value === "object" && event.value) || {};
  switch (event.type) {
    case "TEXT_MESSAGE_START":
      message(turn, event.messageId, event.role);
      break;
    case "TEXT_MESSAGE_CONTENT":
    case "TEXT_MESSAGE_CHUNK":
      message(turn, event.messageId, event.role).textContent += event.delta || "";
      break;
    case "REASONING_MESSAGE_CONTENT":
    case "REASONING_MESSAGE_CHUNK":
    case "THINKING_TEXT_MESSAGE_CONTENT":
      reasoning(turn, event.messageId).textContent += event.delta || "";
      break;
    case "TOOL_CALL_START":
      tool(turn, event.toolCallId, event.toolCallName);
      break;
    case "TOOL_CALL_ARGS":
    case "TOOL_CALL_CHUNK":
      tool(turn, event.toolCallId, event.toolCallName).querySelector(".args").textContent += event.delta || "";
      break;
    case "TOOL_CALL_END":
      prettyArgs(tool(turn, event.toolCallId).querySelector(".args"));
      break;
    case "TOOL_CALL_RESULT": {
      const card = tool(turn, event.toolCallId);
      card.querySelector(".result").textContent = String(event.content ?? "");
      card.querySelector(".state").textContent = "done";
      break;
    }
    case "RUN_ERROR":
      items.append(el("div", "banner bad", `run error: ${event.message || ""}${event.code ? ` (${event.code})` : ""}`));
      break;
    case "RUN_FINISHED":
      items.append(el("div", "banner good", "run finished"));
      break;
    case "CUSTOM":
      if (event.name === PROMPT && typeof value.prompt === "string") {
        showPrompt(turn, value.prompt);
      } else if (event.name === "sandbox.file.diff" && typeof value.path === "string") {
        fileCard(turn, value.path).querySelector(".patch").textContent =
          String(value.diff ?? "") || "no changes against the start";
      } else if (event.name === "sandbox.file" && typeof value.path === "string") {
        fileCard(turn, value.path).querySelector(".change").textContent = `${value.type || "changed"} `;
      } else if (event.name === APPROVAL_REQUEST && value.approvalId) {
        approvalCard(turn, value);
      } else if (event.name === APPROVAL_RESOLVED && turn.approvals.has(String(value.approvalId))) {
        resolveApproval(turn.approvals.get(String(value.approvalId)),
          `${DECIDED[value.decision] || String(value.decision)}${value.reason ? `: ${value.reason}` : ""}`);
      }
      // other CUSTOM events (sessions, byte counts, a harness's own) are in the raw list
      break;
    default:
      break;
  }
  if (TERMINAL.has(event.type)) {
    // A run's log ends with its terminal event; the server then closes the stream, so
    // stop now rather than reconnect to a 204. Unanswered approvals died with the run.
    turn.done = true;
    closeStream(turn);
    if (view && [...view.turns.values()].every((t) => !t.source)) $("#conn").textContent = "";
    for (const card of turn.approvals.values()) {
      if (!card.classList.contains("resolved")) resolveApproval(card, "no longer pending: the run ended");
    }
    if (live) { refreshRuns(); refreshRecord(turn); }
  }
}

// ---------------------------------------------------------------- start-up

function runFromHash() {
  const m = /^#run=(.+)$/.exec(location.hash);
  return m ? decodeURIComponent(m[1]) : null;
}

window.addEventListener("hashchange", () => {
  const id = runFromHash();
  if (id && (!view || view.runId !== id)) watch(id);
});
showKind();
loadHarnesses();
refreshRuns();
refreshThreads();
setInterval(refreshRuns, 3000);
setInterval(refreshThreads, 3000);
const initial = runFromHash();
if (initial) watch(initial);
