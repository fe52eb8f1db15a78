// Drives one corral run through several AG-UI runs with the official client's HttpAgent:
// frontend tools it runs itself, interrupts it answers with resume entries. Usage:
//   node agui_turns.mjs URL TOKEN THREAD_ID PROMPT FORWARDED_PROPS_JSON PLAN_JSON
// PLAN: {tools: [AG-UI Tool], results: {toolName: text}, approvals: [{decision, reason}]}
// (answers in order). After each AG-UI run it also checks a reconnect: the same input sent
// again from scratch replays that run exactly, and sent with Last-Event-ID = the id of its
// middle event resumes after it, with nothing lost or repeated, the client's verification
// accepting the two parts joined. Prints "TURN <json>" per AG-UI run, then
// "RESULT <json>", or "ERROR <message>" and exits 1.
import { HttpAgent, buildResumeArray, verifyEvents } from "@ag-ui/client";
import { from, lastValueFrom, toArray } from "rxjs";

const [url, token, threadId, prompt, props, planJson] = process.argv.slice(2);
const plan = JSON.parse(planJson);
const auth = token ? { authorization: `Bearer ${token}` } : {};
let lastBody = null;
const cutAfter = plan.cutAfter ?? 3;
const reconnects = [];

// HttpAgent's transport, with the connection dropped after `cutAfter` events of each AG-UI
// run and resumed with Last-Event-ID, as a resilient client does: HttpAgent parses and
// verifies the stitched stream as one.
function droppingFetch(u, init) {
  lastBody = init.body;
  return (async () => {
    const first = await fetch(u, init);
    if (!first.ok || !cutAfter) return first;
    const reader = first.body.getReader();
    const dec = new TextDecoder();
    const enc = new TextEncoder();
    let buf = "";
    let frames = 0;
    let lastId = null;
    const body = new ReadableStream({
      async start(controller) {
        for (;;) {
          const { value, done } = await reader.read();
          if (done) {
            reconnects.push(null);
            controller.close();
            return;
          }
          buf += dec.decode(value, { stream: true });
          let i;
          while ((i = buf.indexOf("\n\n")) >= 0) {
            const frame = buf.slice(0, i + 2);
            buf = buf.slice(i + 2);
            controller.enqueue(enc.encode(frame));
            const id = /^id: (\d+)$/m.exec(frame);
            if (id && frame.includes("data: ")) { lastId = id[1]; frames += 1; }
            if (frames >= cutAfter) {
              await reader.cancel();  // the connection drops; the rest of `buf` is lost
              const again = await fetch(u, { method: "POST", body: init.body,
                headers: { ...init.headers, "last-event-id": lastId } });
              if (!again.ok) throw new Error(`reconnect answered ${again.status}`);
              reconnects.push(Number(lastId));
              const rest = again.body.getReader();
              for (;;) {
                const part = await rest.read();
                if (part.done) break;
                controller.enqueue(part.value);
              }
              controller.close();
              return;
            }
          }
        }
      },
    });
    return new Response(body, { status: first.status, headers: first.headers });
  })();
}

const agent = new HttpAgent({
  url, headers: auth, threadId,
  initialMessages: [{ id: "user-1", role: "user", content: prompt }],
  fetch: droppingFetch,
});

async function raw(body, lastEventId) {
  // the SSE frames with their ids, as a reconnecting client reads them
  const headers = { ...auth, "content-type": "application/json", accept: "text/event-stream" };
  if (lastEventId !== undefined) headers["last-event-id"] = String(lastEventId);
  const res = await fetch(url, { method: "POST", headers, body });
  if (!res.ok) throw new Error(`reconnect answered ${res.status}: ${await res.text()}`);
  const text = await res.text();
  return text.split("\n\n").filter((f) => f.includes("data: ")).map((f) => {
    const id = Number(/^id: (\d+)$/m.exec(f)[1]);
    return { id, event: JSON.parse(/^data: (.*)$/m.exec(f)[1]) };
  });
}

async function verified(events) {
  return lastValueFrom(from(events).pipe(verifyEvents(false), toArray()));
}

const turns = [];
let resume;
let approvals = [...(plan.approvals || [])];
try {
  for (let n = 0; n < 8; n++) {
    const seen = [];
    let outcome = null;
    await agent.runAgent(
      { runId: `turn-${n}-${Date.now()}`, tools: plan.tools || [], forwardedProps: JSON.parse(props), resume },
      { onEvent: ({ event }) => { seen.push(event); },
        onRunFinishedEvent: (p) => { outcome = { outcome: p.outcome, pendingToolCallIds: p.pendingToolCallIds, interrupts: p.interrupts }; } },
    );
    // the reconnect check: a full replay, then a resume from the middle
    const body = lastBody;
    const full = await raw(body);
    const mid = full[Math.floor(full.length / 2)].id;
    const tail = await raw(body, mid);
    const expectedTail = full.filter((f) => f.id > mid);
    const joined = [...full.filter((f) => f.id <= mid), ...tail].map((f) => f.event);
    await verified(joined);
    const replayOk = JSON.stringify(full.map((f) => f.event.type)) === JSON.stringify(seen.map((e) => e.type));
    const tailOk = JSON.stringify(tail) === JSON.stringify(expectedTail);
    turns.push({ runId: JSON.parse(body).runId, events: seen, outcome, replayOk, tailOk,
                 reconnectAt: mid, tailLength: tail.length, droppedAt: reconnects[n] });
    console.log(`TURN ${JSON.stringify(turns[turns.length - 1])}`);
    resume = undefined;
    if (agent.pendingInterrupts.length > 0) {
      const responses = {};
      for (const interrupt of agent.pendingInterrupts) {
        const answer = approvals.shift();
        if (!answer) throw new Error(`no answer planned for interrupt ${interrupt.id}`);
        responses[interrupt.id] = { status: "resolved", payload: answer };
      }
      resume = buildResumeArray(agent.pendingInterrupts, responses);
      continue;
    }
    const pending = outcome && outcome.outcome === "success" ? outcome.pendingToolCallIds : [];
    if (!pending || pending.length === 0) break;
    for (const id of pending) {
      const call = agent.messages.flatMap((m) => m.toolCalls || []).find((c) => c.id === id);
      if (!call) throw new Error(`pending tool call ${id} is not among the messages`);
      const result = plan.results[call.function.name];
      if (result === undefined) throw new Error(`no result planned for ${call.function.name}`);
      agent.addMessage({ id: `result-${id}`, role: "tool", toolCallId: id,
                         content: `${result} (asked: ${call.function.arguments})` });
    }
  }
  console.log(`RESULT ${JSON.stringify({ turns: turns.length, messages: agent.messages })}`);
  process.exit(0);
} catch (err) {
  console.log(`ERROR ${err && err.stack ? err.stack : err}`);
  process.exit(1);
}
