// End-to-end test of the operator dashboard (GET /ui) in headless Chromium.
//
// It starts the real release binary on a free port, on a real Redis (a redis-server of its
// own on a free port; UI_TEST_STORE=embedded runs it on the embedded store instead), seeds
// pools through the API, then drives the page as an operator would: paste the token, read
// a pool's bars, disable and enable a member, search, import a list (dry run first), and
// look at the page at 1280×800 and 390×844. Screenshots land in target/ui-screenshots/.
//
// Run with `npm ci && npm test` in tests/ui after `cargo build --release`.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdirSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const BINARY = process.env.PA_BINARY || path.join(ROOT, 'target/release/proxy-allocator');
const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const SHOTS = path.join(ROOT, 'target/ui-screenshots');
const ADMIN = 'ui-test-admin-token';
// Without the background-networking flags Chromium keeps trying to reach its own services,
// which a closed network turns into long stalls.
const CHROMIUM_ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];

// The seeded pool: ids as the API canonicalises them, with their starting counts.
const EDGE = [
  ['http://8.8.8.8:3128', 7],
  ['http://1.1.1.1:8080', 4],
  ['socks5://9.9.9.9:1080', 2],
  ['dc-fra-07', 0],
];
// An id that would be markup if the page ever parsed data as HTML.
const MARKUP_ID = '<img/src/onerror=alert(1)>';

// Waits until `check` returns a truthy value; polls a condition rather than sleeping a guess.
async function eventually(check, what, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      last = await check();
      if (last) return last;
    } catch (error) {
      last = error;
    }
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what} (last: ${last})`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

async function freePort() {
  const server = net.createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address();
  server.close();
  await once(server, 'close');
  return port;
}

async function startRedis() {
  const port = await freePort();
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '',
                                        '--appendonly', 'no'], { stdio: 'ignore' });
  child.on('error', (error) => {
    console.error(`redis-server could not start (${error.message}): install it ` +
                  '(apt-get install redis-server) or set UI_TEST_STORE=embedded');
  });
  await eventually(() => new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1', () => { socket.end(); resolve(true); });
    socket.on('error', () => resolve(false));
  }), 'redis-server to accept connections');
  return { child, url: `redis://127.0.0.1:${port}` };
}

async function startService(redisUrl) {
  assert.ok(existsSync(BINARY), `${BINARY} is missing: run cargo build --release first`);
  const env = {
    PATH: process.env.PATH,
    LISTEN_ADDR: '127.0.0.1:0',
    ADMIN_TOKEN: ADMIN,
    LOG_FORMAT: 'json',
    RUST_LOG: 'warn,proxy_allocator::startup=info',
  };
  if (redisUrl) env.REDIS_URL = redisUrl;
  const child = spawn(BINARY, [], { env, stdio: ['ignore', 'pipe', 'inherit'] });
  const lines = readline.createInterface({ input: child.stdout });
  const addr = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('the service did not log its address within 10 s')), 10_000);
    child.once('exit', (code) => reject(new Error(`the service exited with ${code}`)));
    // Read the bound address from the "listening" line, then keep draining the pipe.
    lines.on('line', (line) => {
      if (!line.includes('"listening"')) return;
      const addr = JSON.parse(line).addr;
      if (addr) { clearTimeout(timer); resolve(addr); }
    });
  });
  return { child, base: `http://${addr}` };
}

