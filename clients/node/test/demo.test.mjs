// The book's Node example (the workers page's Crawlee crawl) against `proxy-allocator demo`,
// pointed at it the way the getting-started page tells a reader to ("name the pool `demo`
// where they say `web`, pass no worker token, and fetch the printed site's URL", and let
// HttpCrawler take the page's text/plain with `additionalMimeTypes`): saved as a
// file and run by node, it fetches the demo's local page through the demo's own proxies (two
// healthy, one slow, one failing). Nothing is stood in for: nothing leaves the machine.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { after, before, test } from 'node:test';

import { REPOSITORY, runModule } from './examples.mjs';
import { startDemo } from './harness.mjs';

const WORKERS_PAGE = 'docs/src/workers.md';

/** The js block of the workers page's "Node and Crawlee" section. */
function crawleeExample() {
    const page = readFileSync(resolve(REPOSITORY, WORKERS_PAGE), 'utf8');
    const section = page.split('\n## Node and Crawlee\n')[1].split('\n## ')[0];
    const found = [...section.matchAll(/^```js\n([\s\S]*?)^```$/gm)];
    assert.equal(found.length, 1, `one js block in the section, found ${found.length}`);
    return found[0][1];
}

let demo;
before(async () => {
    demo = await startDemo();
});
after(async () => {
    await demo?.stop();
});

test("the book's Crawlee example fetches the demo page through the demo's proxies", async () => {
    const source = crawleeExample()
        .replaceAll('http://127.0.0.1:8080', demo.api)
        .replaceAll("'web'", "'demo'")
        .replaceAll('https://example.com/', demo.site)
        .replace('new HttpCrawler({\n', "new HttpCrawler({\n    additionalMimeTypes: ['text/plain'],\n");
    assert.match(source, /additionalMimeTypes/);
    const { code, stdout, stderr } = await runModule(source);
    assert.equal(code, 0, stderr);

    // The request handler's line per page: both pages, each through a proxy that answered
    // (a request the failing proxy dropped was retried through a new session).
    const members = await demo.members();
    const lines = stdout.trim().split('\n').sort();
    assert.deepEqual(lines.map((line) => line.split(' ')[0]), [`${demo.site}a`, `${demo.site}b`]);
    for (const line of lines) {
        const proxy = line.split(' ')[1];
        assert.ok(['healthy', 'slow'].includes(members[proxy]?.kind), `${line}: ${JSON.stringify(members[proxy])}`);
    }
    // The two proxies that fetched were handed out once each and reported ok (markGood).
    const answered = Object.values(members).filter((m) => m.kind !== 'failing' && m.assignments > 0);
    assert.deepEqual(answered.map((m) => [m.assignments, m.consecutive_failures]), [[1, 0], [1, 0]]);
    // The failing proxy, if it was handed out (least used first: at most once for two pages
    // and a retry among four members), dropped its request and was reported failed for it.
    const failing = Object.values(members).filter((m) => m.kind === 'failing');
    assert.equal(failing.length, 1);
    assert.ok(failing[0].assignments <= 1, JSON.stringify(failing[0]));
    assert.equal(failing[0].consecutive_failures, failing[0].assignments, JSON.stringify(failing[0]));
});
