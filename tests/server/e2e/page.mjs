// Drives corral's web page in headless Chromium (Debian's /usr/bin/chromium via
// playwright-core) with command runs: give the token, start a run, reload mid-run, detach
// and watch again, cancel, hostile output and file names, patches, a phone's viewport.
// Prints one JSON summary on stdout; tests/server/test_page.py checks it against the store.
//
// usage: node page.mjs <page url> <token> <screenshot dir>

import {
  HOSTILE, drive, hostileChecks, layoutChecks, onPhone, openPage, shownOffsets, start, stats, turn,
  waitEnded,
} from "./page_lib.mjs";

const [base, token, shots] = process.argv.slice(2);
const TICKS = 40;
const tickCommand = `sh -c 'i=0; while [ $i -lt ${TICKS} ]; do echo tick $i; i=$((i+1)); sleep 0.1; done'`;
const slowCommand = "sh -c 'i=0; while [ $i -lt 600 ]; do echo slow $i; i=$((i+1)); sleep 0.1; done'";
const auth = { Authorization: `Bearer ${token}` };

// Whether the server's log of `id` holds more than `n` events: read its stream after `n`
// until one event arrives (the run writes one a tenth of a second).
async function serverHasMoreThan(id, n) {
  const ctrl = new AbortController();
  const res = await fetch(`${base}/v1/runs/${id}/events?after=${n}`, { headers: auth, signal: ctrl.signal });
  const reader = res.body.getReader();
  let text = "";
  while (!/^id: ?\d+$/m.test(text)) {
    const { value, done } = await reader.read();
    if (done) break;
    text += new TextDecoder().decode(value);
  }
  ctrl.abort();
  return /^id: ?\d+$/m.test(text);
}

async function record(id) {
  return (await fetch(`${base}/v1/runs/${id}`, { headers: auth })).json();
}

