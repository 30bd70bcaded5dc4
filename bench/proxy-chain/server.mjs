// proxy-chain as a user would set it up to rotate over upstream proxies: every request or
// tunnel goes to the next upstream in turn, and the worker token is checked as the
// gateway checks it. Started by bench/gateway.sh:
//
//   node server.mjs PORT TOKEN UPSTREAM_URL...
import { Server } from 'proxy-chain';

const [port, token, ...upstreams] = process.argv.slice(2);
let next = 0;

const server = new Server({
    host: '127.0.0.1',
    port: Number(port),
    prepareRequestFunction: ({ password }) => {
        const upstreamProxyUrl = upstreams[next];
        next = (next + 1) % upstreams.length;
        return { requestAuthentication: password !== token, upstreamProxyUrl };
    },
});

await server.listen();
console.log(`listening on ${port}`);
