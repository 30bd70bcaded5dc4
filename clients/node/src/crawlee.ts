/**
 * Crawlee adapter: proxies from a proxy-allocator pool, one per Crawlee session, and
 * outcome reports from the session's own events.
 *
 * ```js
 * const proxies = new ProxyAllocatorProxies({ client, pool: 'web' });
 * const crawler = new HttpCrawler({
 *     proxyConfiguration: proxies.proxyConfiguration,
 *     sessionPoolOptions: proxies.sessionPoolOptions,
 *     requestHandler: async ({ body }) => { ... },
 * });
 * await crawler.run(urls);
 * await proxies.close();
 * ```
 *
 * Crawlee asks its `ProxyConfiguration` for a proxy per request with the request's
 * session; the adapter assigns one from the pool for each new session and keeps it for the
 * session's life, as Crawlee does with its own proxy lists. The sessions it creates report
 * what Crawlee tells them about the proxy: `markGood` → `ok`, a blocked status
 * (`retireOnBlockedStatusCodes`, the session pool's `blockedStatusCodes`) → `blocked` with
 * that status, a retirement on a session error (Crawlee's proxy errors: refused, reset, the
 * proxy's own refusal of the tunnel or request) → `failed`. `markBad` reports nothing by
 * itself: Crawlee calls it after every failed request whatever failed, a content type it
 * refused itself, the request handler's own error, a timeout, and cannot say which.
 * Reporting `ok` instead would count a timed-out request as a success.
 *
 * Crawlee's proxy errors are error messages it knows (`ECONNRESET`, `Proxy responded
 * with`...), and a proxy that closes the connection without an answer fails the request
 * with `socket hang up`, which is not one of them: Crawlee retries the request without
 * retiring the session. Nor does it retire the session on the last try of a request, its
 * proxy errors included. So the adapter reads the errors itself: Crawlee hands each one to
 * the request's `pushErrorMessage` before it calls `markBad`, and names the request's
 * session when it asks for its proxy. A failure of the connection to the proxy (see
 * {@link isProxyFailure}) that left the session in place retires it on the `markBad` that
 * follows, as Crawlee's own session errors do, and so reports `failed`. When a
 * report takes the proxy out (or finds it out already), the session is retired, so the
 * next request gets a new session and a new proxy. A retired session's lease
 * (least-in-flight pools) is released; {@link ProxyAllocatorProxies.close} releases the
 * rest.
 *
 * A retirement ends the session's use of its proxy, and the request it retired on is
 * retried through a new session, whose assign comes next: with the client's `carryDone`
 * (the default) the retirement's report and release ride on the next assign as its `done`
 * (see {@link Client.deferDone}). `markGood` is reported at once, on its own: the session
 * keeps its proxy, no assign follows for it, and the answer decides whether it is retired.
 *
 * @module
 */

import { ProxyConfiguration, Session, SessionError } from '@crawlee/core';
import type { Request, SessionOptions, SessionPool, SessionPoolOptions } from '@crawlee/core';

import {
    Client,
    NoProxyAvailable,
    ProxyAllocatorError,
    Unavailable,
    renewInBackground,
} from './index.js';
import type { Assignment, Done, DoneSettled, Labels, Renewing, Result } from './index.js';

/** Options of {@link ProxyAllocatorProxies}. */
export interface ProxyAllocatorProxiesOptions {
    client: Client;
    pool: string;
    /** A lease ttl other than the pool's (least-in-flight pools); leases are renewed. */
    ttlMs?: number;
    /** Only members carrying these labels (`{ country: 'de' }`). */
    labels?: Labels;
    /** Milliseconds a request waits in all for a proxy (204, 503) before it fails. */
    maxWaitMs?: number;
    /** Milliseconds to wait after a 204 or 503 without `Retry-After`. */
    emptyWaitMs?: number;
    /** Where warnings go (failed reports and releases); default `console.warn`. */
    onWarning?: (message: string) => void;
}

