// Drives corral's web page in headless Chromium: a thread of command runs, the thread
// list, Undo turn, Fork. Prints one JSON summary; tests/server/test_page_threads.py checks it.
//
// usage: node page_threads.mjs <page url> <token> <screenshot dir>

import { drive, layoutChecks, openPage, start, turn, waitEnded } from "./page_lib.mjs";

const [base, token, shots] = process.argv.slice(2);

async function output(page, id) {
  await waitEnded(page, id);
  return page.$eval(`${turn(id)} .msg.assistant .text`, (n) => n.textContent).catch(() => "");
}

async function banner(page, text) {
  await page.waitForFunction((t) => [...document.querySelectorAll("#errors .banner")]
    .some((b) => b.textContent.includes(t)), text, { timeout: 30000 }).catch(() => null);
  return page.$$eval("#errors .banner", (bs) => bs.map((b) => b.textContent));
}

await drive(async (browser, out) => {
  const { page, consoleErrors } = await openPage(browser, base, token);
  out.r1 = await start(page, { command: "sh -c 'echo one > f.txt; cat f.txt'", thread: "pt" });
  out.out1 = await output(page, out.r1);
  out.r2 = await start(page, { command: "sh -c 'cat f.txt; echo two > f.txt'" });
  out.out2 = await output(page, out.r2);
  await page.waitForSelector('#threads tbody tr[data-thread-id="pt"]', { timeout: 30000 });
  out.threadRow = await page.$eval('#threads tbody tr[data-thread-id="pt"]',
                                   (tr) => [...tr.cells].map((c) => c.textContent));

  await page.click("#undo");
  out.undoBanners = await banner(page, "undone:");
  out.r3 = await start(page, { command: "sh -c 'cat f.txt'" });
  out.out3 = await output(page, out.r3);

  await page.fill("#fork-as", "pt-fork");
  await page.click("#fork");
  out.forkBanners = await banner(page, "forked as pt-fork");
  out.threadField = await page.inputValue("#thread");
  out.r4 = await start(page, { command: "sh -c 'cat f.txt; echo more >> f.txt'" });
  out.out4 = await output(page, out.r4);
  await page.waitForSelector('#threads tbody tr[data-thread-id="pt-fork"]', { timeout: 30000 }).catch(() => null);
  // a click on a thread shows its latest run
  await page.click('#threads tbody tr[data-thread-id="pt"]');
  await page.waitForFunction((r) => document.querySelector("#run-title").textContent === r,
                             out.r3, { timeout: 30000 }).catch(() => null);
  out.runUndoneShown = await page.$eval(`#runs tbody tr[data-run-id="${out.r2}"]`,
                                        (tr) => tr.cells[1].textContent).catch(() => "");
  out.title = await page.textContent("#run-title");
  await page.screenshot({ path: `${shots}/threads.png`, fullPage: true });
  out.layout = await layoutChecks(page);
  out.consoleErrors = consoleErrors;
});
