// Drives corral's web page in headless Chromium (Debian's /usr/bin/chromium via
// playwright-core): give the token, start a run, watch it, reload mid-run, watch the rest,
// then start another run and cancel it. Prints one JSON summary on stdout; the pytest side
// (tests/server/test_page.py) checks it against the store.
//
// usage: node page.mjs <base url> <token> <screenshot dir>

import { chromium } from "playwright-core";

const [base, token, shots] = process.argv.slice(2);
const TICKS = 40;
const tickCommand = `sh -c 'i=0; while [ $i -lt ${TICKS} ]; do echo tick $i; i=$((i+1)); sleep 0.1; done'`;
const slowCommand = "sh -c 'i=0; while [ $i -lt 600 ]; do echo slow $i; i=$((i+1)); sleep 0.1; done'";

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync"],
});
const out = {};
try {
  const page = await browser.newPage({ viewport: { width: 1200, height: 800 } });
  const consoleErrors = [];
  page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text()); });
  page.on("pageerror", (e) => consoleErrors.push(String(e)));
  await page.goto(`${base}/`);

  // The server wants a token: the page asks for it.
  await page.waitForSelector("#token-form:not([hidden])", { timeout: 15000 });
  await page.fill("#token", token);
  await page.click("#token-form button");

  // Start a run and watch some of it.
  await page.fill("#command", tickCommand);
  await page.fill("#thread", "page-thread");
  await page.click("#start");
  await page.waitForFunction(() => document.querySelectorAll("#events li").length >= 10,
                             null, { timeout: 30000 });
  out.runId = await page.textContent("#run-title");
  out.shownBeforeReload = await page.$$eval("#events li", (lis) => lis.length);
  out.receivedBeforeReload = await page.evaluate(() => window.corral.received.slice());

  // Reload mid-run: the page continues where it was.
  await page.reload();
  out.resumedFrom = await page.evaluate(() => window.corral.resumedFrom);
  await page.waitForSelector('#events li[data-type="RUN_FINISHED"]', { state: "attached", timeout: 30000 });
  out.offsets = await page.$$eval("#events li", (lis) => lis.map((li) => Number(li.dataset.offset)));
  out.receivedAfterReload = await page.evaluate(() => window.corral.received.slice());
  out.dupes = await page.evaluate(() => window.corral.dupes);
  out.gaps = await page.evaluate(() => window.corral.gaps);
  out.transcript = await page.$eval("#transcript .msg .text", (n) => n.textContent);
  out.finishedBanner = await page.$eval("#errors", (n) => n.textContent);
  await page.waitForFunction(() => document.querySelector("#run-status").textContent === "completed",
                             null, { timeout: 15000 });
  await page.screenshot({ path: `${shots}/page-finished.png`, fullPage: true });

  // Another run, cancelled from the page.
  await page.fill("#command", slowCommand);
  await page.fill("#thread", "");
  await page.click("#start");
  await page.waitForFunction((first) => {
    const title = document.querySelector("#run-title").textContent;
    return title !== first && document.querySelectorAll("#events li").length >= 5;
  }, out.runId, { timeout: 30000 });
  out.cancelRunId = await page.textContent("#run-title");
  await page.click("#cancel");
  await page.waitForFunction(() => document.querySelector("#run-status").textContent === "aborted",
                             null, { timeout: 30000 });
  await page.waitForSelector('#events li[data-type="RUN_ERROR"]', { state: "attached", timeout: 30000 });
  out.cancelBanner = await page.$eval("#errors", (n) => n.textContent);
  out.listedStatuses = await page.$$eval("#runs tbody tr", (trs) =>
    Object.fromEntries(trs.map((tr) => [tr.dataset.runId, tr.children[1].textContent])));
  await page.screenshot({ path: `${shots}/page-cancelled.png`, fullPage: true });

  // Agent output is hostile: markup in it is shown as text, never run.
  // So are the names of the files it makes (shown from sandbox.file events).
  await page.fill("#command",
    `sh -c 'echo "<img src=x onerror=window.pwned=1>"; touch "<img src=y onerror=window.pwned=1>"'`);
  await page.click("#start");
  await page.waitForFunction((prev) => document.querySelector("#run-title").textContent !== prev &&
      document.querySelector('#events li[data-type="RUN_FINISHED"]'), out.cancelRunId,
      { timeout: 30000 });
  out.hostileText = await page.$eval("#transcript .msg .text", (n) => n.textContent);
  out.filesShown = await page.$$eval("#files-list li", (lis) => lis.map((li) => li.textContent));

  // With diffs: a file's patch is shown on click, as text.
  await page.check("#file-diffs");
  await page.fill("#command", `sh -c 'printf "<b>bold</b>\\n" > page.html'`);
  await page.click("#start");
  await page.waitForFunction((prev) => document.querySelector("#run-title").textContent !== prev &&
      document.querySelector('#events li[data-type="RUN_FINISHED"]') &&
      document.querySelector('#files-list li[data-path="page.html"]'), out.cancelRunId,
      { timeout: 30000 });
  await page.click('#files-list li[data-path="page.html"]');
  out.diffShown = await page.$eval("#file-diff", (n) => n.textContent);
  out.diffBold = await page.$$eval("#file-diff b", (bs) => bs.length);
  out.hostileImages = await page.$$eval("#run img", (imgs) => imgs.length);
  out.pwned = await page.evaluate(() => window.pwned === 1);
  out.consoleErrors = consoleErrors;
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(out) + "\n");
