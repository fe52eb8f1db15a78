// What the page drivers (page.mjs, page_agent.mjs) share: Chromium, the token, starting a
// run from the form, reading what the page shows.

import { chromium } from "playwright-core";

export const HOSTILE = "<img src=x onerror=window.pwned=1></script><script>window.pwned=1</script>";

// Run `body(browser, out)` in a fresh Chromium; print `out` (the JSON summary) at the end.
export async function drive(body) {
  const browser = await launch();
  const out = {};
  try {
    await body(browser, out);
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}

// A fresh browser the size of a phone, showing run `id` (and its thread).
export async function onPhone(browser, base, token, id) {
  const phone = await openPage(browser, base, token, { width: 375, height: 740 });
  await phone.page.evaluate((i) => { location.hash = `#run=${i}`; }, id);
  return phone;
}

export async function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--no-first-run", "--disable-sync"],
  });
}

// A page of `base` (the app's page URL) with the token given; console errors collected.
export async function openPage(browser, base, token, viewport = { width: 1200, height: 800 }) {
  const page = await browser.newPage({ viewport, isMobile: viewport.width < 500, hasTouch: viewport.width < 500 });
  const consoleErrors = [];
  page.on("console", (m) => { if (m.type() === "error") consoleErrors.push(m.text()); });
  page.on("pageerror", (e) => consoleErrors.push(String(e)));
  await page.goto(`${base}/`);
  await page.waitForSelector("#token-form:not([hidden])", { timeout: 15000 });
  await page.fill("#token", token);
  await page.click("#token-form button");
  return { page, consoleErrors };
}

export async function title(page) { return page.textContent("#run-title"); }

// Start a run from the form and wait until the page shows it; its run id. Without
// `thread` the thread field stays as it is.
export async function start(page, fields) {
  const before = await title(page);
  if (fields.command !== undefined) {
    await page.check("#kind-command");
    await page.fill("#command", fields.command);
  } else {
    await page.check("#kind-agent");
    if (fields.harness) await page.selectOption("#harness", fields.harness);
    await page.fill("#model", fields.model || "");
    await page.fill("#prompt", fields.prompt);
  }
  if (fields.thread !== undefined) await page.fill("#thread", fields.thread);
  await page.click("#start");
  await page.waitForFunction((prev) => {
    const t = document.querySelector("#run-title").textContent;
    return t && t !== prev && document.querySelector(`#transcript section[data-run-id="${t}"]`);
  }, before, { timeout: 30000 });
  return title(page);
}

export const turn = (id) => `#transcript section[data-run-id="${id}"]`;

export async function waitEnded(page, id, timeout = 60000) {
  await page.waitForSelector(`${turn(id)} .banner`, { state: "attached", timeout });
}

export async function stats(page, id) {
  return page.evaluate((i) => window.corral.runs[i], id);
}

export async function shownOffsets(page) {
  return page.$$eval("#events li", (lis) => lis.map((li) => Number(li.dataset.offset)));
}

// Every form control and button has a name a screen reader reads; the page is no wider
// than the viewport (nothing to scroll sideways).
export async function layoutChecks(page) {
  return page.evaluate(() => {
    const unnamed = [];
    for (const node of document.querySelectorAll("input, select, textarea, button, summary")) {
      if (node.closest("[hidden]") || node.type === "hidden") continue;
      const named = (node.labels && node.labels.length) || node.getAttribute("aria-label")
        || (["BUTTON", "SUMMARY"].includes(node.tagName) && node.textContent.trim());
      if (!named) unnamed.push(node.outerHTML.slice(0, 80));
    }
    return { unnamed, scrollWidth: document.documentElement.scrollWidth,
             width: window.innerWidth };
  });
}

// What hostile text could have made: elements or a ran script.
export async function hostileChecks(page) {
  return page.evaluate(() => ({
    images: document.querySelectorAll("main img").length,
    scripts: document.querySelectorAll("main script").length,
    pwned: window.pwned === 1,
  }));
}
