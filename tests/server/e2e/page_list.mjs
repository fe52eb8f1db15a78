// The run list: dates on runs of other days, "Show older runs" pages, the page's own clock.
// usage: node page_list.mjs <app url> <token> <screenshot dir>; prints a JSON summary.

import { drive, openPage } from "./page_lib.mjs";

const [base, token, shots] = process.argv.slice(2);

const rows = (page) => page.$$eval("#runs tbody tr", (trs) => trs.map((tr) => ({
  id: tr.dataset.runId, when: tr.querySelector("td.when").textContent,
  title: tr.querySelector("td.when").title })));

await drive(async (browser, out) => {
  const { page, consoleErrors } = await openPage(browser, base, token);
  await page.waitForFunction(() => document.querySelectorAll("#runs tbody tr").length > 0,
                             null, { timeout: 15000 });
  out.first = await rows(page);
  out.moreVisible = await page.isVisible("#more-runs");
  out.moreText = await page.textContent("#more-runs");
  // the browser's own rendering of an old run's day, to compare with
  out.expectedDay = await page.evaluate(() => new Date(Date.UTC(2024, 2, 5, 12)).toLocaleDateString(
    undefined, { month: "short", day: "numeric", year: "numeric" }));
  await page.screenshot({ path: `${shots}/run-list.png`, fullPage: true });
  await page.click("#more-runs");
  await page.waitForFunction((n) => document.querySelectorAll("#runs tbody tr").length > n,
                             out.first.length, { timeout: 15000 });
  out.second = await rows(page);
  out.moreVisibleAfter = await page.isVisible("#more-runs");
  await page.screenshot({ path: `${shots}/run-list-more.png`, fullPage: true });
  out.consoleErrors = consoleErrors;
});
