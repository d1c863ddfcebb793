// Drives the oncebox serve console in the system's headless Chromium (never a downloaded one):
// signs in with the operator's token (the browser's own answer to the console's Basic challenge),
// opens the pending approval from the overview, reads the params and the fingerprint the page
// shows, approves, and screenshots every page; then, still signed in, opens PROBE_URL, a page
// another process serves on another port of the same host, which records what the browser sent.
//
//   node approve.mjs BASE_URL TOKEN ARTIFACTS_DIR RUN_ID PROBE_URL
//
// Prints one JSON line of what it saw; exits 1 (with the reason on stderr) if anything fails.

import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const [base, token, artifacts, runId, probe] = process.argv.slice(2);
if (!base || !token || !artifacts || !runId || !probe) {
  console.error('usage: node approve.mjs BASE_URL TOKEN ARTIFACTS_DIR RUN_ID PROBE_URL');
  process.exit(2);
}
mkdirSync(artifacts, { recursive: true });

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
});

const screenshots = [];
const statuses = {};

// Opens a page (or takes the one a click led to), checks it answered 200, and screenshots it.
async function shot(page, name, path) {
  if (path) {
    const response = await page.goto(base + path);
    statuses[name] = response ? response.status() : 0;
    if (statuses[name] !== 200) throw new Error(`${path} answered ${statuses[name]}`);
  }
  const file = join(artifacts, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  screenshots.push(file);
}

let page;
try {
  // A fresh context: no credentials from any earlier run. The browser answers the console's
  // challenge with these, as a person types them into its dialog.
  const context = await browser.newContext({
    viewport: { width: 1200, height: 900 },
    httpCredentials: { username: 'operator', password: token },
  });
  page = await context.newPage();
  page.setDefaultTimeout(30000);

  await page.goto(`${base}/login?next=/`);
  await page.waitForURL((url) => url.pathname === '/');
  const signedIn = (await page.textContent('header nav')).includes('Signed in');
  await shot(page, 'overview');

  await shot(page, 'approvals', '/approvals');

  // As a person would: from the overview's list of pending approvals to the request.
  await page.goto(base + '/');
  await Promise.all([
    page.waitForURL((url) => url.pathname.startsWith('/approvals/')),
    page.click('table a:text("Review")'),
  ]);
  const key = await page.getAttribute('section.approval', 'data-key');
  const paramsText = await page.textContent('section.approval pre.params');
  const params = JSON.parse(paramsText);
  // Where the browser draws two groups of digits of the params: in stored order, left to right,
  // even beside right-to-left letters (which would otherwise reorder them).
  const drawn = await page.evaluate(() => {
    const pre = document.querySelector('section.approval pre.params');
    const text = pre.firstChild;
    const left = (needle) => {
      const at = text.textContent.indexOf(needle);
      if (at < 0) return null;
      const range = document.createRange();
      range.setStart(text, at);
      range.setEnd(text, at + needle.length);
      return range.getBoundingClientRect().left;
    };
    return { first: left('1234'), second: left('5678') };
  });
  const fingerprint = (await page.textContent('[data-testid=fingerprint]')).trim();
  const consequence = (await page.textContent('[data-testid=consequence]')).trim();
  const shownFingerprint = await page.inputValue('form.decide input[name=fingerprint]');
  console.error(`params shown: ${paramsText}`);
  console.error(`fingerprint shown: ${fingerprint}`);
  await shot(page, 'approval');

  await page.fill('form.decide input[name=by]', 'console-test');
  await page.fill('form.decide input[name=note]', 'address checked against the order');
  await Promise.all([page.waitForURL((url) => url.searchParams.has('flash')), page.click('button.approve')]);
  const flash = (await page.textContent('.flash')).trim();
  const stateAfter = (await page.textContent('section.approval h2 .badge')).trim();
  await shot(page, 'approved');

  await shot(page, 'unknowns', '/unknowns');
  await shot(page, 'runs', '/runs');
  await Promise.all([
    page.waitForURL((url) => url.pathname.startsWith('/runs/')),
    page.click(`table a:text-is(${JSON.stringify(runId)})`),
  ]);
  const timeline = await page.locator('ol.timeline > li').count();
  await shot(page, 'run');
  await shot(page, 'tools', '/tools');

  // Another port of the same host: what would a process listening there receive?
  const probed = await page.goto(probe);
  statuses.probe = probed ? probed.status() : 0;

  console.log(
    JSON.stringify({
      signed_in: signedIn,
      key,
      params,
      digits_drawn_in_stored_order: drawn.first !== null && drawn.second !== null && drawn.first < drawn.second,
      fingerprint,
      form_fingerprint: shownFingerprint,
      consequence,
      flash,
      state_after: stateAfter,
      timeline_steps: timeline,
      statuses,
      screenshots,
    }),
  );
  await browser.close();
} catch (error) {
  console.error(`approve.mjs: ${error && error.stack ? error.stack : error}`);
  if (page) console.error(`at ${page.url()}:\n${await page.textContent('main').catch(() => '')}`);
  await browser.close().catch(() => {});
  process.exit(1);
}