describe('the operator dashboard in Chromium', () => {
  let redis = null;
  let service;
  let browser;
  let page;
  const problems = [];
  const foreignRequests = [];

  // `PATCH_JSON` sends a JSON merge patch (PATCH with application/merge-patch+json).
  async function call(method, route, body) {
    const patch = method === 'PATCH_JSON';
    const init = { method: patch ? 'PATCH' : method, headers: { Authorization: `Bearer ${ADMIN}` } };
    if (body !== undefined) {
      init.headers['Content-Type'] = patch ? 'application/merge-patch+json' : 'application/json';
      init.body = JSON.stringify(body);
    }
    const response = await fetch(service.base + route, init);
    const text = await response.text();
    assert.ok(response.ok, `${method} ${route}: ${response.status} ${text}`);
    return text ? JSON.parse(text) : null;
  }
  const member = async (pool, id) =>
    (await call('GET', `/pools/${pool}/members?limit=1000`)).members.find((m) => m.member === id);
  const bars = () => page.locator('#chart g.bar-row');
  const rowOf = (id) => page.locator('#members tbody tr').filter({ has: page.getByText(id, { exact: true }) });

  before(async () => {
    if (process.env.UI_TEST_STORE !== 'embedded') redis = await startRedis();
    service = await startService(redis && redis.url);

    await call('PUT', '/pools/edge', { restore: 'minimum', rules: { schemes: ['http', 'https', 'socks5'] } });
    for (const [id, assignments] of EDGE) {
      const seeded = await call('POST', '/pools/edge/members', { members: [id], assignments });
      assert.deepEqual(seeded.added, [id]);
    }
    await call('PUT', '/pools/leases', { policy: 'least-in-flight', rules: { allow_private: true } });
    const seeded = await call('POST', '/pools/leases/members', { members: ['10.0.0.1:3128', '10.0.0.2:3128', MARKUP_ID] });
    assert.deepEqual(seeded.rejected, []);
    const leased = await fetch(`${service.base}/pools/leases/assign`, { method: 'POST' });
    assert.equal(leased.status, 200);

    browser = await chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS });
    const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    page = await context.newPage();
    page.on('console', (message) => {
      // The first test offers a wrong token on purpose, the settings test a patch the
      // service refuses; Chromium logs the 401 and the 400 they get.
      const expected = /the server responded with a status of 40[01]/.test(message.text());
      if (!expected && (message.type() === 'error' || message.type() === 'warning')) problems.push(message.text());
    });
    page.on('pageerror', (error) => problems.push(String(error)));
    page.on('request', (request) => {
      const url = request.url();
      if (!url.startsWith(service.base + '/') && !url.startsWith('data:')) foreignRequests.push(url);
    });
  });

  after(async () => {
    if (browser) await browser.close();
    for (const child of [service && service.child, redis && redis.child]) {
      if (child && child.exitCode === null) {
        child.kill('SIGTERM');
        await once(child, 'exit');
      }
    }
  });

  it('asks for the token and explains a refused one', async () => {
    await page.goto(`${service.base}/ui`);
    assert.equal(await page.title(), 'proxy-allocator · dashboard');
    assert.equal(await page.evaluate(() => document.activeElement.id), 'token');
    const hint = page.locator('#token-hint');
    assert.equal((await hint.textContent()).replace(/\s+/g, ' '),
                 "Where is it? The service's ADMIN_TOKEN; started without one, the service generated " +
                 'one, and its first log line says “generated the admin token …”.');
    assert.ok(await hint.isVisible(), 'the hint shows while there is no token');
    await page.getByLabel('Admin token').fill('not-the-token');
    await page.getByRole('button', { name: 'Use token' }).click();
    await page.locator('#banner').getByText('401 unauthorized').waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.length), 0, 'a refused token is not kept');
    assert.equal(await page.evaluate(() => document.activeElement.id), 'token');
  });

  it('keeps the admin token in session storage, never in the URL, and lists every pool', async () => {
    await page.getByLabel('Admin token').fill(ADMIN);
    await page.getByLabel('Admin token').press('Enter');
    await page.locator('#pool-list button', { hasText: 'edge' }).waitFor();
    assert.equal(await page.locator('#banner').textContent(), '');
    assert.ok(!(await page.locator('#token-hint').isVisible()), 'the hint goes once a token is set');
    assert.deepEqual(await page.locator('#pool-list .pool-name').allTextContents(), ['edge', 'leases']);
    assert.equal(await page.locator('#pool-list li[data-pool="edge"] .pool-numbers').textContent(),
                 'least-used · 4 eligible · 0 ineligible · 0 in flight · spread 7');
    assert.equal(await page.locator('#pool-list li[data-pool="leases"] .pool-numbers').textContent(),
                 'least-in-flight · 3 eligible · 0 ineligible · 1 in flight · spread 1');
    assert.equal(await page.evaluate(() => sessionStorage.getItem('proxy-allocator.admin-token')), ADMIN);
    assert.ok(!page.url().includes(ADMIN));
    assert.equal(await page.getByLabel('Admin token').inputValue(), '', 'the field is emptied');
  });

  it('finds pools by the start of their name and lists every pool again once the search is cleared', async () => {
    const names = () => page.locator('#pool-list .pool-name').allTextContents();
    const search = page.getByLabel('Pools whose name starts with');
    await search.fill('le');
    await eventually(async () => (await names()).join() === 'leases', 'only the pool starting with "le"');
    assert.equal(await page.locator('#more-pools').isHidden(), true);
    await search.fill('nope');
    await page.locator('#pool-list li.muted', { hasText: 'No pool starts with that.' }).waitFor();
    assert.deepEqual(await names(), []);
    await search.fill('');
    await eventually(async () => (await names()).join() === 'edge,leases', 'every pool again');
  });

  it('draws one bar per member of the chosen pool, the busiest first', async () => {
    await page.locator('#pool-list button', { hasText: 'edge' }).click();
    await eventually(async () => (await bars().count()) === EDGE.length, 'four bars');
    assert.deepEqual(await bars().evaluateAll((gs) => gs.map((g) => g.dataset.member)), EDGE.map(([id]) => id));
    assert.deepEqual(await page.locator('#chart .bar-label').allTextContents(), EDGE.map(([id]) => id));
    assert.deepEqual(await bars().evaluateAll((gs) => gs.map((g) => g.dataset.state)), Array(4).fill('eligible'));
    assert.deepEqual(await page.locator('#pool-facts dd').allTextContents(), ['4', '0', '0', '7', '0 / 7', '0']);
    assert.ok(page.url().endsWith('#pool=edge'));
    assert.equal(await page.locator('#members tbody tr').count(), EDGE.length);
  });

  it('follows assignments live, without a reload', async () => {
    const assigned = await (await fetch(`${service.base}/pools/edge/assign`, { method: 'POST' })).json();
    assert.equal(assigned.proxy, 'dc-fra-07');
    await eventually(async () => (await rowOf('dc-fra-07').locator('td').nth(2).textContent()) === '1',
                     'the table to show the new count');
    await eventually(async () => (await page.locator('#chart g[data-member="dc-fra-07"] .bar-value').textContent()) === '1',
                     'the bar to show the new count');
  });

  it('disables a member with a reason, and the bar and the row turn ineligible', async () => {
    await page.getByLabel('Reason when disabling').fill('timeouts upstream');
    await page.getByRole('button', { name: 'Disable http://1.1.1.1:8080' }).click();
    await page.locator('#result').getByText('Disabled http://1.1.1.1:8080 (reason: timeouts upstream).').waitFor();
    const stored = await member('edge', 'http://1.1.1.1:8080');
    assert.equal(stored.state, 'ineligible');
    assert.equal(stored.reason, 'timeouts upstream');
    const row = rowOf('http://1.1.1.1:8080');
    await eventually(async () => (await row.getAttribute('data-state')) === 'ineligible', 'the row to turn ineligible');
    assert.match(await row.locator('td').nth(4).textContent(), /^reason: timeouts upstream · off for \d+ s$/);
    assert.equal(await row.getByRole('button').textContent(), 'Enable');
    const bar = page.locator('#chart g[data-member="http://1.1.1.1:8080"]');
    assert.equal(await bar.getAttribute('data-state'), 'ineligible');
    assert.equal(await bar.locator('rect').getAttribute('class'), 'bar ineligible');
    assert.equal(await bar.locator('.bar-value').textContent(), '4 · off', 'marked in text, not by colour alone');
    assert.equal(await page.locator('#pool-list li[data-pool="edge"] .pool-numbers').textContent(),
                 'least-used · 3 eligible · 1 ineligible · 0 in flight · spread 6');
    // The action moved the focus nowhere: the same button, now "Enable", still has it.
    assert.equal(await page.evaluate(() => document.activeElement.getAttribute('aria-label')),
                 'Enable http://1.1.1.1:8080');
  });

  it('enables it under the restore policy it shows, or an override', async () => {
    assert.match(await page.locator('#restore-help').textContent(), /returns enabled members under “minimum”/);
    assert.equal(await page.locator('#restore option[value=""]').textContent(), "the pool's policy: minimum");
    await page.getByLabel('Restore policy when enabling').selectOption('history');
    await page.getByRole('button', { name: 'Enable http://1.1.1.1:8080' }).press('Enter');
    await page.locator('#result').getByText('Enabled under restore “history”: http://1.1.1.1:8080 (count 4 → 4).').waitFor();
    assert.equal((await member('edge', 'http://1.1.1.1:8080')).state, 'eligible');
    await eventually(async () => (await rowOf('http://1.1.1.1:8080').getAttribute('data-state')) === 'eligible',
                     'the row to turn eligible');
    assert.equal(await page.locator('#chart g[data-member="http://1.1.1.1:8080"]').getAttribute('data-state'), 'eligible');
  });

  it('filters the member table with the search box', async () => {
    await page.getByLabel('Search members').fill('socks5');
    assert.deepEqual(await page.locator('#members tbody tr:not([hidden]) td:first-child').allTextContents(),
                     ['socks5://9.9.9.9:1080']);
    assert.equal(await page.locator('#member-count').textContent(), '1 of 4 members match.');
    await page.getByLabel('Search members').fill('');
    assert.equal(await page.locator('#members tbody tr:not([hidden])').count(), 4);
  });

  it('imports a list only after a dry run of that list, and shows both reports', async () => {
    const list = '# from the test\n8.8.4.4:3128\n8.8.4.4:3128\n10.0.0.1:8080\nnot a proxy\nhttp://8.8.8.8:3128\n';
    await page.getByLabel('Candidates, one per line').fill(list);
    assert.ok(await page.getByRole('button', { name: 'Import', exact: true }).isDisabled());
    await page.getByRole('button', { name: 'Dry run' }).click();
    const report = page.locator('#import-report');
    await report.getByText('Dry run: nothing was written').waitFor();
    assert.deepEqual(await report.locator('dd').allTextContents(), ['1', '1', '2', '1', '2']);
    assert.equal(await report.locator('p').textContent(), 'Rejected by reason: private_address 1, unparsable 1.');
    assert.deepEqual(await report.locator('tbody td').allTextContents(),
                     ['4', '10.0.0.1:8080', 'private_address', '5', 'not a proxy', 'unparsable']);
    assert.equal(await member('edge', 'http://8.8.4.4:3128'), undefined, 'a dry run writes nothing');
    assert.equal(await bars().count(), 4);

    await page.getByRole('button', { name: 'Import', exact: true }).click();
    await report.getByText('Imported').waitFor();
    assert.equal(await page.locator('#result .outcome p').textContent(), 'Imported into edge: 1 added, 1 already members.');
    assert.equal((await member('edge', 'http://8.8.4.4:3128')).state, 'eligible');
    await eventually(async () => (await bars().count()) === 5, 'a fifth bar');
    assert.ok(await page.getByRole('button', { name: 'Import', exact: true }).isDisabled(), 'one import per dry run');
  });

  it("edits the chosen pool's settings with a merge patch, and a refused patch changes nothing", async () => {
    const before = (await call('GET', '/pools/edge')).config;
    assert.equal(before.rules.allow_private, false);
    await page.getByLabel('Change (JSON merge patch)').fill('{"rules": {"allow_private": true}}');
    await page.getByRole('button', { name: 'Apply' }).click();
    const result = page.locator('#settings-result .outcome p');
    await eventually(async () => (await result.textContent()) ===
      'Saved: the settings the patch named changed, the others stayed.', 'the saved message');
    const after = (await call('GET', '/pools/edge')).config;
    assert.deepEqual(after, { ...before, rules: { ...before.rules, allow_private: true } },
                     'only the named setting changed');
    assert.deepEqual(JSON.parse(await page.locator('#settings-current').textContent()), after);

    await page.getByLabel('Change (JSON merge patch)').fill('{"restore": "sometimes"}');
    await page.getByRole('button', { name: 'Apply' }).click();
    await eventually(async () => (await page.locator('#settings-result .outcome.failed p').textContent()) ===
      'Not changed: invalid_json (400): unknown variant `sometimes`, expected one of `minimum`, `history`, `zero`',
      'the refusal');
    assert.deepEqual((await call('GET', '/pools/edge')).config, after, 'a refused patch changes nothing');

    await page.getByLabel('Change (JSON merge patch)').fill('[1, 2]');
    await page.getByRole('button', { name: 'Apply' }).click();
    await eventually(async () => (await page.locator('#settings-result .outcome.failed p').textContent()) ===
      'A merge patch is a JSON object, such as {"max_in_flight": 4}.', 'the page refusing an array');
    await call('PATCH_JSON', '/pools/edge', { rules: { allow_private: false } });
  });

  it('shows ids that look like markup as text, and in-flight leases', async () => {
    await page.locator('#pool-list button', { hasText: 'leases' }).click();
    await eventually(async () => (await bars().count()) === 3, 'three bars');
    assert.equal(await page.locator('#members img, #chart img').count(), 0, 'no element made from an id');
    await rowOf(MARKUP_ID).waitFor();
    assert.equal(await page.locator(`#chart g[data-member="${MARKUP_ID}"] .bar-label`).textContent(), MARKUP_ID);
    assert.deepEqual(await page.locator('#pool-facts dt').allTextContents(),
                     ['Eligible', 'Ineligible', 'In flight', 'Spread (max − min)', 'Fewest / most',
                      'Assignments handed out', 'Abandoned leases', 'Max in flight']);
    assert.equal(await page.locator('#pool-facts dd').nth(2).textContent(), '1');
    const abandoned = page.locator('#abandoned-help');
    assert.ok(await abandoned.isVisible(), 'the help beside the abandoned leases');
    assert.equal((await abandoned.textContent()).replace(/\s+/g, ' ').trim(),
                 'Abandoned leases: leases their worker never released. The service reclaimed each one once ' +
                 'its ttl ran out; its member counted as busy until then.');
    assert.match(await page.locator('#chart .bar-value').first().textContent(), /^1 · 1 in flight$/);
  });

  it('labels every control, and reaches them from the keyboard', async () => {
    const unlabelled = await page.evaluate(() => [...document.querySelectorAll('input, select, textarea, button')]
      .filter((control) => !control.closest('[hidden]'))
      .filter((control) => !(control.labels && control.labels.length) && !control.getAttribute('aria-label') &&
                           !control.textContent.trim())
      .map((control) => control.outerHTML));
    assert.deepEqual(unlabelled, []);
    await page.getByLabel('Admin token').focus();
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Use token');
    const outline = await page.evaluate(() => getComputedStyle(document.activeElement).outlineStyle);
    assert.equal(outline, 'solid', 'the focus is visible');
  });

  it('fits 1280×800 and a 390 px wide phone without horizontal scrolling', async () => {
    await page.locator('#pool-list button', { hasText: 'edge' }).click();
    await eventually(async () => (await bars().count()) === 5, 'the edge pool again');
    await page.getByRole('button', { name: 'Disable socks5://9.9.9.9:1080' }).click();
    await page.locator('#result').getByText('Disabled socks5://9.9.9.9:1080').waitFor();
    await eventually(async () => (await page.locator('#chart g[data-state="ineligible"]').count()) === 1, 'a hatched bar');
    const overflow = () => page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
    assert.equal(await overflow(), 0);
    mkdirSync(SHOTS, { recursive: true });
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: path.join(SHOTS, 'dashboard-1280x800.png') });
    await page.screenshot({ path: path.join(SHOTS, 'dashboard-1280-full.png'), fullPage: true });

    await page.setViewportSize({ width: 390, height: 844 });
    // The chart redraws for the new width: names above their bars.
    await eventually(async () => Number(await page.locator('#chart svg').getAttribute('width')) < 390, 'a narrow chart');
    assert.equal(await overflow(), 0);
    await page.evaluate(() => window.scrollTo(0, 0));
    const columns = await page.evaluate(() => getComputedStyle(document.querySelector('main')).gridTemplateColumns.split(' ').length);
    assert.equal(columns, 1, 'the layout stacks');
    await page.screenshot({ path: path.join(SHOTS, 'dashboard-390x844.png') });
    await page.screenshot({ path: path.join(SHOTS, 'dashboard-390-full.png'), fullPage: true });
  });

  it('shows the bans of the target an operator names, and none once it is cleared', async () => {
    await call('PUT', '/pools/sites', {});
    await call('POST', '/pools/sites/members', { members: ['site-1', 'site-2'] });
    const reported = await call('POST', '/pools/sites/outcomes',
      { proxy: 'site-1', result: 'blocked', target: 'shop.example.com' });
    assert.equal(reported.outcomes[0].effect, 'banned');
    await page.locator('#pool-list button', { hasText: 'sites' }).click();
    assert.equal((await page.locator('#target-help').textContent()).replace(/\s+/g, ' ').trim(),
                 "a host: each member then shows its ban for it. A ban, from a blocked report naming the host, " +
                 "keeps the member out for that host only, for the pool's ban duration (health.target_ban_ms, " +
                 'doubled on each repeat); other hosts still get it.');
    await page.getByLabel('Bans for target').fill('shop.example.com');
    await page.getByLabel('Bans for target').press('Enter');
    await page.getByLabel('Bans for target').blur();
    const details = (id) => rowOf(id).locator('td').nth(4);
    await eventually(async () => /^banned for shop\.example\.com, free in \d+ min \d+ s$/.test(await details('site-1').textContent()),
                     'the ban in the table');
    assert.equal(await details('site-2').textContent(), '');
    await page.getByLabel('Bans for target').fill('');
    await page.getByLabel('Bans for target').blur();
    await eventually(async () => (await details('site-1').textContent()) === '', 'the ban gone from the table');
  });

  it('shows when a tripped member comes back, from the returns_at the service lists, and nothing for a disabled one', async () => {
    // Two members trip on a reported failure; an operator then disables one of them, which
    // cancels its return but leaves the length of its last cooldown in the listing.
    await call('PUT', '/pools/health', { health: { max_consecutive_failures: 1, cooldown_ms: 8000, jitter_percent: 0 } });
    await call('POST', '/pools/health/members', { members: ['cooling-1', 'disabled-1'] });
    const reported = await call('POST', '/pools/health/outcomes', [
      { proxy: 'cooling-1', result: 'failed', status: 502 },
      { proxy: 'disabled-1', result: 'failed' },
    ]);
    assert.deepEqual(reported.outcomes.map((o) => o.effect), ['tripped', 'tripped']);
    await call('POST', '/pools/health/members/disable', { members: ['disabled-1'], reason: 'retired' });
    const disabled = await member('health', 'disabled-1');
    assert.equal(disabled.returns_at, undefined, 'a disabled member never returns by itself');
    assert.equal(disabled.last_cooldown_ms, 8000);
    const back = Date.parse((await member('health', 'cooling-1')).returns_at);
    assert.ok(Number.isFinite(back), 'a member cooling down has returns_at');

    await page.locator('#pool-list button', { hasText: 'health' }).click();
    const details = rowOf('cooling-1').locator('td').nth(4);
    const text = await eventually(async () => {
      const t = await details.textContent();
      return /^reason: unhealthy · off for \d+ s · back in \d+ s$/.test(t) && t;
    }, 'the time left in the table');
    // Drawn at the page's last refresh (every 3 s) from returns_at, rounded to seconds.
    const shown = Number(/back in (\d+) s$/.exec(text)[1]);
    const left = (back - Date.now()) / 1000;
    assert.ok(shown >= left - 1 && shown <= left + 4, `shown ${shown} s, ${left.toFixed(1)} s left`);
    assert.match(await page.locator('#chart g[data-member="cooling-1"] .bar-value').textContent(),
                 /^0 · off · back in \d+ s$/);
    assert.match(await rowOf('disabled-1').locator('td').nth(4).textContent(),
                 /^reason: retired · off for \d+ s$/);
    assert.equal(await page.locator('#chart g[data-member="disabled-1"] .bar-value').textContent(), '0 · off');

    // The cooldown ends and the service returns the member: the page follows.
    await eventually(async () => (await rowOf('cooling-1').getAttribute('data-state')) === 'eligible',
                     'the cooled-down member to come back', 20_000);
    assert.equal(await rowOf('cooling-1').locator('td').nth(4).textContent(), '');
    assert.equal(await page.locator('#chart g[data-member="cooling-1"] .bar-value').textContent(), '0');
    assert.match(await rowOf('disabled-1').locator('td').nth(4).textContent(),
                 /^reason: retired · off for \d+ s$/);
  });

  it("shows each member's last active check, with its latency when it got an answer", async () => {
    // A tcp check of the service's own port (open) and of port 1 (closed); a thousand
    // failures in a row keep the closed one eligible, so its details hold only the check.
    const port = Number(new URL(service.base).port);
    const rules = { allow_private: true };
    await call('PUT', '/pools/checked', { rules });
    await call('POST', '/pools/checked/members', { members: [`127.0.0.1:${port}`, '127.0.0.1:1'] });
    await call('PUT', '/pools/checked', { rules, health: { max_consecutive_failures: 1000,
      check: { kind: 'tcp', interval_ms: 60000, timeout_ms: 2000 } } });
    const open = `http://127.0.0.1:${port}`;
    await eventually(async () => (await member('checked', open)).last_check &&
                                 (await member('checked', 'http://127.0.0.1:1')).last_check,
                     'both members checked');
    await page.locator('#pool-list button', { hasText: 'checked' }).click();
    const details = (id) => rowOf(id).locator('td').nth(4);
    await eventually(async () => /^last check: ok \(connected, \d+ ms\)$/.test(await details(open).textContent()),
                     'the open port\'s check in the table');
    assert.equal(await details('http://127.0.0.1:1').textContent(), 'last check: failed (connection refused)');
  });

  it("shows a pool's sources with their last fetch, and where its members came from", async () => {
    // A list on a loopback server of the test's own, which the pool may fetch from.
    const list = http.createServer((request, response) => response.end('8.8.4.4:8080\nnot a proxy\n'));
    list.listen(0, '127.0.0.1');
    await once(list, 'listening');
    try {
      const url = `http://127.0.0.1:${list.address().port}/free.txt`;
      await call('PUT', '/pools/listed', { rules: { allow_private_sources: true },
        sources: [{ url, interval_ms: 60000 }], prune: { absent_from_source_fetches: 3 } });
      await eventually(async () => (await call('GET', '/pools/listed/sources')).sources[0].last_fetch,
                       'the first fetch');
      await page.locator('#pool-list button', { hasText: 'listed' }).click();
      const row = page.locator('#sources tbody tr');
      await eventually(async () => (await row.count()) === 1 && await page.locator('#sources-card').isVisible(),
                       'the sources card');
      const cells = await row.locator('td').allTextContents();
      assert.equal(cells.length, 5);
      assert.deepEqual([cells[0], cells[1], cells[3]], [url, '1 min 0 s', 'ok: 1 added, 0 existing, 1 rejected']);
      assert.match(cells[2], /^\d+ s ago$/);
      assert.match(cells[4], /^in \d+ s$/);
      await eventually(async () => (await rowOf('http://8.8.4.4:8080').locator('td').nth(4).textContent()) === `from ${url}`,
                       "the member's origin in its details");
      assert.deepEqual(await page.locator('#pool-facts dt').allTextContents(),
                       ['Eligible', 'Ineligible', 'In flight', 'Spread (max − min)', 'Fewest / most',
                        'Assignments handed out', 'Pruned']);
      // A pool without sources shows no sources card.
      await page.locator('#pool-list button', { hasText: 'edge' }).click();
      await eventually(async () => await page.locator('#sources-card').isHidden(), 'the card hidden again');
    } finally {
      list.close();
    }
  });

  it("charts the pool's assigns per second, and the chart moves when assigns happen", async () => {
    const chart = page.locator('#activity svg');
    const assigns = () => chart.getAttribute('data-assigns');
    // The pool's one assign so far (following assignments live), once the service's sampler
    // has counted its second: the whole suite runs well within the chart's five minutes.
    await eventually(async () => (await assigns()) === '1', 'the chart to count the earlier assign');
    assert.equal(await chart.getAttribute('role'), 'img');
    assert.deepEqual(await page.locator('#activity-card .legend li').allTextContents(),
                     ['Assigns: solid', 'Answered 204: dashed', 'Reports ok: dotted', 'Reports failed: dash-dot',
                      'Reports blocked: short dashes']);
    const line = page.locator('#activity polyline[data-series="assigns"]');
    const drawn = await line.getAttribute('points');
    assert.equal(drawn.split(' ').length, 300, 'one point a second for five minutes');
    for (let i = 0; i < 3; i += 1) {
      assert.equal((await fetch(`${service.base}/pools/edge/assign`, { method: 'POST' })).status, 200);
    }
    await call('POST', '/pools/edge/outcomes', { proxy: 'dc-fra-07', result: 'ok' });
    await eventually(async () => (await assigns()) === '4', 'the chart to count three more assigns');
    await eventually(async () => (await chart.getAttribute('data-ok')) === '1', 'the chart to count the report');
    assert.notEqual(await line.getAttribute('points'), drawn, 'the line moved');
    assert.match(await chart.locator('desc').textContent(),
                 /^Over the 5 minutes up to \d\d:\d\d:\d\d: assigns 4, answered 204 0, reports ok 1, reports failed 0, reports blocked 0; at most [1-3] of one kind in a second\.$/);
    assert.equal(await page.locator('#abandoned-help').isHidden(), true, 'a least-used pool has no leases');
  });

  it('loaded nothing from elsewhere and logged no error', () => {
    assert.deepEqual(foreignRequests, []);
    assert.deepEqual(problems, []);
  });
});