/** Counts of what the adapter did, for logs and tests. */
export interface ProxyAllocatorStats {
    assigned: number;
    reported: Record<Result, number>;
    tripped: number;
    released: number;
    noProxy: number;
    unavailable: number;
    waits: number;
    waitedMs: number;
    reportFailed: number;
    releaseFailed: number;
    /** Retirements whose report and (or) release an assign carried as its `done`. */
    carried: number;
}

interface Held {
    assignment: Promise<Assignment>;
    /** A request through the proxy failed on its connection to it (see #watch). */
    proxyFailed?: boolean;
    renewing?: Renewing;
    renewer?: { stop(): Promise<void> };
}

/** A pool of proxy-allocator as Crawlee's proxy configuration and session pool options. */
export class ProxyAllocatorProxies {
    /** Pass as the crawler's `proxyConfiguration`. */
    readonly proxyConfiguration: ProxyConfiguration;
    /** Pass as (or merge into) the crawler's `sessionPoolOptions`. */
    readonly sessionPoolOptions: Pick<SessionPoolOptions, 'createSessionFunction'>;
    readonly stats: ProxyAllocatorStats = {
        assigned: 0,
        reported: { ok: 0, failed: 0, blocked: 0 },
        tripped: 0,
        released: 0,
        noProxy: 0,
        unavailable: 0,
        waits: 0,
        waitedMs: 0,
        reportFailed: 0,
        releaseFailed: 0,
        carried: 0,
    };
    readonly #client: Client;
    readonly #pool: string;
    readonly #options: ProxyAllocatorProxiesOptions;
    readonly #warn: (message: string) => void;
    readonly #sessions = new Map<string, Held>();
    /** The session each watched request last went out with (see #watch). */
    readonly #requestSessions = new WeakMap<Request, string>();
    readonly #pending = new Set<Promise<void>>();

    constructor(options: ProxyAllocatorProxiesOptions) {
        this.#client = options.client;
        this.#pool = options.pool;
        this.#options = options;
        this.#warn = options.onWarning ?? ((message: string) => console.warn(message));
        this.proxyConfiguration = new ProxyConfiguration({
            newUrlFunction: async (sessionId, options) => {
                // Crawlee asks for a proxy before each request it sends (Crawlee 3.6 and
                // later name the request).
                const id = sessionId === undefined ? undefined : String(sessionId);
                if (id !== undefined && options?.request !== undefined) this.#watch(options.request, id);
                return this.#proxyFor(id);
            },
        });
        const adapter = this;
        this.sessionPoolOptions = {
            createSessionFunction(sessionPool: SessionPool, options?: { sessionOptions?: SessionOptions }) {
                return new ReportingSession(adapter, {
                    // What Crawlee's own default does: the pool's session options, then these.
                    ...(sessionPool as unknown as { sessionOptions: SessionOptions }).sessionOptions,
                    ...options?.sessionOptions,
                    sessionPool,
                });
            },
        };
    }

