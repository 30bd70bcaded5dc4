// Test harness: the real service binary, a real redis-server, a local site and real
// proxy-chain upstreams, each on a free loopback port.
//
// The binary is PROXY_ALLOCATOR_BIN or target/release/proxy-allocator of this repository.
// Each proxy dials the site from a loopback address of its own (127.0.0.2, 127.0.0.3: all
// of 127.0.0.0/8 is loopback), so the site knows which proxy a request came through, as a
// real site knows a proxy by its address, and answers 429 to the ones it blocks.

import { spawn } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { createServer } from 'node:http';
import { createConnection, createServer as createTcpServer } from 'node:net';
import { dirname, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { randomBytes } from 'node:crypto';
import { Server as ProxyServer } from 'proxy-chain';

import { Client } from '../dist/index.js';

export const ADMIN = 'test-admin-token';
export const WORKER = 'test-worker-token';
const REPOSITORY = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

export function binary() {
    const path = process.env.PROXY_ALLOCATOR_BIN ?? resolve(REPOSITORY, 'target', 'release', 'proxy-allocator');
    // A missing binary fails loudly, never skips.
    accessSync(path, constants.X_OK);
    return path;
}

/** A loopback port nobody listens on right now. */
export async function freePort() {
    const server = createTcpServer();
    await new Promise((done) => server.listen(0, '127.0.0.1', done));
    const { port } = server.address();
    await new Promise((done) => server.close(done));
    return port;
}

async function untilAnswers(port, check, what) {
    const deadline = Date.now() + 10_000;
    while (Date.now() < deadline) {
        if (await check(port)) return;
        await new Promise((done) => setTimeout(done, 20));
    }
    throw new Error(`${what} on port ${port} did not answer`);
}

function pong(port) {
    return new Promise((done) => {
        const socket = createConnection({ host: '127.0.0.1', port }, () => socket.write('PING\r\n'));
        socket.once('data', (data) => {
            socket.destroy();
            done(data.toString().startsWith('+PONG'));
        });
        socket.once('error', () => done(false));
    });
}

/** A throw-away redis-server that keeps nothing on disk. */
export async function startRedis() {
    const port = await freePort();
    const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], {
        stdio: 'ignore',
    });
    await untilAnswers(port, pong, 'redis-server');
    return {
        url: `redis://127.0.0.1:${port}`,
        stop: () => stopChild(child),
    };
}

function stopChild(child) {
    if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
    return new Promise((done) => {
        child.once('exit', done);
        child.kill('SIGKILL');
    });
}

/** The service on a free port with the test tokens and a fast sweep. */
export async function startService(redisUrl) {
    const env = {
        PATH: process.env.PATH ?? '',
        LISTEN_ADDR: '127.0.0.1:0',
        ADMIN_TOKEN: ADMIN,
        WORKER_TOKEN: WORKER,
        KEY_PREFIX: `js${randomBytes(6).toString('hex')}`,
        SWEEP_INTERVAL_MS: '100',
        STORE_TIMEOUT_MS: '500',
        LOG_FORMAT: 'json',
        RUST_LOG: 'warn,proxy_allocator::startup=info',
    };
    if (redisUrl) env.REDIS_URL = redisUrl;
    const child = spawn(binary(), [], { env, stdio: ['ignore', 'pipe', 'ignore'] });
    const base = await new Promise((found, failed) => {
        const timer = setTimeout(() => failed(new Error('the service did not log its address within 10 s')), 10_000);
        // Reads the bound address, then keeps reading so that logging never blocks.
        createInterface({ input: child.stdout }).on('line', (line) => {
            if (line.includes('"listening"')) {
                clearTimeout(timer);
                found(`http://${JSON.parse(line).addr}`);
            }
        });
        child.once('exit', () => failed(new Error('the service exited')));
    });
    const admin = async (method, path, body) => {
        const response = await fetch(base + path, {
            method,
            headers: { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' },
            body: body === undefined ? undefined : JSON.stringify(body),
        });
        const text = await response.text();
        if (response.status >= 300) throw new Error(`${method} ${path}: ${response.status} ${text}`);
        return text ? JSON.parse(text) : null;
    };
    return {
        base,
        client: (options = {}) => new Client(base, { token: WORKER, ...options }),
        admin,
        async createPool(config = {}) {
            const pool = `js-${randomBytes(4).toString('hex')}`;
            await admin('PUT', `/pools/${pool}`, config);
            return pool;
        },
        seed: (pool, members) => admin('POST', `/pools/${pool}/members`, { members }),
        stats: async (pool) => (await admin('GET', `/pools/${pool}`)).stats,
        /**
         * The POSTs the service has answered so far, per route template
         * (`/pools/{pool}/assign`: n), from its metrics: the HTTP calls a client made.
         */
        async calls() {
            const text = await (await fetch(`${base}/metrics`)).text();
            const counts = {};
            for (const [, route, value] of text.matchAll(/^pa_http_requests_total\{(?=[^}]*method="POST")[^}]*route="([^"]+)"[^}]*\} (\d+)$/gm)) {
                counts[route] = (counts[route] ?? 0) + Number(value);
            }
            return counts;
        },
        async members(pool) {
            const listing = await admin('GET', `/pools/${pool}/members`);
            return Object.fromEntries(listing.members.map((m) => [m.member, m]));
        },
        stop: () => stopChild(child),
    };
}

/** The calls made between two readings of `calls()`, per route, leaving out routes not called. */
export function callsSince(before, after) {
    const made = {};
    for (const [route, count] of Object.entries(after)) {
        if (count > (before[route] ?? 0)) made[route] = count - (before[route] ?? 0);
    }
    return made;
}

