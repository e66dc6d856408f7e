// The explorer page in a real browser: headless Chromium (Debian's) driven by puppeteer-core.
// Run by tests/explorer_test.py, which starts `qkv serve` and passes one JSON argument:
//   {"modules": npm node_modules dir, "chromium": path, "url": server address, "task": "lm" | "translate",
//    "shots": screenshot dir, "name": prefix, "changed": {"q": [...], "output": [...] from `qkv attend`}}
// Prints "PASS what" / "FAIL what  detail" lines; exit status 1 if any failed.
"use strict";
const path = require("path");

const args = JSON.parse(process.argv[2]);
const puppeteer = require(path.join(args.modules, "puppeteer-core"));
let passed = 0, failed = 0;
function report(ok, what, detail) {
  if (ok) passed++; else failed++;
  console.log((ok ? "PASS " : "FAIL ") + args.name + ": " + what + (detail !== undefined ? "  " + String(JSON.stringify(detail)).slice(0, 400) : ""));
}
const text = (page, sel) => page.$eval(sel, (e) => e.textContent);

async function waitText(page, sel, want, ms) {
  try {
    await page.waitForFunction((s, w) => { const e = document.querySelector(s); return e && e.textContent === w; }, { timeout: ms || 15000 }, sel, want);
    return true;
  } catch (e) { return false; }
}

