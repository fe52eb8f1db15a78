// The API reference page (/docs, /redoc) in headless Chromium.
// usage: node docs.mjs <app url> <token> <screenshot dir>; prints a JSON summary.

import { drive, launch } from "./page_lib.mjs";

const [base, token, shots] = process.argv.slice(2);

async function open(browser, path, viewport) {
  const page = await browser.newPage({ viewport, extraHTTPHeaders: { Authorization: `Bearer ${token}` } });
  const errors = [];
  const requests = [];
  page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("request", (r) => requests.push(r.url()));
  await page.goto(`${base}${path}`);
  await page.waitForSelector("body[data-loaded]", { timeout: 20000 });
  return { page, errors, requests };
}

await drive(async (browser, out) => {
  const { page, errors, requests } = await open(browser, "/docs", { width: 1200, height: 900 });
  out.operations = Number(await page.getAttribute("body", "data-loaded"));
  out.toc = await page.$$eval("#toc a", (as) => as.map((a) => a.textContent));
  out.title = await page.title();
  out.startRunFields = await page.$$eval("article h3", (hs) => hs.map((h) => h.textContent));
  await page.screenshot({ path: `${shots}/docs.png`, fullPage: false });
  out.errors = errors;
  out.foreignRequests = requests.filter((u) => !u.startsWith(new URL(base).origin));
  const phone = await open(browser, "/redoc", { width: 375, height: 740 });
  out.redocOperations = Number(await phone.page.getAttribute("body", "data-loaded"));
  out.phoneOverflow = await phone.page.evaluate(() => document.documentElement.scrollWidth > window.innerWidth);
  await phone.page.screenshot({ path: `${shots}/redoc-phone.png` });
  out.phoneErrors = phone.errors;
});
