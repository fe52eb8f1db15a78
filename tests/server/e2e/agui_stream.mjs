// Reads one corral run's event stream (GET /v1/runs/{id}/events) with @ag-ui/client's own
// HTTP transport, SSE parsing and event verification; prints each event as a JSON line and
// "VERIFIED" when the stream completed without an error.
import { runHttpRequest, transformHttpEventStream, verifyEvents } from "@ag-ui/client";

const [url, token] = process.argv.slice(2);
const headers = { accept: "text/event-stream" };
if (token) headers.authorization = `Bearer ${token}`;
const events$ = transformHttpEventStream(runHttpRequest(() => fetch(url, { headers })))
  .pipe(verifyEvents(false));
events$.subscribe({
  next: (event) => console.log(JSON.stringify(event)),
  error: (err) => { console.log(`ERROR ${err && err.message ? err.message : err}`); process.exit(1); },
  complete: () => { console.log("VERIFIED"); process.exit(0); },
});