async function main() {
  const browser = await puppeteer.launch({
    executablePath: args.chromium, headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"],
  });
  const errors = [];
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: 1280, height: 900 });
    page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
    page.on("pageerror", (e) => errors.push(String(e)));
    page.on("requestfailed", (r) => errors.push("request failed: " + r.url()));
    await page.goto(args.url, { waitUntil: "load" });

    // ---- the worked example ----
    report(await waitText(page, "#ex-weights", "0.4223 / 0.1554 / 0.4223"), "the worked example's weights are 0.4223 / 0.1554 / 0.4223", await text(page, "#ex-weights"));
    report(await waitText(page, "#ex-output", "5.912 / 4.088"), "the worked example's output is 5.912 / 4.088", await text(page, "#ex-output"));
    // change q and compare with `qkv attend` on the same numbers; a burst of changes first, whose
    // answers may come back in any order: the page must show the last one's
    for (const v of [3, 1, 2.5, 0.7, 4]) {
      await page.$eval('input[data-name="q0"]', (e, x) => { e.value = String(x); e.dispatchEvent(new Event("change")); }, v);
    }
    for (let d = 0; d < args.changed.q.length; d++) {
      await page.$eval('input[data-name="q' + d + '"]', (e, v) => { e.value = String(v); e.dispatchEvent(new Event("change")); }, args.changed.q[d]);
    }
    const want = args.changed.output.map((x) => x.toFixed(3)).join(" / ");
    report(await waitText(page, "#ex-output", want), "q changed to " + JSON.stringify(args.changed.q) + ": the page shows qkv attend's output " + want, await text(page, "#ex-output"));
    const exact = await page.evaluate(() => window.qkvExplorer.example.qkv.output);
    report(exact.every((x, i) => Math.abs(x - args.changed.output[i]) <= 1e-6 * Math.max(1, Math.abs(args.changed.output[i]))),
      "... and the same numbers to float32 precision", { page: exact, attend: args.changed.output });
    // back to the chapter's numbers, mask the third key: renormalised, and the zeroed alternative
    await page.click("#ex-reset");
    await waitText(page, "#ex-output", "5.912 / 4.088");
    await page.click('input[data-name="mask2"]');
    report(await waitText(page, "#ex-weights", "0.7311 / 0.2689 / 0.0000"), "masking the third key renormalises to 0.7311 / 0.2689 / 0.0000", await text(page, "#ex-weights"));
    const zeroed = await text(page, "#ex-zeroed");
    report(zeroed.includes("0.4223 / 0.1554 / 0.0000") && zeroed.includes("sum 0.5777"), "zeroing without renormalising shown: sum 0.5777", zeroed);
    await page.click('input[data-name="mask2"]');
    await waitText(page, "#ex-output", "5.912 / 4.088");
    await (await page.$("#example")).screenshot({ path: path.join(args.shots, args.name + "-example.png") });

    // ---- the model on a text ----
    await page.waitForFunction(() => window.qkvExplorer.maps.length > 0 && document.querySelectorAll(".grid .cell").length > 0, { timeout: 60000 });
    const model = await page.evaluate(() => window.qkvExplorer.model);
    const L = model.layers, H = model.heads;
    const groups = args.task === "translate"
      ? [["encoder self", L.encoder], ["decoder self", L.decoder], ["decoder cross", L.decoder]]
      : [[(L.decoder ? "decoder" : "encoder") + " self", L.decoder || L.encoder]];
    for (const [g, layers] of groups) {
      const n = await page.$$eval('.grid[data-group="' + g + '"] .cell', (c) => c.length);
      report(n === layers * H, g + ": the grid has layers x heads = " + layers + " x " + H + " cells", n);
    }
    const sums = await page.evaluate(() => {
      let worst = 0, rows = 0;
      for (const m of window.qkvExplorer.maps) for (const r of m.weights) { rows++; worst = Math.max(worst, Math.abs(r.reduce((a, b) => a + b, 0) - 1)); }
      return { worst, rows, maps: window.qkvExplorer.maps.length };
    });
    report(sums.rows > 0 && sums.worst <= 1e-5, "every row of every map sums to 1 (" + sums.maps + " maps, " + sums.rows + " rows)", sums);
    if (args.task === "translate") {
      const ans = await text(page, "#answer");
      report(ans.startsWith("translation: "), "the translation is shown", ans);
      const cross = await page.evaluate(() => window.qkvExplorer.maps.filter((m) => m.kind === "cross").map((m) => [m.weights.length, m.weights[0].length]));
      const st = await page.evaluate(() => [window.qkvExplorer.tokens.length, window.qkvExplorer.sourceTokens.length]);
      report(cross.length > 0 && cross.every((s) => s[0] === st[0] && s[1] === st[1]), "cross-attention maps are target x source tokens " + JSON.stringify(st), cross[0]);
    }
    // click a cell: enlarged, in the URL, exact weights on hover
    const layer = Math.min(1, (L.decoder || L.encoder) - 1), head = Math.min(2, H - 1);
    const g0 = groups[groups.length - 1][0].split(" ");
    await page.click('.grid .cell[data-stack="' + g0[0] + '"][data-kind="' + g0[1] + '"][data-layer="' + layer + '"][data-head="' + head + '"]');
    const hash = await page.evaluate(() => location.hash);
    report(hash.includes("layer=" + layer) && hash.includes("head=" + head) && hash.includes("kind=" + g0[1]), "the chosen layer and head are in the URL", hash);
    const zoom = await page.evaluate(() => { const m = window.qkvExplorer.chosen; return { rects: document.querySelectorAll("#zoom-svg rect.w").length, want: m.weights.length * m.weights[0].length, w: m.weights[m.weights.length - 1][0] }; });
    report(zoom.rects === zoom.want, "the enlarged map has a cell per (query, key)", zoom);
    const cells = await page.$$("#zoom-svg rect.w");
    const R = await page.evaluate(() => window.qkvExplorer.chosen.weights.length);
    await cells[zoom.want - zoom.want / R].hover();  // the last row's first cell
    const tip = await text(page, "#tip");
    report(tip.endsWith(": " + String(zoom.w)), "hovering a cell shows its exact weight", { tip, weight: zoom.w });
    await (await page.$("#model")).screenshot({ path: path.join(args.shots, args.name + "-model.png") });
    // the URL brings the same map back
    await page.goto(args.url + hash, { waitUntil: "load" });
    await page.waitForFunction(() => window.qkvExplorer.chosen !== null, { timeout: 60000 });
    const back = await page.evaluate(() => { const m = window.qkvExplorer.chosen; return [m.stack, m.kind, m.layer, m.head]; });
    report(back[0] === g0[0] && back[1] === g0[1] && back[2] === layer && back[3] === head, "opening the URL again shows the same map", back);

    // ---- the next token ----
    if (args.task === "lm") {
      await page.waitForFunction(() => window.qkvExplorer.next !== null, { timeout: 30000 });
      const before = await page.evaluate(() => window.qkvExplorer.next);
      const bars = await page.$$eval("#next-bars rect.prob", (r) => r.length);
      report(bars === before.top.length && bars > 0, "the next-token chart has a bar per token (" + bars + ")", bars);
      await page.$eval("#temp", (e) => { e.value = "0.3"; e.dispatchEvent(new Event("input")); });
      await page.waitForFunction(() => window.qkvExplorer.next && Math.abs(window.qkvExplorer.next.temperature - 0.3) < 1e-9, { timeout: 15000 });
      const after = await page.evaluate(() => window.qkvExplorer.next);
      const same = after.top.every((t, i) => t.id === before.top[i].id && t.logit === before.top[i].logit);
      report(same && after.top[0].prob > before.top[0].prob && after.top.some((t, i) => t.prob !== before.top[i].prob),
        "temperature 1 -> 0.3: the same logits, sharper probabilities", { before: before.top[0], after: after.top[0] });
      let worst = 0;  // p_i / p_0 = exp((z_i - z_0) / T)
      for (const t of after.top) worst = Math.max(worst, Math.abs(t.prob / after.top[0].prob - Math.exp((t.logit - after.top[0].logit) / 0.3)));
      report(worst <= 1e-4, "the probabilities are softmax(z / T) of the logits shown", worst);
      const shown = await page.$eval("#temp-value", (e) => e.textContent);
      report(shown === "0.30", "the slider shows T = 0.30", shown);
      await (await page.$("#next")).screenshot({ path: path.join(args.shots, args.name + "-next-token.png") });
    } else {
      const shown = await page.$eval("#next-none", (e) => getComputedStyle(e).display !== "none");
      report(shown, "the next-token section says this model has none", shown);
    }

    // ---- the claims ----
    await page.waitForFunction(() => document.querySelectorAll("#claim-list .claim").length > 0, { timeout: 30000 });
    const claims = await page.$$eval("#claim-list .claim", (cs) => cs.map((c) => [c.getAttribute("data-id"), c.querySelector(".badge").textContent]));
    report(claims.length === 9 && claims.every((c) => c[1] === "holds on these numbers"), "9 claims, each holding on the live numbers", claims);
    const cost = await text(page, '#claim-list .claim[data-id="cost"]');
    report(cost.includes("16,777,216") && cost.includes("32 MiB"), "the n^2 claim: 4,096 positions, 16,777,216 scores, 32 MiB", cost.slice(0, 200));
    await (await page.$("#claims")).screenshot({ path: path.join(args.shots, args.name + "-claims.png") });
    await page.screenshot({ path: path.join(args.shots, args.name + "-page.png"), fullPage: true });
    report(errors.length === 0, "no JavaScript errors in the console", errors);
  } finally {
    await browser.close();
  }
}

main().then(() => {
  console.log(passed + " passed, " + failed + " failed");
  process.exit(failed === 0 ? 0 : 1);
}, (e) => {
  console.log("FAIL " + args.name + ": " + (e && e.stack || e));
  process.exit(1);
});
