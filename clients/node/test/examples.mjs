// Running a document's code as a reader would: its fenced blocks, each saved as an .mjs
// file and run by node from a directory inside this package (so `import 'proxy-allocator'`
// finds the built package by its own name and `@crawlee/http` its devDependency), and a
// stand-in for the internet the examples fetch from.

import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createHttpsServer } from 'node:https';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Server as ProxyServer } from 'proxy-chain';

const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const REPOSITORY = resolve(PACKAGE, '..', '..');

/** Every fenced block of the file at `path` (from the repository's root): `{ language, text }`, in order. */
export function blocks(path) {
    const text = readFileSync(resolve(REPOSITORY, path), 'utf8');
    return [...text.matchAll(/^```(\w*)\n([\s\S]*?)^```$/gm)].map(([, language, code]) => ({ language, text: code }));
}

/**
 * Runs `source` as an ES module with `env` added to a bare environment (PATH, and Crawlee's
 * log off); resolves to `{ code, stdout, stderr }`.
 */
export async function runModule(source, env = {}) {
    const directory = mkdtempSync(join(PACKAGE, 'test', '.example-'));
    try {
        writeFileSync(join(directory, 'example.mjs'), source);
        const child = spawn(process.execPath, ['example.mjs'], {
            cwd: directory,
            env: { PATH: process.env.PATH ?? '', CRAWLEE_LOG_LEVEL: 'OFF', ...env },
            stdio: ['ignore', 'pipe', 'pipe'],
        });
        let stdout = '';
        let stderr = '';
        child.stdout.on('data', (data) => (stdout += data));
        child.stderr.on('data', (data) => (stderr += data));
        const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
        const code = await new Promise((done) => child.once('exit', done));
        clearTimeout(timer);
        return { code, stdout, stderr };
    } finally {
        rmSync(directory, { recursive: true, force: true });
    }
}

/**
 * The internet, stood in for: HTTP proxies on loopback that answer every HTTPS request
 * themselves (they accept the CONNECT and end the tunnel in a local TLS server with a
 * self-signed certificate, which Crawlee's HttpCrawler accepts: its `ignoreSslErrors` is
 * on by default). `hits` says what reached the site and through which proxy.
 */
export async function startInternet(count) {
    const directory = mkdtempSync(join(PACKAGE, 'test', '.certificate-'));
    let key;
    let cert;
    try {
        execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
            '-subj', '/CN=example.com', '-days', '1', '-keyout', join(directory, 'key.pem'), '-out', join(directory, 'cert.pem')],
        { stdio: 'ignore' });
        key = readFileSync(join(directory, 'key.pem'));
        cert = readFileSync(join(directory, 'cert.pem'));
    } finally {
        rmSync(directory, { recursive: true, force: true });
    }
    const hits = [];
    const proxies = [];
    for (let i = 0; i < count; i += 1) {
        const proxy = new ProxyServer({ port: 0, host: '127.0.0.1', prepareRequestFunction: () => ({ customConnectServer: site }) });
        const site = createHttpsServer({ key, cert }, (request, response) => {
            hits.push({ url: `https://${request.headers.host}${request.url}`, proxy: `http://127.0.0.1:${proxy.port}` });
            response.writeHead(200, { 'content-type': 'text/html' });
            response.end('<html><body>page</body></html>');
        });
        await proxy.listen();
        proxies.push({ proxy, site });
    }
    return {
        proxies: proxies.map(({ proxy }) => `http://127.0.0.1:${proxy.port}`),
        hits,
        stop: () => Promise.all(proxies.map(({ proxy, site }) => {
            site.close();
            return proxy.close(true);
        })),
    };
}