    /**
     * Waits for the reports still on their way, releases every lease still held, and sends
     * the retirements no assign has carried yet ({@link Client.close}: every pending done
     * of the client).
     */
    async close(): Promise<void> {
        while (this.#pending.size > 0) await Promise.allSettled([...this.#pending]);
        await Promise.all([...this.#sessions.keys()].map((id) => this.#forget(id)));
        await this.#client.close();
    }

    async #proxyFor(sessionId: string | undefined): Promise<string> {
        if (sessionId === undefined) {
            // No session pool: one assignment per request, and nothing to report it with.
            const assigned = await this.#assignWaiting();
            if (assigned.lease) {
                await this.#client.release(this.#pool, assigned.lease.id);
                throw new ProxyAllocatorError(null, 'needs_sessions', 'leases need Crawlee\'s session pool (useSessionPool)');
            }
            return assigned.proxy;
        }
        let held = this.#sessions.get(sessionId);
        if (held === undefined) {
            held = { assignment: this.#assignWaiting() };
            this.#sessions.set(sessionId, held);
            const mine = held;
            held.assignment.then(
                (assigned) => {
                    if (assigned.lease && this.#sessions.get(sessionId) === mine) {
                        mine.renewing = { pool: this.#pool, lease: assigned.lease, renewals: 0, lost: null };
                        mine.renewer = renewInBackground(this.#client, mine.renewing, this.#warn);
                    }
                },
                () => this.#sessions.delete(sessionId),
            );
        }
        return (await held.assignment).proxy;
    }

    /**
     * Sees the errors of `request`, about to go out with session `sessionId`: Crawlee hands
     * each one to the request's `pushErrorMessage` (to keep its message) before it calls the
     * session's `markBad`, and nowhere else can the adapter see the error itself. A failure
     * of the connection to the proxy ({@link isProxyFailure}) is noted on the session's
     * proxy, for its `markBad` ({@link proxyFailed}).
     */
    #watch(request: Request, sessionId: string): void {
        // Crawlee may send the same request object again, with another session.
        const watched = this.#requestSessions.has(request);
        this.#requestSessions.set(request, sessionId);
        if (watched) return;
        const push = request.pushErrorMessage;
        const sessions = this.#sessions;
        const requestSessions = this.#requestSessions;
        request.pushErrorMessage = function (this: Request, ...args: Parameters<Request['pushErrorMessage']>) {
            const held = sessions.get(requestSessions.get(request) ?? '');
            if (held !== undefined && isProxyFailure(args[0])) held.proxyFailed = true;
            return push.apply(this, args);
        };
    }

    /**
     * Whether a request of `session` failed on its connection to the proxy since the last
     * call, the session still holding it: Crawlee has not retired it for that (a
     * `SessionError` it retries retires the session before `markBad`; one it gives up on
     * does not).
     *
     * @internal
     */
    proxyFailed(session: Session): boolean {
        const held = this.#sessions.get(session.id);
        if (held?.proxyFailed !== true) return false;
        held.proxyFailed = false;
        return true;
    }

    /** Assigns, waiting out 204 and 503 by their `Retry-After`, up to `maxWaitMs`. */
    async #assignWaiting(): Promise<Assignment> {
        const maxWaitMs = this.#options.maxWaitMs ?? 600_000;
        const emptyWaitMs = this.#options.emptyWaitMs ?? 1_000;
        let waited = 0;
        for (;;) {
            let waitMs: number;
            try {
                const assigned = await this.#client.assign(this.#pool, {
                    ttlMs: this.#options.ttlMs,
                    labels: this.#options.labels,
                    raiseIfEmpty: true,
                });
                this.stats.assigned += 1;
                return assigned!;
            } catch (error) {
                if (error instanceof NoProxyAvailable) {
                    this.stats.noProxy += 1;
                    waitMs = error.retryAfter === null ? emptyWaitMs : error.retryAfter * 1000;
                } else if (error instanceof Unavailable) {
                    this.stats.unavailable += 1;
                    waitMs = error.retryAfter === null ? emptyWaitMs : error.retryAfter * 1000;
                    this.#warn(`no proxy from pool '${this.#pool}' (${error.message}), waiting ${waitMs} ms`);
                } else {
                    throw error;
                }
            }
            if (waited + waitMs > maxWaitMs) {
                throw new ProxyAllocatorError(204, 'no_proxy_available', `no proxy in pool '${this.#pool}' within ${maxWaitMs} ms`);
            }
            this.stats.waits += 1;
            this.stats.waitedMs += waitMs;
            await new Promise((resolve) => setTimeout(resolve, waitMs));
            waited += waitMs;
        }
    }

    /** A session event: reports `result` about the session's proxy, if it has one. */
    /** @internal */
    outcome(session: Session, result: Result, status?: number): void {
        const held = this.#sessions.get(session.id);
        if (held === undefined) return;
        const work = (async () => {
            const assigned = await held.assignment;
            const answer = await this.#report(assigned.proxy, result, status);
            for (const applied of answer?.outcomes ?? []) {
                // Out of the pool now (or already): this session needs another proxy.
                if (applied.effect !== 'counted' && this.#sessions.get(session.id) === held) {
                    (session as ReportingSession).retireQuietly();
                }
            }
        })();
        this.#track(work);
    }

    /** Reports on its own, counting it; `null` when the report failed (warned). */
    async #report(proxy: string, result: Result, status: number | undefined) {
        try {
            const answer = await this.#client.report(this.#pool, proxy, result, status);
            this.stats.reported[result] += 1;
            for (const applied of answer.outcomes) if (applied.effect === 'tripped') this.stats.tripped += 1;
            return answer;
        } catch (error) {
            this.stats.reportFailed += 1;
            this.#warn(`outcome report failed: ${(error as Error).message}`);
            return null;
        }
    }