/** Resolves once `check()` resolves true, checking every 20 ms; fails after `ms`. */
export async function until(check, ms = 10_000) {
    const deadline = Date.now() + ms;
    while (!(await check())) {
        if (Date.now() > deadline) throw new Error(`not within ${ms} ms: ${check}`);
        await new Promise((done) => setTimeout(done, 20));
    }
}

/** A site: `/page/N` answers a small HTML page, or 429 to a blocked client address. */
export async function startSite(blocked, contentType = 'text/html') {
    const hits = [];
    const server = createServer((request, response) => {
        const client = request.socket.remoteAddress.replace(/^::ffff:/, '');
        const status = blocked.has(client) ? 429 : 200;
        hits.push({ client, path: request.url, status });
        const body = `<html><body>${request.url}</body></html>`;
        response.writeHead(status, { 'content-type': contentType, 'content-length': Buffer.byteLength(body) });
        response.end(body);
    });
    await new Promise((done) => server.listen(0, '127.0.0.1', done));
    const base = `http://127.0.0.1:${server.address().port}`;
    return {
        base,
        hits,
        urls: (count) => Array.from({ length: count }, (_, i) => `${base}/page/${i}`),
        /** Requests per "address status". */
        byClient() {
            const counts = {};
            for (const { client, status } of hits) counts[`${client} ${status}`] = (counts[`${client} ${status}`] ?? 0) + 1;
            return counts;
        },
        stop: () => new Promise((done) => server.close(done)),
    };
}

/** A proxy-chain HTTP proxy on a free loopback port, dialling out from `source`. */
export async function startProxy(source) {
    const server = new ProxyServer({ port: 0, host: '127.0.0.1', prepareRequestFunction: () => ({ localAddress: source }) });
    await server.listen();
    return {
        url: `http://127.0.0.1:${server.port}`,
        source,
        stop: () => server.close(true),
    };
}

/**
 * A proxy that reads each request head and serves none: `close` ends the connection
 * without an answer (a FIN, as the demo's failing proxy does), `reset` resets it (an RST),
 * `refuse` answers 502 and closes. `heads` counts the request heads it read.
 */
export async function startBrokenProxy(behaviour) {
    let heads = 0;
    const sockets = new Set();
    const server = createTcpServer((socket) => {
        sockets.add(socket);
        socket.once('close', () => sockets.delete(socket));
        socket.on('error', () => {});
        let head = '';
        socket.on('data', (data) => {
            head += data.toString('latin1');
            if (!head.includes('\r\n\r\n')) return;
            heads += 1;
            socket.removeAllListeners('data');
            if (behaviour === 'reset') socket.resetAndDestroy();
            else if (behaviour === 'refuse') socket.end('HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n');
            else socket.end();
        });
    });
    await new Promise((done) => server.listen(0, '127.0.0.1', done));
    return {
        url: `http://127.0.0.1:${server.address().port}`,
        heads: () => heads,
        stop: () => {
            for (const socket of sockets) socket.destroy();
            return new Promise((done) => server.close(done));
        },
    };
}

/** The URL of a proxy that is not there: nothing listens on its port. */
export async function deadProxy() {
    return `http://127.0.0.1:${await freePort()}`;
}

/**
 * `proxy-allocator demo` as the book's "Try it without proxies" starts it, on free ports
 * (`--listen` and `--gateway-listen` port 0), and what it printed: `api` (the base URL the
 * assign line names), `site` (the local page the gateway line fetches), `adminToken` (the
 * dashboard line's).
 */
export async function startDemo() {
    const child = spawn(binary(), ['demo', '--listen', '127.0.0.1:0', '--gateway-listen', '127.0.0.1:0'], {
        env: { PATH: process.env.PATH ?? '', LOG_FORMAT: 'json', RUST_LOG: 'warn' },
        stdio: ['ignore', 'pipe', 'ignore'],
    });
    const printed = await new Promise((found, failed) => {
        const lines = [];
        const timer = setTimeout(() => failed(new Error(`the demo did not print its lines within 10 s: ${lines}`)), 10_000);
        // The demo's own lines are text, its log lines JSON; keeps reading so that logging
        // never blocks.
        createInterface({ input: child.stdout }).on('line', (line) => {
            if (line.startsWith('{') || lines.at(-1)?.startsWith('Stop it')) return;
            lines.push(line);
            if (line.startsWith('Stop it')) {
                clearTimeout(timer);
                found(lines);
            }
        });
        child.once('exit', () => failed(new Error('the demo exited')));
    });
    const labelled = Object.fromEntries(printed.slice(1, -1).map((line) => {
        const at = line.indexOf(':');
        return [line.slice(0, at), line.slice(at + 1).trim()];
    }));
    const api = labelled.assign.split(' ').at(-1).split('/pools/')[0];
    const site = labelled.gateway.split(' ').at(-1);
    const adminToken = labelled.dashboard.match(/\(admin token: (\w+)\)/)[1];
    return {
        api,
        site,
        adminToken,
        /** The pool `demo`'s members by id, each with its `kind` label's value as `kind`. */
        async members() {
            const response = await fetch(`${api}/pools/demo/members`, { headers: { authorization: `Bearer ${adminToken}` } });
            const listing = await response.json();
            return Object.fromEntries(listing.members.map((m) => [m.member, { ...m, kind: m.labels.kind }]));
        },
        stop: () => stopChild(child),
    };
}
