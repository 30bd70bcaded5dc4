// The Crawlee adapter in real crawls: the release binary (both stores), a local site, real
// proxy-chain upstreams (one the site answers 429, one dead), Crawlee's HttpCrawler.

import assert from 'node:assert/strict';
import { after, before, beforeEach, afterEach, describe, test } from 'node:test';

import { Configuration, log } from '@crawlee/core';
import { HttpCrawler } from '@crawlee/http';

import { ProxyAllocatorProxies } from '../dist/crawlee.js';
import { callsSince, deadProxy, startBrokenProxy, startProxy, startRedis, startService, startSite } from './harness.mjs';

const GOOD_SOURCE = '127.0.0.2';
const BLOCKED_SOURCE = '127.0.0.3';
const PAGES = 12;
const ASSIGN = '/pools/{pool}/assign';
const RELEASE = '/pools/{pool}/leases/{lease}/release';
const OUTCOMES = '/pools/{pool}/outcomes';

log.setLevel(log.LEVELS.OFF);

/**
 * Crawls `urls` through `pool`: the pages it got (url, proxy), the adapter's stats, and the
 * calls it made to the service, per route.
 */
async function crawl(service, pool, urls, concurrency = 4, options = {}, clientOptions = {}, crawlerOptions = {}) {
    const warnings = [];
    const before = await service.calls();
    const client = service.client(clientOptions);
    const proxies = new ProxyAllocatorProxies({ client, pool, onWarning: (m) => warnings.push(m), ...options });
    const pages = [];
    const crawler = new HttpCrawler(
        {
            proxyConfiguration: proxies.proxyConfiguration,
            sessionPoolOptions: proxies.sessionPoolOptions,
            minConcurrency: concurrency,
            maxConcurrency: concurrency,
            maxRequestRetries: 3,
            navigationTimeoutSecs: 10,
            requestHandler: async ({ request, response, proxyInfo }) => {
                pages.push({ url: request.url, status: response.statusCode, proxy: proxyInfo.url });
            },
            ...crawlerOptions,
        },
        // Storage in memory, one per crawl.
        new Configuration({ persistStorage: false }),
    );
    await crawler.run(urls);
    await proxies.close();
    return { pages, stats: proxies.stats, warnings, calls: callsSince(before, await service.calls()) };
}

/** A least-in-flight pool of the good, the blocked and a dead proxy, each out after one failure. */
async function threeProxies(service, good, blocked) {
    const dead = await deadProxy();
    const pool = await service.createPool({
        policy: 'least-in-flight',
        rules: { allow_private: true },
        health: { max_consecutive_failures: 1, cooldown_ms: 600_000, jitter_percent: 0 },
    });
    await service.seed(pool, [good.url, blocked.url, dead]);
    return { pool, dead };
}