    /**
     * A session was retired: its proxy is let go (and its lease released), and `report`,
     * the outcome the retirement says if it says one, reported.
     *
     * @internal
     */
    retired(session: Session, report?: [Result, number | undefined]): void {
        if (this.#sessions.has(session.id)) this.#track(this.#forget(session.id, { report }));
    }

    #track(work: Promise<void>): void {
        this.#pending.add(work);
        void work.finally(() => this.#pending.delete(work));
    }

    /**
     * Lets a session's proxy go: reports what its retirement says, if anything, and
     * releases its lease. A retirement's report and release go as the `done` of the next
     * assign (a new session's), when the client carries dones; on {@link close} and on a
     * client that does not, they go on their own.
     */
    async #forget(sessionId: string, retirement?: { report?: [Result, number | undefined] }): Promise<void> {
        const held = this.#sessions.get(sessionId);
        if (held === undefined) return;
        this.#sessions.delete(sessionId);
        let assigned: Assignment;
        try {
            assigned = await held.assignment;
        } catch {
            return;
        }
        await held.renewer?.stop();
        const lease = assigned.lease === undefined ? undefined : (held.renewing?.lease.id ?? assigned.lease.id);
        const report = retirement?.report;
        if (retirement !== undefined && this.#client.carryDone && (report !== undefined || lease !== undefined)) {
            const done: Done = {};
            if (report !== undefined) Object.assign(done, { proxy: assigned.proxy, result: report[0] });
            if (report?.[1] !== undefined) done.status = report[1];
            if (lease !== undefined) done.lease = lease;
            this.#client.deferDone(this.#pool, done, (settled) => this.#settled(done, settled));
            return;
        }
        if (report !== undefined) await this.#report(assigned.proxy, report[0], report[1]);
        if (lease === undefined) return;
        try {
            await this.#client.release(this.#pool, lease);
            this.stats.released += 1;
        } catch (error) {
            this.stats.releaseFailed += 1;
            this.#warn(`lease release failed: ${(error as Error).message}`);
        }
    }

    /** Counts what became of a retirement's `done`, as the separate calls would have. */
    #settled(done: Done, settled: DoneSettled): void {
        if (settled.carried) this.stats.carried += 1;
        if (done.result !== undefined && settled.reportError) {
            this.stats.reportFailed += 1;
            this.#warn(`outcome report failed: ${settled.reportError.message}`);
        } else if (done.result !== undefined) {
            this.stats.reported[done.result] += 1;
            if (settled.effect?.effect === 'tripped') this.stats.tripped += 1;
        }
        if (done.lease === undefined) return;
        if (settled.releaseError) {
            this.stats.releaseFailed += 1;
            this.#warn(`lease release failed: ${settled.releaseError.message}`);
        } else if (settled.effect?.released === false) {
            this.stats.releaseFailed += 1;
            this.#warn(`lease release failed: lease ${done.lease} was no longer live`);
        } else {
            // Released, or carried by an assign answered 204, which applied it all the same.
            this.stats.released += 1;
        }
    }
}

/**
 * Codes of a connection to the proxy that ended without an answer: refused, closed
 * (Node's `socket hang up` carries `ECONNRESET` too) or reset by the proxy, or broken
 * while the request was being written to it.
 */
const PROXY_CONNECTION_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE']);

