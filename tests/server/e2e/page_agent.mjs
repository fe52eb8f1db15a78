// Drives corral's web page in headless Chromium with real Claude Code runs (the scripted
// model server stands in for the model): start an agent run, see its shell tool call, its
// reasoning and the file it wrote, reload while its host tool waits for approval, Allow it,
// read usage and cost; then a second run on the thread, whose approval is Denied; then the
// thread on a phone. Hostile text comes through the prompt, the output and a tool's args.
// Prints one JSON summary on stdout; tests/agents/test_page_agent.py checks it.
//
// usage: node page_agent.mjs <page url> <token> <screenshot dir>

import {
  HOSTILE, drive, hostileChecks, layoutChecks, onPhone, openPage, shownOffsets, start, stats, turn,
  waitEnded,
} from "./page_lib.mjs";

const [base, token, shots] = process.argv.slice(2);
const AGENT_TIMEOUT = 150000;

// What a turn of the conversation shows, read as text.
async function readTurn(page, id) {
  return page.$eval(turn(id), (s) => ({
    prompt: (s.querySelector(".msg.user .text") || {}).textContent,
    said: [...s.querySelectorAll(".msg.assistant .text")].map((n) => n.textContent),
    tools: [...s.querySelectorAll("details.tool")].map((d) => ({
      name: d.querySelector(".name").textContent, open: d.open,
      args: d.querySelector(".args").textContent, result: d.querySelector(".result").textContent })),
    reasoning: [...s.querySelectorAll("details.reasoning")].map((d) => ({
      open: d.open, text: d.querySelector(".text").textContent })),
    approvals: [...s.querySelectorAll(".approval")].map((a) => ({
      tool: a.querySelector(".tool-name").textContent, args: a.querySelector(".args").textContent,
      answer: a.querySelector(".answer").textContent, buttons: a.querySelectorAll("button").length })),
    files: [...s.querySelectorAll("details.file")].map((d) => ({
      path: d.dataset.path, summary: d.querySelector("summary").textContent,
      patch: d.querySelector(".patch").textContent })),
    usage: s.querySelector(".usage").textContent,
    status: s.querySelector(".turn-head .status").textContent,
  }));
}

async function approve(page, id, button) {
  const selector = `${turn(id)} .approval button[aria-label="${button} deploy"]`;
  await page.waitForSelector(selector, { timeout: AGENT_TIMEOUT });
  return selector;
}

await drive(async (browser, out) => {
  const { page, consoleErrors } = await openPage(browser, base, token);
  await page.waitForSelector("#harness option", { state: "attached", timeout: 15000 });
  out.harnesses = await page.$$eval("#harness option", (os) => os.map((o) => o.value));

  // The first run: a shell call that writes a file, then the host tool (held for approval).
  await page.check("#file-diffs");
  out.prompt = `Write the notes, then deploy. ${HOSTILE}`;
  out.first = await start(page, { prompt: out.prompt, harness: "claude-code", thread: "agent-thread" });
  const allow = await approve(page, out.first, "Allow");
  out.shownBeforeReload = (await shownOffsets(page)).length;

  // Reload while the run waits: the same conversation, the approval still answerable.
  await page.reload();
  await page.waitForSelector(allow, { timeout: 15000 });
  await page.screenshot({ path: `${shots}/agent-approval.png`, fullPage: true });
  out.resumedFrom = (await stats(page, out.first)).resumedFrom;
  await page.click(allow);
  await waitEnded(page, out.first, AGENT_TIMEOUT);
  await page.waitForFunction(() => document.querySelector("#run-usage").textContent !== "",
                             null, { timeout: 30000 });
  out.firstTurn = await readTurn(page, out.first);
  out.firstOffsets = await shownOffsets(page);
  out.firstStats = await stats(page, out.first);
  out.runUsage = await page.textContent("#run-usage");
  out.runStatus = await page.textContent("#run-status");
  // open every fold for the screenshot
  await page.$$eval(`${turn(out.first)} details`, (ds) => ds.forEach((d) => { d.open = true; }));
  await page.screenshot({ path: `${shots}/agent-run.png`, fullPage: true });

  // The second run on the thread ("Continue thread"): its approval is denied.
  await page.fill("#thread", "");
  await page.click("#reply");
  out.threadField = await page.inputValue("#thread");
  out.secondPrompt = "A second question: deploy to staging?";
  out.second = await start(page, { prompt: out.secondPrompt, harness: "claude-code" });
  await page.click(await approve(page, out.second, "Deny"));
  await waitEnded(page, out.second, AGENT_TIMEOUT);
  await page.waitForFunction(() => document.querySelector("#run-status").textContent === "completed",
                             null, { timeout: 30000 });
  out.secondTurn = await readTurn(page, out.second);
  out.secondStats = await stats(page, out.second);
  out.turns = await page.$$eval("#transcript section.turn", (ss) => ss.map((s) => s.dataset.runId));
  out.hostile = await hostileChecks(page);
  out.desktop = await layoutChecks(page);
  await page.screenshot({ path: `${shots}/agent-thread.png`, fullPage: true });
  out.consoleErrors = consoleErrors;

  // The thread on a phone.
  const phone = await onPhone(browser, base, token, out.second);
  await waitEnded(phone.page, out.first);
  await waitEnded(phone.page, out.second);
  out.phoneTurns = await phone.page.$$eval("#transcript section.turn", (ss) => ss.map((s) => s.dataset.runId));
  out.phoneFirstTurn = await readTurn(phone.page, out.first);
  out.phone = await layoutChecks(phone.page);
  out.phoneHostile = await hostileChecks(phone.page);
  await phone.page.screenshot({ path: `${shots}/agent-phone.png`, fullPage: true });
  out.phoneConsoleErrors = phone.consoleErrors;
});