for (const store of ['redis', 'embedded']) {
    describe(`a Crawlee crawl on the ${store} store`, () => {
        let redis;
        let service;
        let good;
        let blocked;
        let site;
        before(async () => {
            redis = store === 'redis' ? await startRedis() : null;
            service = await startService(redis?.url);
            good = await startProxy(GOOD_SOURCE);
            blocked = await startProxy(BLOCKED_SOURCE);
        });
        after(async () => {
            await good.stop();
            await blocked.stop();
            await service.stop();
            await redis?.stop();
        });
        beforeEach(async () => {
            site = await startSite(new Set([BLOCKED_SOURCE]));
        });
        afterEach(() => site.stop());

        test('takes out the dead and the blocked proxy, counts what it used and releases every lease', async () => {
            const { pool, dead } = await threeProxies(service, good, blocked);
            // No retirement's done goes out on its own before close(), however slow the machine.
            const { pages, stats, warnings, calls } = await crawl(service, pool, site.urls(PAGES), 4, {}, { releaseDelayMs: 60_000 });

            // The crawl completed: every page, each through the good proxy.
            assert.deepEqual(pages.map((p) => p.url).sort(), site.urls(PAGES).sort());
            assert.deepEqual(new Set(pages.map((p) => `${p.status} ${p.proxy}`)), new Set([`200 ${good.url}`]));

            // What the site saw through each proxy is what was reported about it.
            const blockedHits = site.byClient()[`${BLOCKED_SOURCE} 429`] ?? 0;
            assert.deepEqual(site.byClient(), { [`${GOOD_SOURCE} 200`]: PAGES, [`${BLOCKED_SOURCE} 429`]: blockedHits });
            assert.ok(blockedHits >= 1);
            assert.ok(stats.reported.failed >= 1);
            assert.deepEqual(stats.reported, { ok: PAGES, blocked: blockedHits, failed: stats.reported.failed });
            assert.equal(stats.tripped, 2);

            // Counts: the service's per member are the requests through each.
            const members = await service.members(pool);
            assert.deepEqual(Object.fromEntries(Object.entries(members).map(([m, v]) => [m, v.assignments])), {
                [good.url]: PAGES,
                [blocked.url]: blockedHits,
                [dead]: stats.reported.failed,
            });
            assert.equal(stats.assigned, PAGES + blockedHits + stats.reported.failed);
            assert.deepEqual(Object.fromEntries(Object.entries(members).map(([m, v]) => [m, [v.state, v.reason ?? null]])), {
                [good.url]: ['eligible', null],
                [blocked.url]: ['ineligible', 'blocked'],
                [dead]: ['ineligible', 'unhealthy'],
            });

            // Every lease released, none left to the sweep.
            assert.equal(stats.released, stats.assigned);
            const poolStats = await service.stats(pool);
            assert.deepEqual([poolStats.in_flight, poolStats.abandoned], [0, 0]);
            assert.deepEqual([stats.reportFailed, stats.releaseFailed, warnings], [0, 0, []]);

            // Each retirement's report and release rode on the assign of the session that
            // retried its request; each good page's report went at once, and its session's
            // lease on close().
            assert.equal(stats.carried, blockedHits + stats.reported.failed);
            assert.deepEqual(calls, { [ASSIGN]: stats.assigned, [OUTCOMES]: PAGES, [RELEASE]: PAGES });
        });

        test('with the client\'s carryDone false, retirements report and release by calls of their own', async () => {
            const { pool } = await threeProxies(service, good, blocked);
            const { pages, stats, warnings, calls } = await crawl(service, pool, site.urls(PAGES), 4, {}, { carryDone: false });
            assert.deepEqual(new Set(pages.map((p) => `${p.status} ${p.proxy}`)), new Set([`200 ${good.url}`]));
            const retirements = site.byClient()[`${BLOCKED_SOURCE} 429`] + stats.reported.failed;
            assert.deepEqual([stats.carried, stats.tripped, stats.released, stats.assigned], [0, 2, stats.assigned, PAGES + retirements]);
            assert.deepEqual(calls, { [ASSIGN]: stats.assigned, [OUTCOMES]: PAGES + retirements, [RELEASE]: stats.assigned });
            assert.deepEqual(warnings, []);
        });

        // What the proxy does with each request, and the page asked for: an https page makes
        // Crawlee ask the proxy for a tunnel (CONNECT) first, which the refusing one answers 502.
        for (const [behaviour, does, https] of [
            ['close', 'closes the connection without answering', false],
            ['reset', 'resets the connection', false],
            ['refuse', 'answers the tunnel with 502', true],
        ]) {
            test(`reports failed for each try through a proxy that ${does}`, async () => {
                const broken = await startBrokenProxy(behaviour);
                try {
                    // Four failures in a row leave the member in: each shows in its count.
                    const pool = await service.createPool({
                        rules: { allow_private: true },
                        health: { max_consecutive_failures: 10, cooldown_ms: 600_000, jitter_percent: 0 },
                    });
                    await service.seed(pool, [broken.url]);
                    const url = site.urls(1)[0].replace('http:', https ? 'https:' : 'http:');
                    // Crawlee sends the page four times, each time through a new session, and
                    // gives up: three retries (maxRequestRetries), or three new sessions on
                    // the proxy errors it knows (maxSessionRotations).
                    const { pages, stats, warnings } = await crawl(service, pool, [url], 1, { maxWaitMs: 0 }, {}, { maxSessionRotations: 3 });
                    assert.deepEqual([pages, site.hits, broken.heads()], [[], [], 4]);
                    assert.deepEqual([stats.assigned, stats.reported, stats.tripped], [4, { ok: 0, failed: 4, blocked: 0 }, 0]);
                    assert.deepEqual(warnings, []);
                    // The service recorded each of them against the member.
                    const member = (await service.members(pool))[broken.url];
                    assert.deepEqual([member.assignments, member.consecutive_failures, member.state], [4, 4, 'eligible']);
                } finally {
                    await broken.stop();
                }
            });
        }

        test('reports nothing when Crawlee refuses a content type or the request handler throws', async () => {
            // One failure would take the proxy out, and a crawl waits for none: a report
            // against it would show.
            const pool = await service.createPool({
                rules: { allow_private: true },
                health: { max_consecutive_failures: 1, cooldown_ms: 600_000, jitter_percent: 0 },
            });
            await service.seed(pool, [good.url]);
            const pdf = await startSite(new Set(), 'application/pdf');
            try {
                // The proxy carried every answer: Crawlee refused the type itself.
                const refused = await crawl(service, pool, pdf.urls(2), 1, { maxWaitMs: 0 });
                assert.deepEqual(refused.pages, []);
                assert.deepEqual(pdf.byClient(), { [`${GOOD_SOURCE} 200`]: 2 });
                assert.deepEqual(refused.stats.reported, { ok: 0, failed: 0, blocked: 0 });
            } finally {
                await pdf.stop();
            }
            // The handler's own error, retried by Crawlee through the same proxy.
            const thrown = await crawl(service, pool, site.urls(1), 1, { maxWaitMs: 0 }, {}, {
                requestHandler: async () => {
                    throw new Error('the handler gave up');
                },
            });
            assert.deepEqual(site.byClient(), { [`${GOOD_SOURCE} 200`]: 4 });
            assert.deepEqual(thrown.stats.reported, { ok: 0, failed: 0, blocked: 0 });
            const member = (await service.members(pool))[good.url];
            assert.deepEqual([member.state, member.reason ?? null, member.consecutive_failures], ['eligible', null, 0]);
        });

        test('labels keep every session on the members carrying them', async () => {
            const pool = await service.createPool({ rules: { allow_private: true } });
            await service.seed(pool, [
                { member: good.url, labels: { tier: 'a' } },
                { member: blocked.url, labels: { tier: 'b' } },
            ]);
            const { pages, stats } = await crawl(service, pool, site.urls(4), 2, { labels: { tier: 'a' } });
            assert.deepEqual(new Set(pages.map((p) => `${p.status} ${p.proxy}`)), new Set([`200 ${good.url}`]));
            assert.deepEqual(site.byClient(), { [`${GOOD_SOURCE} 200`]: 4 });
            assert.equal((await service.members(pool))[blocked.url].assignments, 0);
            assert.equal(stats.reported.blocked, 0);
        });

        test('waits out a 204 and drops nothing', async () => {
            const pool = await service.createPool({
                rules: { allow_private: true },
                health: { max_consecutive_failures: 1, cooldown_ms: 3000, jitter_percent: 0 },
            });
            await service.seed(pool, [good.url]);
            // The only proxy cools down for 3 s: each first assign of the crawl answers 204.
            await service.client().report(pool, good.url, 'failed');
            // As many pages as requests run at once, so all meet the 204.
            const urls = site.urls(4);
            const { pages, stats } = await crawl(service, pool, urls, 4);
            assert.deepEqual(pages.map((p) => p.url).sort(), urls.sort());
            assert.deepEqual(site.byClient(), { [`${GOOD_SOURCE} 200`]: 4 });
            // Each request met one 204, waited its Retry-After (whole seconds), then got the proxy.
            assert.deepEqual([stats.noProxy, stats.waits, stats.unavailable], [4, 4, 0]);
            assert.ok(stats.waitedMs >= 4 * 1000, String(stats.waitedMs));
            assert.deepEqual([stats.assigned, stats.reported.ok], [4, 4]);
            assert.equal((await service.members(pool))[good.url].assignments, 4);
        });
    });
}
