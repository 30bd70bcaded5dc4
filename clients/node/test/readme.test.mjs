// The code of the package's README (clients/node/README.md), run as written against the
// release binary: each example saved as a file and run by node, with the service's address
// for the README's and WORKER_TOKEN in its environment. The sites the Crawlee example
// fetches are stood in for by local proxies that answer every request themselves
// (examples.mjs); everything the examples ask the service goes to the service.
//
// Every fenced block of the README is listed in BLOCKS: the test that runs it, or why none
// does. A block added to the README and not to the list fails the first test.

import assert from 'node:assert/strict';
import { afterEach, beforeEach, describe, test } from 'node:test';
import { inspect } from 'node:util';

import { blocks, runModule, startInternet } from './examples.mjs';
import { WORKER, callsSince, startService } from './harness.mjs';

const README = 'clients/node/README.md';
const P1 = 'http://p1.example.net:3128';
const P2 = 'http://p2.example.net:3128';
const ASSIGN = '/pools/{pool}/assign';
const RELEASE = '/pools/{pool}/leases/{lease}/release';
const OUTCOMES = '/pools/{pool}/outcomes';

const WORKER_LOOP = 'the worker loop and the lease loop run as written';
const CRAWLEE = 'the Crawlee example crawls its two pages through the pool as written';

/** Every fenced block of the README, in order: its language, its first line, and the test that runs it or why none does. */
const BLOCKS = [
    ['sh', 'cd clients/node && npm ci && npm pack          # builds dist/ and writes proxy-allocator-0.1.0.tgz',
        'skipped: builds and packs the package, which these tests import built'],
    ['js', "import { Client, Unavailable } from 'proxy-allocator';", WORKER_LOOP],
    ['js', "import { HttpCrawler } from '@crawlee/http';", CRAWLEE],
    ['sh', 'cargo build --release', 'skipped: builds the service and runs this very suite'],
];

function block(first) {
    const index = BLOCKS.findIndex(([, line]) => line === first);
    return blocks(README)[index].text;
}

/** Runs one README block against `service`, as its reader would with WORKER_TOKEN set. */
function run(service, first) {
    return runModule(block(first).replaceAll('http://127.0.0.1:8080', service.base), { WORKER_TOKEN: WORKER });
}

describe('the Node README', () => {
    // A service of its own for each example: its pools are the example's alone.
    let service;
    beforeEach(async () => {
        service = await startService();
    });
    afterEach(async () => {
        await service?.stop();
    });

    test('every block of the README is run here or skipped for a reason', () => {
        const found = blocks(README).map(({ language, text }) => [language, text.split('\n', 1)[0]]);
        assert.deepEqual(found, BLOCKS.map(([language, first]) => [language, first]));
        assert.deepEqual(
            BLOCKS.filter(([, , runner]) => !runner.startsWith('skipped: ')).map(([language]) => language),
            ['js', 'js'],
        );
    });

    test(WORKER_LOOP, async () => {
        await service.admin('PUT', '/pools/web', {});
        await service.seed('web', [P1, P2]);
        await service.admin('PUT', '/pools/browsers', { policy: 'least-in-flight', max_in_flight: 1 });
        await service.seed('browsers', [P1]);
        const before = await service.calls();

        const { code, stdout, stderr } = await run(service, "import { Client, Unavailable } from 'proxy-allocator';");
        assert.equal(code, 0, stderr);
        assert.equal(stdout, [
            // The first report rode on the second assign, the last went alone.
            `${P1} counted`,
            `${P2} counted`,
            // The first lease's release and blocked report rode on the second lease's assign.
            `holding ${P1} for https://example.com/c previous release: undefined`,
            `holding ${P1} for https://example.com/d previous release: ${inspect({ released: true, proxy: P1, effect: 'counted', consecutiveFailures: 1 })}`,
            '',
        ].join('\n'));
        // Four assigns, the loop's last report, and close()'s release with its report.
        assert.deepEqual(callsSince(before, await service.calls()), { [ASSIGN]: 4, [OUTCOMES]: 2, [RELEASE]: 1 });
        const browser = (await service.members('browsers'))[P1];
        assert.deepEqual([browser.consecutive_failures, browser.in_flight], [2, 0]);
    });

    test(CRAWLEE, async () => {
        const internet = await startInternet(2);
        try {
            await service.admin('PUT', '/pools/web', { rules: { allow_private: true } });
            await service.seed('web', internet.proxies);

            const { code, stdout, stderr } = await run(service, "import { HttpCrawler } from '@crawlee/http';");
            assert.equal(code, 0, stderr);
            // The site saw each page once, each through a proxy of its own (one session each).
            const through = Object.fromEntries(internet.hits.map(({ url, proxy }) => [url, proxy]));
            assert.deepEqual(Object.keys(through).sort(), ['https://example.com/a', 'https://example.com/b']);
            assert.deepEqual(Object.values(through).sort(), [...internet.proxies].sort());
            // The request handler's line per page, then the adapter's stats: both pages
            // reported ok, nothing left to release (a least-used pool gives no leases).
            const lines = stdout.split('\n');
            assert.deepEqual(lines.slice(0, 2).sort(), [
                `https://example.com/a via ${through['https://example.com/a']}`,
                `https://example.com/b via ${through['https://example.com/b']}`,
            ]);
            assert.equal(lines.slice(2).join('\n'), `${inspect({
                assigned: 2,
                reported: { ok: 2, failed: 0, blocked: 0 },
                tripped: 0,
                released: 0,
                noProxy: 0,
                unavailable: 0,
                waits: 0,
                waitedMs: 0,
                reportFailed: 0,
                releaseFailed: 0,
                carried: 0,
            })}\n`);
            const web = await service.members('web');
            assert.deepEqual(internet.proxies.map((proxy) => [web[proxy].assignments, web[proxy].consecutive_failures]), [[1, 0], [1, 0]]);
        } finally {
            await internet.stop();
        }
    });
});
