// The Node client against the real service, on Redis and on the embedded store, and
// against a small fake for connection reuse.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createServer } from 'node:http';
import { after, before, describe, test } from 'node:test';

import { Client, NoProxyAvailable, NotFound, ProxyAllocatorError, Unauthorized, Unreachable } from '../dist/index.js';
import { callsSince, freePort, startRedis, startService, until, WORKER } from './harness.mjs';

const P1 = 'http://p1.example.net:3128';
const P2 = 'http://p2.example.net:3128';
const ASSIGN = '/pools/{pool}/assign';
const RELEASE = '/pools/{pool}/leases/{lease}/release';
const OUTCOMES = '/pools/{pool}/outcomes';
/** What a carried release of a lease on P1 reported ok answers. */
const RELEASED_OK = { released: true, proxy: P1, effect: 'counted', consecutiveFailures: 0 };

for (const store of ['redis', 'embedded']) {
    describe(`the client on the ${store} store`, () => {
        let redis;
        let service;
        let client;
        before(async () => {
            redis = store === 'redis' ? await startRedis() : null;
            service = await startService(redis?.url);
            client = service.client();
        });
        after(async () => {
            await service.stop();
            await redis?.stop();
        });

        test('assign returns the least used proxy, null on 204 or NoProxyAvailable with Retry-After', async () => {
            const pool = await service.createPool({ health: { max_consecutive_failures: 1, cooldown_ms: 90_000, jitter_percent: 0 } });
            await service.seed(pool, [P2, P1]);
            assert.deepEqual(await client.assign(pool), { pool, proxy: P1, assignments: 1 });
            assert.deepEqual(await client.assign(pool), { pool, proxy: P2, assignments: 1 });
            await client.report(pool, P1, 'failed');
            await client.report(pool, P2, 'blocked', 429);
            assert.equal(await client.assign(pool), null);
            await assert.rejects(client.assign(pool, { raiseIfEmpty: true }), (error) => {
                assert.ok(error instanceof NoProxyAvailable);
                assert.equal(error.pool, pool);
                // 90 s from the first trip, rounded up to whole seconds by the service.
                assert.ok([89, 90].includes(error.retryAfter), String(error.retryAfter));
                return true;
            });
        });

        test('errors carry the service\'s status and code', async () => {
            await assert.rejects(client.assign('no-such-pool'), (error) => {
                assert.ok(error instanceof NotFound);
                assert.deepEqual([error.status, error.code], [404, 'pool_not_found']);
                return true;
            });
            await assert.rejects(service.client({ token: 'wrong' }).assign('no-such-pool'), Unauthorized);
        });

        test('report returns the service\'s answer and trips at the threshold', async () => {
            const pool = await service.createPool({ health: { max_consecutive_failures: 2, jitter_percent: 0 } });
            await service.seed(pool, [P1]);
            assert.deepEqual(await client.report(pool, P1, 'failed', 502), {
                pool,
                outcomes: [{ proxy: P1, result: 'failed', effect: 'counted', consecutive_failures: 1 }],
                unknown: [],
                rejected: [],
            });
            const second = await client.report(pool, P1, 'blocked', 429);
            assert.deepEqual(second.outcomes, [{ proxy: P1, result: 'blocked', effect: 'tripped', consecutive_failures: 2 }]);
            await assert.rejects(client.report(pool, P1, 'meh'), TypeError);
        });

        test('a lease is held while the function runs and released when it throws, reported failed', async () => {
            const pool = await service.createPool({
                policy: 'least-in-flight',
                health: { max_consecutive_failures: 1, jitter_percent: 0 },
            });
            await service.seed(pool, [P1, P2]);
            await assert.rejects(
                client.lease(
                    pool,
                    async (leased) => {
                        assert.deepEqual([leased.proxy, leased.inFlight, leased.lease.id.length], [P1, 1, 32]);
                        assert.equal((await service.stats(pool)).in_flight, 1);
                        throw new Error('the target reset the connection');
                    },
                    { report: true },
                ),
                /reset the connection/,
            );
            // The release and its report wait for the next assign; close() sends them now.
            await client.close();
            const stats = await service.stats(pool);
            assert.deepEqual([stats.in_flight, stats.abandoned, stats.tripped], [0, 0, 1]);
        });

        test('a lease renewed in the background outlives its ttl; release and renew refuse a released lease', async () => {
            const pool = await service.createPool({ policy: 'least-in-flight' });
            await service.seed(pool, [P1]);
            const leaseId = await client.lease(
                pool,
                async (leased) => {
                    // Time passing is what is tested: three ttls, the sweep runs every 100 ms.
                    // A renewal every 400 ms leaves 800 ms for one that a busy machine delays.
                    await new Promise((done) => setTimeout(done, 3600));
                    const stats = await service.stats(pool);
                    assert.deepEqual([stats.in_flight, stats.abandoned], [1, 0]);
                    assert.ok(leased.renewals >= 4, String(leased.renewals));
                    assert.equal(leased.lost, null);
                    leased.reportAs('blocked', 403);
                    return leased.lease.id;
                },
                { ttlMs: 1200, renew: true },
            );
            await client.close();
            const stats = await service.stats(pool);
            assert.deepEqual([stats.in_flight, stats.abandoned], [0, 0]);
            await assert.rejects(client.release(pool, leaseId), (error) => error instanceof NotFound && error.code === 'lease_not_found');
            await assert.rejects(client.renew(pool, leaseId), NotFound);
        });

        test('labels choose among the members carrying them, and a target skips a proxy that host banned', async () => {
            const pool = await service.createPool({ health: { target_ban_ms: 60_000, jitter_percent: 0 } });
            await service.seed(pool, [
                { member: P1, labels: { country: 'de' } },
                { member: P2, labels: { country: 'fr' } },
            ]);
            assert.deepEqual(await client.assign(pool, { labels: { country: 'fr' } }), { pool, proxy: P2, assignments: 1 });
            assert.deepEqual(await client.assign(pool, { labels: { country: ['de', 'fr'] } }), { pool, proxy: P1, assignments: 1 });
            assert.equal(await client.assign(pool, { labels: { country: 'us' } }), null);

            const answer = await client.report(pool, P1, 'blocked', 429, { target: 'shop.example.com' });
            assert.equal(answer.outcomes.length, 1);
            const { banned_until: bannedUntil, ...applied } = answer.outcomes[0];
            assert.deepEqual(applied, { proxy: P1, result: 'blocked', effect: 'banned', consecutive_failures: 0, target: 'shop.example.com' });
            assert.ok(Date.parse(bannedUntil) > Date.now() + 50_000, bannedUntil);
            // Banned for that host only: P2 for it (though P1 is tied with it), P1 elsewhere.
            assert.deepEqual(await client.assign(pool, { target: 'shop.example.com' }), { pool, proxy: P2, assignments: 2 });
            assert.deepEqual(await client.assign(pool, { target: 'news.example.org' }), { pool, proxy: P1, assignments: 2 });
            assert.equal(await client.assign(pool, { target: 'shop.example.com', labels: { country: 'de' } }), null);
        });

        test('a lease with a target reports with it, so a block bans the proxy for that host only', async () => {
            const pool = await service.createPool({ policy: 'least-in-flight', health: { jitter_percent: 0 } });
            await service.seed(pool, [P1]);
            await client.lease(
                pool,
                async (leased) => {
                    assert.equal(leased.proxy, P1);
                    leased.reportAs('blocked', 403);
                },
                { target: 'shop.example.com', report: true },
            );
            assert.equal(await client.assign(pool, { target: 'shop.example.com' }), null);
            const other = await client.assign(pool, { target: 'news.example.org' });
            assert.deepEqual([other.proxy, other.inFlight], [P1, 1]);
        });

        test('a session keeps its proxy while it stays eligible, re-pins after, and ends on endSession', async () => {
            const pool = await service.createPool({ health: { max_consecutive_failures: 1, cooldown_ms: 90_000, jitter_percent: 0 } });
            await service.seed(pool, [P1, P2]);
            const first = await client.assign(pool, { session: 'login-1', sessionTtlMs: 60_000 });
            const { expiresAt, ...pin } = first.session;
            assert.deepEqual({ ...first, session: pin }, { pool, proxy: P1, assignments: 1, session: { id: 'login-1', repinned: false } });
            assert.ok(Date.parse(expiresAt) > Date.now() + 50_000, expiresAt);
            // P1 is no longer the least used, and the session keeps it all the same.
            const again = await client.assign(pool, { session: 'login-1' });
            assert.deepEqual([again.proxy, again.assignments, again.session.repinned], [P1, 2, false]);
            await client.report(pool, P1, 'failed');
            const moved = await client.assign(pool, { session: 'login-1' });
            assert.deepEqual([moved.proxy, moved.assignments, moved.session.repinned], [P2, 1, true]);
            await client.endSession(pool, 'login-1');
            await assert.rejects(client.endSession(pool, 'login-1'), (error) => error instanceof NotFound && error.code === 'session_not_found');
            await assert.rejects(client.assign(pool, { session: 'login-1', count: 2 }), (error) => error.status === 400);
        });

        test('done reports the last request and releases its lease before the pick, in the same call', async () => {
            const pool = await service.createPool({ health: { max_consecutive_failures: 1, cooldown_ms: 90_000, jitter_percent: 0 } });
            await service.seed(pool, [P1, P2]);
            assert.equal((await client.assign(pool)).proxy, P1);
            assert.equal((await client.assign(pool)).proxy, P2);
            // Tied at one each: P1 would be next, but the failure carried with this assign
            // takes it out first.
            assert.deepEqual(await client.assign(pool, { done: { proxy: P1, result: 'failed', status: 502 } }), {
                pool,
                proxy: P2,
                assignments: 2,
                done: { released: false, proxy: P1, effect: 'tripped', consecutiveFailures: 1 },
            });
            const unknown = await client.assign(pool, { done: { proxy: 'http://nobody.example.net:1', result: 'ok' } });
            assert.deepEqual([unknown.proxy, unknown.done], [P2, { released: false, effect: 'unknown' }]);
            await assert.rejects(client.assign(pool, { done: { result: 'ok' } }), TypeError);

            const leased = await service.createPool({ policy: 'least-in-flight', max_in_flight: 1 });
            await service.seed(leased, [P1]);
            const first = await client.assign(leased);
            assert.equal(await client.assign(leased), null);
            const next = await client.assign(leased, { done: { lease: first.lease.id, result: 'ok' } });
            assert.deepEqual([next.proxy, next.inFlight, next.done], [P1, 1, { released: true, proxy: P1, effect: 'counted', consecutiveFailures: 0 }]);
            const again = await client.assign(leased, { done: { lease: first.lease.id } });
            assert.equal(again, null);
        });

        test('a steady loop of leases makes one call per cycle: each assign carries the last release and report', async () => {
            // One member with one place: each lease can only be given once the one before
            // it is released, which the assign itself does before it picks.
            const pool = await service.createPool({ policy: 'least-in-flight', max_in_flight: 1 });
            await service.seed(pool, [P1]);
            // No release goes out on its own during the loop, however slow the machine.
            const looping = service.client({ releaseDelayMs: 60_000 });
            const before = await service.calls();
            const carried = [];
            for (let i = 0; i < 10; i++) {
                await looping.lease(pool, async (leased) => carried.push(leased.done ?? null), { report: true });
            }
            assert.deepEqual(callsSince(before, await service.calls()), { [ASSIGN]: 10 });
            assert.deepEqual(carried, [null, ...Array(9).fill(RELEASED_OK)]);
            // The last one is still held, until close() sends it with its report.
            assert.equal((await service.stats(pool)).in_flight, 1);
            await looping.close();
            assert.deepEqual(callsSince(before, await service.calls()), { [ASSIGN]: 10, [RELEASE]: 1, [OUTCOMES]: 1 });
            const stats = await service.stats(pool);
            assert.deepEqual([stats.in_flight, stats.abandoned], [0, 0]);
            assert.equal((await service.members(pool))[P1].assignments, 10);
        });

        test('workers sharing a client each carry one pending release with their next lease', async () => {
            // Three members with one place each, three workers: every lease after a
            // worker's first is only given because its assign released one first.
            const pool = await service.createPool({ policy: 'least-in-flight', max_in_flight: 1 });
            const members = ['http://w1.example.net:3128', 'http://w2.example.net:3128', 'http://w3.example.net:3128'];
            await service.seed(pool, members);
            const shared = service.client({ releaseDelayMs: 60_000 });
            const before = await service.calls();
            const carried = [];
            await Promise.all(
                Array.from({ length: 3 }, async () => {
                    for (let i = 0; i < 5; i++) {
                        await shared.lease(pool, async (leased) => carried.push(leased.done?.released ?? null));
                    }
                }),
            );
            assert.deepEqual(callsSince(before, await service.calls()), { [ASSIGN]: 15 });
            assert.deepEqual(carried.sort(), [null, null, null, ...Array(12).fill(true)]);
            await shared.close();
            assert.deepEqual(callsSince(before, await service.calls()), { [ASSIGN]: 15, [RELEASE]: 3 });
            assert.equal((await service.stats(pool)).in_flight, 0);
        });

        test('with carryDone false a lease is released and reported by calls of their own', async () => {
            const pool = await service.createPool({ policy: 'least-in-flight', max_in_flight: 1 });
            await service.seed(pool, [P1]);
            const separate = service.client({ carryDone: false });
            const before = await service.calls();
            for (let i = 0; i < 3; i++) {
                await separate.lease(pool, async (leased) => assert.equal(leased.done, undefined), { report: true });
                assert.equal((await service.stats(pool)).in_flight, 0);
            }
            assert.deepEqual(callsSince(before, await service.calls()), { [ASSIGN]: 3, [RELEASE]: 3, [OUTCOMES]: 3 });
        });

        test('a release no assign carries goes out on its own once the delay has passed', async () => {
            const pool = await service.createPool({ policy: 'least-in-flight', health: { jitter_percent: 0 } });
            await service.seed(pool, [P1]);
            const waiting = service.client({ releaseDelayMs: 1000 });
            const warnings = [];
            const before = await service.calls();
            let settled;
            await waiting.lease(
                pool,
                async (leased) => {
                    leased.reportAs('blocked', 429);
                    settled = Date.now();
                },
                { report: true, onWarning: (m) => warnings.push(m) },
            );
            assert.equal((await service.stats(pool)).in_flight, 1);
            await until(async () => (await service.stats(pool)).in_flight === 0);
            const held = Date.now() - settled;
            assert.ok(held >= 1000 && held < 5000, `released ${held} ms after the function`);
            // The report goes out after the release answers, so it may still be on its way.
            await until(async () => callsSince(before, await service.calls())[OUTCOMES] === 1);
            assert.deepEqual(callsSince(before, await service.calls()), { [ASSIGN]: 1, [RELEASE]: 1, [OUTCOMES]: 1 });
            const member = (await service.members(pool))[P1];
            assert.deepEqual([member.assignments, member.consecutive_failures], [1, 1]);
            assert.deepEqual(warnings, []);
        });

        test('an assign that fails leaves the release it would carry pending, and close sends it', async () => {
            const pool = await service.createPool({ policy: 'least-in-flight' });
            await service.seed(pool, [P1]);
            const closing = service.client({ releaseDelayMs: 60_000 });
            const before = await service.calls();
            await closing.lease(pool, async () => {});
            await assert.rejects(closing.assign(pool, { count: 101 }), (error) => error.status === 400);
            assert.equal((await service.stats(pool)).in_flight, 1);
            await closing.close();
            assert.equal((await service.stats(pool)).in_flight, 0);
            assert.deepEqual(callsSince(before, await service.calls()), { [ASSIGN]: 2, [RELEASE]: 1 });
        });

        test('a plain assign carries the pending release and answers what it did', async () => {
            const pool = await service.createPool({ policy: 'least-in-flight', max_in_flight: 1 });
            await service.seed(pool, [P1]);
            const mixed = service.client({ releaseDelayMs: 60_000 });
            await mixed.lease(pool, async () => {}, { report: true });
            const next = await mixed.assign(pool);
            assert.deepEqual([next.proxy, next.inFlight, next.done], [P1, 1, RELEASED_OK]);
            await mixed.release(pool, next.lease.id);
        });

        test('an assign naming a session carries the pending release and report in the same call', async () => {
            // One place only: the session gets it because its assign released the lease first.
            const pool = await service.createPool({ policy: 'least-in-flight', max_in_flight: 1 });
            await service.seed(pool, [P1]);
            const sessions = service.client({ releaseDelayMs: 60_000 });
            const before = await service.calls();
            await sessions.lease(pool, async () => {}, { report: true });
            const next = await sessions.assign(pool, { session: 'login' });
            assert.deepEqual(
                [next.proxy, next.inFlight, next.session.id, next.session.repinned, next.done],
                [P1, 1, 'login', false, RELEASED_OK],
            );
            assert.deepEqual(callsSince(before, await service.calls()), { [ASSIGN]: 2 });
            await sessions.release(pool, next.lease.id);
            await sessions.close();
            assert.deepEqual(callsSince(before, await service.calls()), { [ASSIGN]: 2, [RELEASE]: 1 });
        });

        test('a process that runs out of work sends its pending release before it exits', async () => {
            const pool = await service.createPool({ policy: 'least-in-flight' });
            await service.seed(pool, [P1]);
            const script = `
                import { Client } from ${JSON.stringify(new URL('../dist/index.js', import.meta.url).href)};
                const client = new Client(${JSON.stringify(service.base)}, { token: ${JSON.stringify(WORKER)}, releaseDelayMs: 60_000 });
                await client.lease(${JSON.stringify(pool)}, async () => {}, { report: true });
            `;
            const started = Date.now();
            const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['ignore', 'ignore', 'inherit'] });
            const code = await new Promise((done) => child.once('exit', done));
            assert.equal(code, 0);
            // The pending release's timer did not hold the process for its 60 s.
            assert.ok(Date.now() - started < 30_000, `exited after ${Date.now() - started} ms`);
            const stats = await service.stats(pool);
            assert.deepEqual([stats.in_flight, stats.abandoned], [0, 0]);
        });

        test('count hands out distinct members in pick order, each counted once, and [] on 204', async () => {
            const pool = await service.createPool();
            const members = ['http://c1.example.net:3128', 'http://c2.example.net:3128', 'http://c3.example.net:3128'];
            await service.seed(pool, members);
            assert.deepEqual(await client.assign(pool, { count: 2 }), [
                { pool, proxy: members[0], assignments: 1 },
                { pool, proxy: members[1], assignments: 1 },
            ]);
            assert.deepEqual(await client.assign(pool, { count: 5 }), [
                { pool, proxy: members[2], assignments: 1 },
                { pool, proxy: members[0], assignments: 2 },
                { pool, proxy: members[1], assignments: 2 },
            ]);
            assert.deepEqual(await client.assign(pool, { count: 2, labels: { tier: 'gold' } }), []);
            await assert.rejects(client.assign(pool, { count: 2, labels: { tier: 'gold' }, raiseIfEmpty: true }), NoProxyAvailable);
            await assert.rejects(client.assign(pool, { count: 101 }), (error) => error.status === 400);
        });

        test('exclude never hands out the members it names, with count too', async () => {
            const pool = await service.createPool();
            const members = ['http://x1.example.net:3128', 'http://x2.example.net:3128', 'http://x3.example.net:3128'];
            await service.seed(pool, members);
            assert.deepEqual(await client.assign(pool, { exclude: [members[0]] }), { pool, proxy: members[1], assignments: 1 });
            assert.deepEqual(await client.assign(pool, { count: 3, exclude: [members[1]] }), [
                { pool, proxy: members[0], assignments: 1 },
                { pool, proxy: members[2], assignments: 1 },
            ]);
            assert.equal(await client.assign(pool, { exclude: members }), null);
        });

        test('200 concurrent callers keep the counts exact', async () => {
            const pool = await service.createPool();
            const members = Array.from({ length: 7 }, (_, i) => `http://m${i}.example.net:3128`);
            await service.seed(pool, members);
            const seen = {};
            await Promise.all(
                Array.from({ length: 200 }, async () => {
                    for (let i = 0; i < 5; i++) {
                        const assigned = await client.assign(pool);
                        (seen[assigned.proxy] ??= []).push(assigned.assignments);
                    }
                }),
            );
            const counts = Object.fromEntries(Object.entries(await service.members(pool)).map(([m, v]) => [m, v.assignments]));
            // 1000 assignments over 7 members, always to the least used: 142 or 143 each.
            assert.deepEqual(Object.values(counts).sort(), [142, 143, 143, 143, 143, 143, 143]);
            for (const [member, values] of Object.entries(seen)) {
                assert.deepEqual(
                    values.sort((a, b) => a - b),
                    Array.from({ length: counts[member] }, (_, i) => i + 1),
                );
            }
        });
    });
}

