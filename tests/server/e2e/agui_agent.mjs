// Drives corral's AG-UI endpoint with the official client's HttpAgent (its own request,
// SSE parsing, event verification and message assembly). Usage:
//   node agui_agent.mjs URL TOKEN THREAD_ID RUN_ID PROMPT FORWARDED_PROPS_JSON
// Prints each event as a JSON line, then "RESULT <json>" with the messages the agent
// assembled, or "ERROR <message>" and exits 1.
import { HttpAgent } from "@ag-ui/client";

const [url, token, threadId, runId, prompt, props] = process.argv.slice(2);
const agent = new HttpAgent({
  url,
  headers: token ? { authorization: `Bearer ${token}` } : {},
  threadId,
  initialMessages: [{ id: `${runId}-user`, role: "user", content: prompt }],
});
try {
  const result = await agent.runAgent(
    { runId, forwardedProps: JSON.parse(props) },
    { onEvent: ({ event }) => { console.log(JSON.stringify(event)); } },
  );
  console.log(`RESULT ${JSON.stringify({ newMessages: result.newMessages, messages: agent.messages })}`);
  process.exit(0);
} catch (err) {
  console.log(`ERROR ${err && err.message ? err.message : err}`);
  process.exit(1);
}