/** What the message of a `SessionError` Crawlee made of a proxy error says (its list). */
const CRAWLEE_PROXY_ERRORS = /ECONNRESET|ECONNREFUSED|ERR_PROXY_CONNECTION_FAILED|ERR_TUNNEL_CONNECTION_FAILED|Proxy responded with/;

/**
 * Whether `error` failed a request on its connection to the proxy: the proxy refused,
 * closed (without an answer) or reset the connection, or refused the tunnel (`CONNECT`
 * answered 407 or 5xx: "The proxy responded with ..."). An error of got-scraping (Crawlee's
 * HTTP client) says so with its code and names the proxy the request went through in its
 * options; Crawlee turns those whose message it knows into a `SessionError` with that
 * message. Through a proxy the client's connection is to the proxy, which answers for a
 * site that fails behind it (a 502), as Crawlee's own proxy errors (`ECONNRESET`) assume.
 * Errors thrown by the request handler, a content type or page Crawlee refused, and
 * timeouts carry no such options, codes or messages.
 */
function isProxyFailure(error: unknown): boolean {
    if (!(error instanceof Error)) return false;
    if (error instanceof SessionError) return CRAWLEE_PROXY_ERRORS.test(error.message);
    const proxyUrl = (error as { options?: { context?: { proxyUrl?: unknown } } }).options?.context?.proxyUrl;
    if (typeof proxyUrl !== 'string') return false;
    const code = (error as { code?: unknown }).code;
    return (typeof code === 'string' && PROXY_CONNECTION_CODES.has(code)) || /\bproxy responded with\b/i.test(error.message);
}

/** A Crawlee session that tells the adapter what happened to its requests. */
class ReportingSession extends Session {
    readonly #adapter: ProxyAllocatorProxies;
    #blockedStatus: number | undefined;
    /** Set while a retirement follows an outcome already reported (or none to report). */
    #reported = false;

    constructor(adapter: ProxyAllocatorProxies, options: SessionOptions) {
        super(options);
        this.#adapter = adapter;
    }

    override markGood(): void {
        this.#adapter.outcome(this, 'ok');
        // A session retired for its age or usage count says nothing more about the proxy.
        this.#quietly(() => super.markGood());
    }

    override markBad(): void {
        // A request that failed on its connection to the proxy and did not retire the
        // session: retired as Crawlee retires on a session error, reporting `failed`.
        // Anything else is not a report (see the module's doc); a session error Crawlee
        // retries on retired the session (and reported) before this.
        if (this.#adapter.proxyFailed(this)) this.retire();
        this.#quietly(() => super.markBad());
    }

    override retireOnBlockedStatusCodes(statusCode: number, additionalBlockedStatusCodes: number[] = []): boolean {
        // Crawlee decides what is blocked (its session pool's blockedStatusCodes) and then
        // retires the session: retire() below reports with this status.
        this.#blockedStatus = statusCode;
        try {
            return super.retireOnBlockedStatusCodes(statusCode, additionalBlockedStatusCodes);
        } finally {
            this.#blockedStatus = undefined;
        }
    }

    /** Retires the session for a proxy the service took out: nothing more to report. */
    retireQuietly(): void {
        this.#quietly(() => this.retire());
    }

    override retire(): void {
        let report: [Result, number | undefined] | undefined;
        if (this.#blockedStatus !== undefined) {
            report = ['blocked', this.#blockedStatus];
        } else if (!this.#reported) {
            // Crawlee rotating the session on a session error: for an HTTP crawler, a
            // proxy that refused or reset the connection or answered the tunnel with an
            // error (Crawlee's proxy errors), or a page its retryOnBlocked check found
            // blocked; or markBad after a request failed on its connection to the proxy.
            // The only failure report a session makes.
            report = ['failed', undefined];
        }
        super.retire();
        this.#adapter.retired(this, report);
    }

    #quietly(action: () => void): void {
        this.#reported = true;
        try {
            action();
        } finally {
            this.#reported = false;
        }
    }
}