await drive(async (browser, out) => {
  const { page, consoleErrors } = await openPage(browser, base, token);

  // Start a run, watch some of it, reload mid-run: the page continues where it was.
  out.runId = await start(page, { command: tickCommand, thread: "page-thread" });
  await page.waitForFunction(() => document.querySelectorAll("#events li").length >= 10,
                             null, { timeout: 30000 });
  out.shownBeforeReload = (await shownOffsets(page)).length;
  out.receivedBeforeReload = (await stats(page, out.runId)).received;
  await page.reload();
  await page.waitForSelector(turn(out.runId), { timeout: 15000 });
  await waitEnded(page, out.runId);
  const after = await stats(page, out.runId);
  out.resumedFrom = after.resumedFrom;
  out.receivedAfterReload = after.received;
  out.dupes = after.dupes;
  out.gaps = after.gaps;
  out.offsets = await shownOffsets(page);
  out.transcript = await page.$eval(`${turn(out.runId)} .msg.assistant .text`, (n) => n.textContent);
  out.commandShown = await page.$eval(`${turn(out.runId)} .msg.command`, (n) => n.textContent);
  out.finishedBanner = await page.$eval(`${turn(out.runId)} .banner`, (n) => n.textContent);
  await page.waitForFunction(() => document.querySelector("#run-status").textContent === "completed",
                             null, { timeout: 15000 });
  await page.screenshot({ path: `${shots}/command-finished.png`, fullPage: true });

  // A long run: detach (the page stops watching, the run goes on), watch again, cancel.
  out.detachRunId = await start(page, { command: slowCommand, thread: "" });
  await page.waitForFunction(() => document.querySelectorAll("#events li").length >= 5,
                             null, { timeout: 30000 });
  await page.click("#detach");
  const shown = (await shownOffsets(page)).length;
  const received = (await stats(page, out.detachRunId)).received.length;
  out.detachLabel = await page.textContent("#detach");
  out.serverWentOn = await serverHasMoreThan(out.detachRunId, shown + 10);
  out.shownWhileDetached = (await shownOffsets(page)).length - shown;
  out.receivedWhileDetached = (await stats(page, out.detachRunId)).received.length - received;
  // nobody watches now: the server marks the run detached (and keeps driving it)
  const deadline = Date.now() + 20000;
  let rec = await record(out.detachRunId);
  while (rec.detached_since === null && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 200));
    rec = await record(out.detachRunId);
  }
  out.detachedRecord = { status: rec.status, detachedSince: rec.detached_since };
  // A reload keeps the page detached: what it showed, nothing more.
  await page.reload();
  await page.waitForSelector(`${turn(out.detachRunId)} .msg.assistant`, { timeout: 15000 });
  out.serverWentOnAfterReload = await serverHasMoreThan(out.detachRunId, shown + 20);
  out.detachLabelAfterReload = await page.textContent("#detach");
  out.shownAfterDetachedReload = (await shownOffsets(page)).length - shown;
  out.receivedAfterDetachedReload = (await stats(page, out.detachRunId)).received.length;
  await page.screenshot({ path: `${shots}/command-detached.png`, fullPage: true });
  await page.click("#detach"); // Watch
  await page.waitForFunction((n) => document.querySelectorAll("#events li").length > n,
                             shown + 20, { timeout: 30000 });
  out.cancelRunId = out.detachRunId;
  await page.click("#cancel");
  await page.waitForFunction(() => document.querySelector("#run-status").textContent === "aborted",
                             null, { timeout: 30000 });
  await waitEnded(page, out.cancelRunId);
  const watched = await stats(page, out.cancelRunId);
  out.detachDupes = watched.dupes;
  out.detachGaps = watched.gaps;
  out.detachOffsets = await shownOffsets(page);
  out.cancelBanner = await page.$eval(`${turn(out.cancelRunId)} .banner`, (n) => n.textContent);
  await page.screenshot({ path: `${shots}/command-cancelled.png`, fullPage: true });

  // Output is hostile: markup in it is shown as text, never run. So are the names of the
  // files a run makes (sandbox.file events).
  out.hostileRunId = await start(page, {
    thread: "",
    command: `sh -c 'echo "${HOSTILE}"; touch "<img src=y onerror=window.pwned=1>"'`,
  });
  await waitEnded(page, out.hostileRunId);
  await page.waitForSelector(`${turn(out.hostileRunId)} details.file`, { timeout: 15000 });
  out.hostileText = await page.$eval(`${turn(out.hostileRunId)} .msg.assistant .text`, (n) => n.textContent);
  out.filesShown = await page.$$eval(`${turn(out.hostileRunId)} details.file summary`,
                                     (s) => s.map((n) => n.textContent));

  // With patches: a file's patch, as text, in its collapsed card.
  await page.check("#file-diffs");
  out.diffRunId = await start(page, { command: `sh -c 'printf "<b>bold</b>\\n" > page.html'`, thread: "" });
  await waitEnded(page, out.diffRunId);
  const card = `${turn(out.diffRunId)} details.file[data-path="page.html"]`;
  await page.waitForSelector(card, { timeout: 15000 });
  out.diffOpenBefore = await page.$eval(card, (d) => d.open);
  await page.click(`${card} summary`);
  out.diffShown = await page.$eval(`${card} .patch`, (n) => n.textContent);
  out.diffBold = await page.$$eval("main b", (bs) => bs.length);
  out.hostile = await hostileChecks(page);
  out.desktop = await layoutChecks(page);
  out.consoleErrors = consoleErrors;

  // A phone: the finished run, readable at 375 px.
  const phone = await onPhone(browser, base, token, out.runId);
  await waitEnded(phone.page, out.runId);
  out.phone = await layoutChecks(phone.page);
  await phone.page.screenshot({ path: `${shots}/command-phone.png`, fullPage: true });
  out.phoneConsoleErrors = phone.consoleErrors;
});