describe('the client against a fake', () => {
    let server;
    let base;
    const ports = [];
    before(async () => {
        server = createServer((request, response) => {
            ports.push(request.socket.remotePort);
            request.resume();
            request.on('end', () => {
                if (request.url === '/pools/gateway/assign') {
                    response.writeHead(502, { 'content-type': 'text/html' }).end('<h1>Bad Gateway</h1>');
                } else if (request.url === '/pools/busy/assign') {
                    response
                        .writeHead(503, { 'content-type': 'application/json', 'retry-after': '7' })
                        .end('{"error":{"code":"store_unavailable","message":"retry shortly"}}');
                } else {
                    response.writeHead(200, { 'content-type': 'application/json' }).end('{"pool":"web","proxy":"p","assignments":1}');
                }
            });
        });
        await new Promise((done) => server.listen(0, '127.0.0.1', done));
        base = `http://127.0.0.1:${server.address().port}`;
    });
    after(() => new Promise((done) => server.close(done)));

    test('sequential calls reuse kept-alive connections instead of opening one per call', async () => {
        ports.length = 0;
        const client = new Client(base);
        for (let i = 0; i < 20; i++) assert.deepEqual(await client.assign('web'), { pool: 'web', proxy: 'p', assignments: 1 });
        assert.equal(ports.length, 20);
        // Node's fetch hands a finished connection back to its pool a moment after the
        // answer, so back-to-back calls alternate between two kept-alive connections.
        assert.ok(new Set(ports).size <= 2, `${new Set(ports).size} connections`);
    });

    test('a 503 carries its Retry-After, a 502 keeps its status, no answer is Unreachable', async () => {
        const client = new Client(base);
        await assert.rejects(client.assign('busy'), (error) => error.code === 'store_unavailable' && error.retryAfter === 7);
        await assert.rejects(
            client.assign('gateway'),
            (error) => error instanceof ProxyAllocatorError && error.status === 502 && error.code === 'http_502',
        );
        const nobody = new Client(`http://127.0.0.1:${await freePort()}`, { timeoutMs: 2000 });
        await assert.rejects(nobody.assign('web'), (error) => error instanceof Unreachable && error.status === null);
    });
});
