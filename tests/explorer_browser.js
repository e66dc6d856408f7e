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

    if (args.limited) {
      // a server whose --max-attention is below the whole model's maps: the page shows fewer
      // layers instead of an error, says so, and the picker asks for the others
      await page.waitForFunction(() => window.qkvExplorer.maps.length > 0 || /error/.test(document.querySelector("#run-status").className), { timeout: 60000 });
      const st = await page.evaluate(() => ({ maps: window.qkvExplorer.maps.length, status: document.querySelector("#run-status").textContent, cls: document.querySelector("#run-status").className,
        note: document.querySelector("#pick-note").textContent, layers: [...document.querySelectorAll('#pick-layers input[data-pick="layers"]')].map((b) => b.checked),
        heads: [...document.querySelectorAll('#pick-heads input[data-pick="heads"]')].map((b) => b.checked), cells: document.querySelectorAll(".grid .cell").length }));
      const nl = st.layers.filter((x) => x).length, nh = st.heads.filter((x) => x).length;
      report(st.maps > 0 && !/error/.test(st.cls), "--max-attention below the whole model: maps shown, no error", st);
      report(nl < st.layers.length && st.cells === nl * nh && st.maps === nl * nh, "fewer layers picked (" + nl + " of " + st.layers.length + "), a cell per picked layer x head", st);
      report(/--max-attention/.test(st.note) && /showing layers/.test(st.note), "the page says why and what it shows", st.note);
      // pick the last layer alone: its maps come back
      const last = st.layers.length - 1;
      await page.$$eval('#pick-layers input[data-pick="layers"]', (bs, l) => bs.forEach((b) => { b.checked = +b.value === l; }), last);
      await page.click("#run");
      await page.waitForFunction((l) => window.qkvExplorer.maps.length > 0 && window.qkvExplorer.maps.every((m) => m.layer === l), { timeout: 60000 }, last);
      const got = await page.evaluate(() => window.qkvExplorer.maps.map((m) => m.layer));
      report(got.length === nh && got.every((l) => l === last), "picking layer " + last + " alone shows its " + nh + " heads", got);
      await (await page.$("#model")).screenshot({ path: path.join(args.shots, args.name + "-picker.png") });
      // the browser logs each refused request (400) it made while halving: 4 layers, then 2, then 1 fit
      const refused = errors.filter((e) => /status of 400/.test(e)), other = errors.filter((e) => !/status of 400/.test(e));
      report(refused.length === 2 && other.length === 0, "no JavaScript errors; the two refused sizes (4 and 2 layers) logged by the browser", errors);
      return;
    }

    // ---- the worked example ----
    report(await waitText(page, "#ex-weights", "0.4223 / 0.1554 / 0.4223"), "the worked example's weights are 0.4223 / 0.1554 / 0.4223", await text(page, "#ex-weights"));
    report(await waitText(page, "#ex-output", "5.912 / 4.088"), "the worked example's output is 5.912 / 4.088", await text(page, "#ex-output"));
    const fits = await page.$eval('input[data-name="q0"]', (i) => {
      const ctx = document.createElement("canvas").getContext("2d");
      ctx.font = getComputedStyle(i).font;
      return { value: i.value, text: ctx.measureText(i.value).width, box: i.clientWidth };
    });
    report(fits.value === "1.414214" && fits.text + 28 <= fits.box, "the query field shows √2 = 1.414214 whole (text and the spin buttons fit)", fits);
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
    const rows = await page.$$eval("#ex-steps tr", (rs) => rs.map((r) => [r.className, [...r.children].map((c) => c.textContent)]));
    report(rows[0][1][2] === "mask m_j" && rows[1][1][2] === "0" && rows[3][1][2] === "−∞" && rows[3][0] === "masked" && rows[3][1][3] === "−∞" && rows[3][1][5] === "0.0000",
      "the steps table has a mask column: 0 for the open keys, −∞ (and weight 0) for the masked one", rows);
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
    const stops = await page.$$eval("#grids svg.legend stop", (ss) => ss.map((x) => x.getAttribute("stop-color")));
    const want_stops = args.viridis.map((c) => "rgb(" + c.join(",") + ")");
    report(stops.length > 0 && JSON.stringify(stops.slice(0, want_stops.length)) === JSON.stringify(want_stops),
      "the maps have a colour key, in the palette of qkv's SVG heatmaps (viridis, src/viz/svg.cpp)", stops);
    const marks = await text(page, "#token-marks");
    report(marks.includes("␣") && marks.includes("begins a new word"), "the ␣ mark is explained", marks);
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
    const fill = await page.evaluate(() => { const r = document.querySelector("#zoom-svg rect.w"); const m = window.qkvExplorer.chosen; return [r.getAttribute("fill"), m.weights[0][0]]; });
    const vir = (w) => { const t = Math.max(0, Math.min(1, w)) * 10, k = Math.min(Math.floor(t), 9), u = t - k; return "rgb(" + args.viridis[k].map((a, i) => Math.round(a + (args.viridis[k + 1][i] - a) * u)).join(",") + ")"; };
    report(fill[0] === vir(fill[1]), "a cell's colour is the CLI's viridis of its weight", { fill: fill[0], weight: fill[1], want: vir(fill[1]) });
    report(await page.$$eval("#zoom svg.legend", (l) => l.length) === 1, "the enlarged map has its colour key");
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
    report(claims.length === 10 && claims.every((c) => c[1] === "holds on these numbers"), "10 claims, each holding on the live numbers", claims);
    const ticks = await page.$$eval('#claim-list .claim[data-id="cost"] svg text.tick', (t) => t.map((x) => x.textContent));
    report(ticks.length >= 3 && ticks.every((t) => / MiB$/.test(t)), "the n^2 chart has a labelled axis in MiB", ticks);
    const costText = await text(page, '#claim-list .claim[data-id="cost"]');
    report(/flash against float64 on 16 of the 8,192 query rows/.test(costText), "the n^2 claim checks flash's output against float64 at each n", costText.slice(0, 300));
    const curves = await page.$$eval('#claim-list .claim[data-id="norms"] svg polyline.curve', (c) => c.map((x) => [x.getAttribute("data-name"), x.getAttribute("points").split(" ").length]));
    report(curves.length === 2 && curves.every((c) => c[1] === 200), "pre-norm and post-norm: two loss curves of 200 steps", curves);
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
