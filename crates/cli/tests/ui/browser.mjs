// Drives Baton's web UI in Debian's Chromium through playwright-core (installed by
// scripts/test under .peers/npm): signs in with a token, starts a run through the API,
// watches its timeline update without a reload, approves it from the inbox in a second
// tab, sees the first tab show it completed with its output rendered, and looks at the
// scenarios; a screenshot of each page goes to OUT. Prints one JSON line of what it saw.
//
//   node browser.mjs URL TOKEN OUT PEERS_NPM
import { createRequire } from 'module';

const [url, token, out, peers] = process.argv.slice(2);
const require = createRequire(`${peers}/`);
const { chromium } = require('playwright-core');

const seen = { errors: [] };
const browser = await chromium.launch({
  executablePath: process.env.BATON_CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  page.on('pageerror', (e) => seen.errors.push(String(e)));
  page.on('console', (m) => { if (m.type() === 'error') seen.errors.push(m.text()); });

  // Signing in: the token goes in a form and comes back as an HttpOnly cookie.
  await page.goto(`${url}/#/login`);
  await page.fill('#token', 'baton_not_a_token');
  await page.click('#login-button');
  await page.waitForSelector('#login-error:not(:empty)');
  seen.bad_login = await page.textContent('#login-error');
  // The refused token's 401 is the one error the page may have logged.
  seen.errors = seen.errors.filter((e) => !e.includes('status of 401'));
  await page.fill('#token', token);
  await page.click('#login-button');
  await page.waitForSelector('#runs-table');
  seen.cookie_visible_to_scripts = await page.evaluate(() => document.cookie.includes('baton_session'));
  const cookies = await context.cookies();
  const session = cookies.find((c) => c.name === 'baton_session');
  seen.cookie = session ? { httpOnly: session.httpOnly, sameSite: session.sameSite } : null;

  // A run started through the API appears in the list.
  const started = await fetch(`${url}/runs`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ scenario: 'release_notes', input: 'the changes of this week' }),
  });
  const run = (await started.json()).run_id;
  seen.run = run;
  await page.waitForSelector(`#runs-table tr[data-run="${run}"]`, { timeout: 30000 });
  await page.screenshot({ path: `${out}/runs.png`, fullPage: true });

  // The run page: its timeline fills in as events arrive, the graph marks where it is.
  await page.goto(`${url}/#/runs/${run}`);
  await page.waitForSelector('#timeline li.ev-approval_requested', { timeout: 30000 });
  seen.graph_current = await page.getAttribute('#graph g.current', 'data-level');
  seen.visited = await page.$$eval('#graph g.visited', (gs) => gs.map((g) => g.getAttribute('data-level')));
  const before = await page.$$eval('#timeline li', (lis) => lis.length);
  await page.screenshot({ path: `${out}/run-paused.png`, fullPage: true });
  const navigations = [];
  page.on('framenavigated', (f) => { if (f === page.mainFrame()) navigations.push(f.url()); });

  // The inbox, in a second tab: approve with a comment.
  const inbox = await context.newPage();
  inbox.on('pageerror', (e) => seen.errors.push(String(e)));
  await inbox.goto(`${url}/#/inbox`);
  const card = `.card[data-run="${run}"]`;
  await inbox.waitForSelector(`${card} button.approve`, { timeout: 30000 });
  seen.inbox_question = await inbox.textContent(`${card} pre`);
  await inbox.screenshot({ path: `${out}/inbox.png`, fullPage: true });
  await inbox.fill(`${card} textarea.comment`, 'ship it');
  await inbox.click(`${card} button.approve`);
  await inbox.waitForSelector(`${card}`, { state: 'detached', timeout: 30000 });

  // The first tab, never reloaded, shows the decision, the end and the output.
  await page.waitForSelector('#timeline li.ev-scenario_finished', { timeout: 30000 });
  await page.waitForSelector('h1 .status-completed', { timeout: 30000 });
  await page.waitForSelector('#output .output h2', { timeout: 30000 });
  seen.after = await page.$$eval('#timeline li', (lis) => lis.length);
  // The publish level's answer streamed in while the page watched.
  seen.deltas = Number(await page.getAttribute('#timeline', 'data-deltas') || 0);
  seen.before = before;
  seen.reloaded = navigations.length > 0;
  seen.decision = await page.textContent('#timeline li.ev-approval_decided');
  seen.output_headings = await page.$$eval('#output h2', (hs) => hs.map((h) => h.textContent));
  seen.cost_rows = await page.$$eval('#main table tbody tr', (rs) => rs.length);
  await page.screenshot({ path: `${out}/run-completed.png`, fullPage: true });

  // A question, answered through a form made from its schema.
  const asked = await fetch(`${url}/runs`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ scenario: 'asker', input: 'the shed' }),
  });
  seen.asker = (await asked.json()).run_id;
  await inbox.goto(`${url}/#/inbox`);
  const question = `.card[data-run="${seen.asker}"]`;
  await inbox.waitForSelector(`${question} select[name="colour"]`, { timeout: 30000 });
  seen.question = await inbox.textContent(`${question} pre`);
  await inbox.selectOption(`${question} select[name="colour"]`, '"blue"');
  await inbox.screenshot({ path: `${out}/question.png`, fullPage: true });
  await inbox.click(`${question} button.answer`);
  await inbox.waitForSelector(question, { state: 'detached', timeout: 30000 });

  // Scenarios: the list, one graph, a file checked.
  await page.goto(`${url}/#/scenarios`);
  await page.waitForSelector('#scenarios-table');
  await page.fill('#validate-yaml', 'id: broken\nversion: 1\nlevels: []\nbogus: 1\n');
  await page.click('#validate');
  await page.waitForSelector('#validate-result .diag');
  seen.diagnostics = await page.$$eval('#validate-result .diag', (ds) => ds.map((d) => d.textContent));
  await page.screenshot({ path: `${out}/scenarios.png`, fullPage: true });
  await page.goto(`${url}/#/scenarios/release_notes`);
  await page.waitForSelector('svg.graph g[data-level="sign_off"]');
  seen.scenario_levels = await page.$$eval('svg.graph g[data-level]', (gs) => gs.length);
  await page.screenshot({ path: `${out}/scenario.png`, fullPage: true });
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
