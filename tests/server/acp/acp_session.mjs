// Drives `corral acp` with the official ACP client library (@agentclientprotocol/sdk):
// tests/server/test_acp_agent.py. One JSON argument says what to do:
//   {cmd: [argv of corral acp], env, cwd,
//    load: sessionId | null,        // session/load instead of session/new
//    resume: true | undefined,      // session/resume instead of session/load
//    prompt: text | null,           // prompt once the session is open
//    cancelOn: text | null,         // session/cancel once agent text contains it
//    disconnectOn: text | null,     // close the connection once agent text contains it
//    until: text | null,            // after a load: wait until agent text contains it
//    then: text | null,             // after that, one more prompt
//    permission: "allow" | "deny",  // the editor's answer to permission requests
//    fsWrite: true | undefined,     // advertise fs.writeTextFile and write what comes
//    beforeThen: [{path, content} | {path, symlink}]}  // the user's own changes before
//                                   // `then`: a file written, a symlink made
// Prints one JSON line per thing seen: {kind: "session"|"update"|"permission"|"write"|
// "stop"|"closed", ...}.
import { spawn } from "node:child_process";
import { symlinkSync, writeFileSync } from "node:fs";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk";

const plan = JSON.parse(process.argv[2]);
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");
const child = spawn(plan.cmd[0], plan.cmd.slice(1), {
  stdio: ["pipe", "pipe", "inherit"], env: plan.env, cwd: plan.cwd });
const exited = new Promise((resolve) => child.on("exit", (code) => resolve(code)));
const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));

let text = "";
const waiters = [];
const sawText = (needle) => new Promise((resolve) => {
  if (text.includes(needle)) resolve(); else waiters.push([needle, resolve]);
});

const app = acp.client({ name: "corral-acp-test" })
  .onNotification(acp.methods.client.session.update, (ctx) => {
    const update = ctx.params.update;
    out({ kind: "update", sessionId: ctx.params.sessionId, update });
    if (update.sessionUpdate === "agent_message_chunk" && update.content.type === "text") {
      text += update.content.text;
      for (const [needle, resolve] of waiters.splice(0)) {
        if (text.includes(needle)) resolve(); else waiters.push([needle, resolve]);
      }
    }
  })
  .onRequest(acp.methods.client.session.requestPermission, (ctx) => {
    out({ kind: "permission", params: ctx.params });
    const want = plan.permission === "deny" ? "reject_once" : "allow_once";
    const option = ctx.params.options.find((o) => o.kind === want);
    return { outcome: { outcome: "selected", optionId: option.optionId } };
  })
  .onRequest(acp.methods.client.fs.writeTextFile, (ctx) => {
    // what an editor does with it: the file (its buffer, saved) gets the content
    out({ kind: "write", path: ctx.params.path, content: ctx.params.content });
    writeFileSync(ctx.params.path, ctx.params.content);
    return {};
  });

const closed = await app.connectWith(stream, async (cx) => {
  const init = await cx.request(acp.methods.agent.initialize, {
    protocolVersion: acp.PROTOCOL_VERSION,
    clientCapabilities: { fs: { readTextFile: false, writeTextFile: !!plan.fsWrite },
                          terminal: false },
  });
  out({ kind: "initialized", init });
  let sessionId = plan.load;
  if (plan.load && plan.resume) {
    await cx.request(acp.methods.agent.session.resume, { sessionId, cwd: plan.cwd, mcpServers: [] });
  } else if (plan.load) {
    await cx.request(acp.methods.agent.session.load, { sessionId, cwd: plan.cwd, mcpServers: [] });
  } else {
    sessionId = (await cx.request(acp.methods.agent.session.new,
                                  { cwd: plan.cwd, mcpServers: [] })).sessionId;
  }
  out({ kind: "session", sessionId });
  const prompt = async (t) => {
    const done = await cx.request(acp.methods.agent.session.prompt,
                                  { sessionId, prompt: [{ type: "text", text: t }] });
    out({ kind: "stop", stopReason: done.stopReason });
  };
  if (plan.prompt) {
    const turn = prompt(plan.prompt);
    if (plan.cancelOn) {
      await sawText(plan.cancelOn);
      await cx.notify(acp.methods.agent.session.cancel, { sessionId });
    }
    if (plan.disconnectOn) {
      await Promise.race([sawText(plan.disconnectOn), turn]);
      return "disconnected";  // leaving connectWith closes the connection mid-turn
    }
    await turn;
  }
  if (plan.until) await sawText(plan.until);
  for (const change of plan.beforeThen || []) {
    if (change.symlink) symlinkSync(change.symlink, change.path);
    else writeFileSync(change.path, change.content);
  }
  if (plan.then) await prompt(plan.then);
  return "done";
});
child.stdin.end();  // the editor is gone: corral acp sees its stdin close
out({ kind: "closed", how: closed, code: await exited });
