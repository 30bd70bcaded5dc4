/**
 * Client for the proxy-allocator service, for workers written for Node (20 or later).
 *
 * No runtime dependency: calls go through Node's own `fetch`, whose connection pool keeps
 * connections alive between calls. `proxy-allocator/crawlee` adapts it to Crawlee.
 *
 * @module
 */

/** The outcomes a worker may report, as the service names them. */
export const RESULTS = ['ok', 'failed', 'blocked'] as const;

/** One of {@link RESULTS}. */
export type Result = (typeof RESULTS)[number];

/** Milliseconds a call may take before it fails with {@link Unreachable}. */
export const DEFAULT_TIMEOUT_MS = 10_000;

/**
 * Milliseconds a release {@link Client.lease} leaves pending waits for the next assign on
 * its pool to carry it, before it is sent on its own.
 */
export const DEFAULT_RELEASE_DELAY_MS = 200;

/** A live lease on a least-in-flight pool: its id, expiry (RFC 3339) and ttl. */
export interface Lease {
    id: string;
    expiresAt: string;
    ttlMs: number;
}

/**
 * A member handed out by {@link Client.assign}: `assignments` is its count after this
 * assignment; on a least-in-flight pool `inFlight` and `lease` are set too.
 */
export interface Assignment {
    pool: string;
    proxy: string;
    assignments: number;
    inFlight?: number;
    lease?: Lease;
    /** Set for an assign with a `session`. */
    session?: SessionPin;
    /** Set for an assign that carried `done`: what the service did with it. */
    done?: DoneEffect;
}

/**
 * How the worker's previous request through the pool ended, sent with the next assign
 * instead of a report and a release of their own: the service applies it first, in the
 * same atomic step as the pick, so a proxy the report takes out is not handed out again.
 * `proxy` and `result` (with `status` and `target` as in {@link Client.report}) report an
 * outcome; `lease` (an `assignment.lease.id`) releases a lease, with an optional `result`
 * about its proxy.
 */
export interface Done {
    proxy?: string;
    result?: Result;
    status?: number;
    target?: string;
    lease?: string;
}

/**
 * What an assign's {@link Done} did: the report's `effect` (as {@link AppliedOutcome}, or
 * `unknown` for a proxy the pool does not have; absent without a result), the proxy's
 * failure streak and ban, and whether the lease was live and is now released. An unknown
 * proxy or lease never fails the assign.
 */
export interface DoneEffect {
    released: boolean;
    proxy?: string;
    effect?: AppliedOutcome['effect'] | 'returned' | 'unknown';
    consecutiveFailures?: number;
    bannedUntil?: string;
}

/**
 * The sticky session an assign went through: its id, when it ends unless used again
 * (RFC 3339, the service's clock), and whether this assign pinned a fresh member because
 * the session's one was no longer eligible for the request.
 */
export interface SessionPin {
    id: string;
    expiresAt: string;
    repinned: boolean;
}

/** What one report did, as the service answers it. */
export interface AppliedOutcome {
    proxy: string;
    result: Result;
    /**
     * `counted`, `tripped` (the report took the proxy out), `ignored` (it was out), or
     * `banned` (a `blocked` report with a target banned it for that target only).
     */
    effect: 'counted' | 'tripped' | 'ignored' | 'banned';
    consecutive_failures: number;
    /** For a report with a target: the target, and until when (RFC 3339) it bans the proxy. */
    target?: string;
    banned_until?: string;
}

/**
 * A label filter: for every key, the value a member must carry, or a list of accepted ones
 * (`{ country: 'de' }`, `{ country: ['de', 'fr'] }`).
 */
export type Labels = Record<string, string | readonly string[]>;

/** The service's answer to an outcome report. */
export interface ReportAnswer {
    pool: string;
    outcomes: AppliedOutcome[];
    unknown: string[];
    rejected: { input: string; reason: string }[];
}

/** An error answer of the service, or no answer at all (`status` is then `null`). */
export class ProxyAllocatorError extends Error {
    constructor(
        /** The HTTP status, `null` when the service could not be reached. */
        readonly status: number | null,
        /** The service's stable snake_case error code. */
        readonly code: string,
        message: string,
    ) {
        super(`${message} (${code}${status === null ? '' : `, HTTP ${status}`})`);
        this.name = new.target.name;
    }
}

/** 401: no token, or one the service does not accept on this route. */
export class Unauthorized extends ProxyAllocatorError {}

/** 403: the worker token on an admin route. */
export class Forbidden extends ProxyAllocatorError {}

/** 404: `code` says what is missing (`pool_not_found`, `lease_not_found`, `not_found`). */
export class NotFound extends ProxyAllocatorError {}

/** 503: the store is unavailable; retry after `retryAfter` seconds. Also {@link Unreachable}. */
export class Unavailable extends ProxyAllocatorError {
    constructor(
        status: number | null,
        code: string,
        message: string,
        /** `Retry-After` in seconds, when the service named one. */
        readonly retryAfter: number | null = null,
    ) {
        super(status, code, message);
    }
}

/** No answer: refused, reset or timed out. */
export class Unreachable extends Unavailable {}

/** 204: the pool has no member to give; `retryAfter` is when the first cooling one returns. */
export class NoProxyAvailable extends ProxyAllocatorError {
    constructor(
        readonly pool: string,
        /** `Retry-After` in seconds; `null` when no member is cooling down. */
        readonly retryAfter: number | null = null,
    ) {
        super(204, 'no_proxy_available', `pool '${pool}' has no member to give right now`);
    }
}

/** Options of {@link Client}. */
export interface ClientOptions {
    /** The worker token, sent as `Authorization: Bearer <token>`. */
    token?: string | null;
    /** Milliseconds per call; default {@link DEFAULT_TIMEOUT_MS}. */
    timeoutMs?: number;
    /**
     * `true` (the default): when the function of {@link Client.lease} settles, its release
     * (with its outcome, when it reports one) waits as the `done` of the next assign on the
     * same pool from this client, so a steady loop of leases makes one call per cycle; it is
     * sent on its own after `releaseDelayMs` if no assign comes first, and by
     * {@link Client.close}. `false`: the lease is released, and reported, by calls of their
     * own when the function settles.
     */
    carryDone?: boolean;
    /** Milliseconds a pending release waits for an assign; default {@link DEFAULT_RELEASE_DELAY_MS}. */
    releaseDelayMs?: number;
}

/** Options of {@link Client.assign}. */
export interface AssignOptions {
    /** A lease ttl other than the pool's `lease_ttl_ms` (least-in-flight pools). */
    ttlMs?: number;
    /** Choose only among the members carrying these labels. */
    labels?: Labels;
    /**
     * The host the request will go to: members that host blocked (a `blocked` report with
     * this target) are skipped while their ban lasts, and per-target pacing applies.
     */
    target?: string;
    /**
     * Up to this many distinct members (1 to 100) in one call, each counted once: `assign`
     * then resolves to an array in the service's pick order (empty on 204).
     */
    count?: number;
    /**
     * A sticky session (1 to 128 visible ASCII characters): the same member for every
     * assign naming it while that member stays eligible for the request; a fresh pick,
     * pinned in its place, otherwise. Not with `count`.
     */
    session?: string;
    /** How long the session lives after this assign (1,000 ms to 24 h; the pool's default). */
    sessionTtlMs?: number;
    /**
     * The previous request's outcome and lease, applied before the pick in the same step
     * (also when the answer is 204): one call per request cycle instead of two. With
     * `count`, the first assignment carries its {@link DoneEffect}.
     */
    done?: Done;
    /**
     * Up to 100 member ids this call never hands out, as if they were ineligible for it: a
     * retry that moves on from the proxies it already tried.
     */
    exclude?: readonly string[];
    /** Throw {@link NoProxyAvailable} on 204 instead of returning `null` (or `[]`). */
    raiseIfEmpty?: boolean;
}

/** Options of {@link Client.report}. */
export interface ReportOptions {
    /** The host the request went to: a `blocked` report then bans the proxy for it only. */
    target?: string;
}

/** Options of {@link Client.lease}. */
export interface LeaseOptions {
    ttlMs?: number;
    /** As in {@link AssignOptions}; a `target` is also sent with the report. */
    labels?: Labels;
    target?: string;
    /** Renew the lease every third of its ttl while the function runs. */
    renew?: boolean;
    /** Report `ok` when the function resolves, `failed` when it throws, or its choice. */
    report?: boolean;
}

/**
 * What {@link Client.lease} passes to its function. Its `done` is set when its assign
 * carried the release an earlier lease left pending: what the service did with that one.
 */
export interface Leased extends Assignment {
    lease: Lease;
    /** Renewals so far. */
    renewals: number;
    /** Set when a renewal found the lease gone: the proxy may be someone else's. */
    lost: ProxyAllocatorError | null;
    /** Report this instead of `ok`/`failed` at the end (needs `report: true`). */
    reportAs(result: Result, status?: number): void;
}

interface Answer {
    status: number;
    data: unknown;
    retryAfter: number | null;
}

/**
 * What became of a {@link Done} left with {@link Client.deferDone}. Carried by an assign,
 * `effect` is the answer's `done` (absent after a 204, whose answer has no body: the
 * service applied it all the same). Sent on its own, `effect` is made from the release's
 * and the report's answers (a release answered `lease_not_found` is `released: false`, as
 * an assign says it), and a call that failed otherwise is its error here instead.
 *
 * @internal Used by {@link Client.lease} and the Crawlee adapter.
 */
export interface DoneSettled {
    effect?: DoneEffect;
    releaseError?: ProxyAllocatorError;
    reportError?: ProxyAllocatorError;
    /** Whether an assign carried it (else it went out on its own). */
    carried: boolean;
}

/** A `done` waiting for the next assign on its pool. */
interface PendingDone {
    pool: string;
    done: Done;
    /** When it is sent on its own unless an assign takes it first (`Date.now()` time). */
    deadline: number;
    timer: ReturnType<typeof setTimeout> | null;
    settled: (settled: DoneSettled) => void;
}

/** A client of one proxy-allocator service; share one per process. */
export class Client {
    readonly baseUrl: string;
    readonly timeoutMs: number;
    /** See {@link ClientOptions.carryDone}. */
    readonly carryDone: boolean;
    readonly releaseDelayMs: number;
    readonly #headers: Record<string, string>;
    /** Per pool, the dones waiting for an assign, oldest first. */
    readonly #pending = new Map<string, PendingDone[]>();
    /** Dones being sent on their own. */
    readonly #sending = new Set<Promise<void>>();
    /**
     * Registered on `beforeExit` while a done is pending: a process whose work is over
     * sends what is left instead of leaving its leases to their ttl, though the timers of
     * the pending dones do not keep it alive.
     */
    readonly #onBeforeExit = () => void this.close();

    constructor(baseUrl: string, options: ClientOptions = {}) {
        this.baseUrl = baseUrl.replace(/\/+$/, '');
        this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
        this.carryDone = options.carryDone ?? true;
        this.releaseDelayMs = options.releaseDelayMs ?? DEFAULT_RELEASE_DELAY_MS;
        this.#headers = { accept: 'application/json' };
        if (options.token) this.#headers.authorization = `Bearer ${options.token}`;
    }

    /**
     * Asks for a member of `pool`: `null` when it has none to give (204: skip the request),
     * or with `raiseIfEmpty` a {@link NoProxyAvailable} carrying `retryAfter`.
     *
     * @throws {NotFound} `pool_not_found`; {@link Unauthorized}, {@link Unavailable}, or
     *   {@link ProxyAllocatorError} for other error answers.
     */
    async assign(pool: string, options: AssignOptions & { count: number }): Promise<Assignment[]>;
    async assign(pool: string, options?: AssignOptions): Promise<Assignment | null>;
    async assign(pool: string, options: AssignOptions = {}): Promise<Assignment | Assignment[] | null> {
        const body = assignBody(options);
        // A pending done rides along unless the caller brought one (an assign carries one),
        // also on an assign naming a session (the service applies the done first).
        const carried = options.done === undefined ? this.#take(pool) : undefined;
        let answer: Answer;
        try {
            answer = await this.#call(
                `/pools/${segment(pool)}/assign`,
                carried === undefined ? body : { ...body, done: doneBody(carried.done) },
            );
        } catch (error) {
            // No answer, or an error one: it may not have been applied. It waits again
            // (until its own deadline), to be carried or sent on its own.
            if (carried !== undefined) this.#putBack(carried);
            throw error;
        }
        if (answer.status === 204 || answer.data === null) {
            if (carried !== undefined) settle(carried, { carried: true });
            if (options.raiseIfEmpty) throw new NoProxyAvailable(pool, answer.retryAfter);
            return options.count === undefined ? null : [];
        }
        const data = answer.data as Record<string, unknown>;
        const done = data.done === undefined ? undefined : doneFromJson(data.done);
        if (carried !== undefined) settle(carried, { carried: true, effect: done });
        if (options.count !== undefined) {
            const batch = (data.assigned as Record<string, unknown>[]).map(assignmentFromJson);
            if (batch.length > 0 && done !== undefined) batch[0].done = done;
            return batch;
        }
        return assignmentFromJson(data);
    }

    /**
     * Reports how a request through `proxy` went; the service's answer. With a `target`, a
     * `blocked` report bans the proxy for that host only.
     */
    async report(
        pool: string,
        proxy: string,
        result: Result,
        status?: number,
        options: ReportOptions = {},
    ): Promise<ReportAnswer> {
        if (!RESULTS.includes(result)) {
            throw new TypeError(`result is one of ${RESULTS.join(', ')}, not ${JSON.stringify(result)}`);
        }
        const body: Record<string, unknown> = { proxy, result };
        if (status !== undefined) body.status = status;
        if (options.target !== undefined) body.target = options.target;
        const answer = await this.#call(`/pools/${segment(pool)}/outcomes`, body);
        return expect(answer.data) as ReportAnswer;
    }

    /** Ends a sticky session. @throws {NotFound} `session_not_found` when it is not live. */
    async endSession(pool: string, session: string): Promise<void> {
        await this.#call(`/pools/${segment(pool)}/sessions/${segment(session)}`, undefined, 'DELETE');
    }

    /** Ends a lease. @throws {NotFound} `lease_not_found` when it is not live. */
    async release(pool: string, leaseId: string): Promise<void> {
        await this.#call(`/pools/${segment(pool)}/leases/${segment(leaseId)}/release`);
    }

    /** Extends a live lease to `ttlMs` from now (the pool's ttl when absent). */
    async renew(pool: string, leaseId: string, ttlMs?: number): Promise<Lease> {
        const answer = await this.#call(
            `/pools/${segment(pool)}/leases/${segment(leaseId)}/renew`,
            ttlBody(ttlMs),
        );
        return leaseFromJson((expect(answer.data) as Record<string, unknown>).lease);
    }

    /**
     * Holds a lease on a least-in-flight pool while `fn` runs, and releases it when `fn`
     * settles, also when it throws. With {@link ClientOptions.carryDone} (the default) the
     * release, with the outcome when `report` is set, waits for the next assign on the pool
     * from this client and goes as its `done`, or on its own after `releaseDelayMs`: so
     * the lease is held up to that long after `fn`. Failures to release or report, and a
     * lease found no longer live, are passed to `onWarning` (default: `console.warn`),
     * never thrown: `fn`'s own result matters more, and an unreleased lease is reclaimed
     * after its ttl.
     *
     * @throws {NoProxyAvailable} when the pool has nothing to give (204).
     */
    async lease<T>(
        pool: string,
        fn: (leased: Leased) => Promise<T>,
        options: LeaseOptions & { onWarning?: (message: string) => void } = {},
    ): Promise<T> {
        const warn = options.onWarning ?? ((message: string) => console.warn(message));
        const assigned = await this.assign(pool, {
            ttlMs: options.ttlMs,
            labels: options.labels,
            target: options.target,
            raiseIfEmpty: true,
        });
        if (assigned === null || assigned.lease === undefined) {
            throw new ProxyAllocatorError(200, 'no_lease', `pool '${pool}' gives no leases (least-used): use assign()`);
        }
        let chosen: [Result, number | undefined] | null = null;
        const leased: Leased = {
            ...assigned,
            lease: assigned.lease,
            renewals: 0,
            lost: null,
            reportAs(result: Result, status?: number) {
                chosen = [result, status];
            },
        };
        const renewer = options.renew ? renewInBackground(this, leased, warn) : null;
        let outcome: [Result, number | undefined];
        try {
            const value = await fn(leased);
            outcome = chosen ?? ['ok', undefined];
            return value;
        } catch (error) {
            outcome = chosen ?? ['failed', undefined];
            throw error;
        } finally {
            await renewer?.stop();
            if (this.carryDone) {
                const done: Done = { lease: leased.lease.id };
                if (options.report) {
                    // Assigned in both branches above before finally runs. The proxy too,
                    // so that the report counts even if the lease has lapsed.
                    done.proxy = leased.proxy;
                    done.result = outcome![0];
                    if (outcome![1] !== undefined) done.status = outcome![1];
                    if (options.target !== undefined) done.target = options.target;
                }
                this.deferDone(pool, done, (settled) => {
                    if (settled.releaseError) warn(`lease release failed: ${settled.releaseError.message}`);
                    else if (settled.effect?.released === false) warn(`lease release failed: lease ${done.lease} was no longer live`);
                    if (settled.reportError) warn(`outcome report failed: ${settled.reportError.message}`);
                });
            } else {
                try {
                    await this.release(pool, leased.lease.id);
                } catch (error) {
                    warn(`lease release failed: ${(error as Error).message}`);
                }
                if (options.report) {
                    try {
                        // Assigned in both branches above before finally runs.
                        await this.report(pool, leased.proxy, outcome![0], outcome![1], { target: options.target });
                    } catch (error) {
                        warn(`outcome report failed: ${(error as Error).message}`);
                    }
                }
            }
        }
    }

    /**
     * Sends every pending release (see {@link ClientOptions.carryDone}) now, on its own,
     * and waits until all are answered. Call it when the worker is done with the service;
     * a process that simply runs out of work does it by itself on `beforeExit` (not on
     * `process.exit()` or a signal). The client stays usable.
     */
    async close(): Promise<void> {
        for (const pool of [...this.#pending.keys()]) {
            for (let entry = this.#take(pool); entry !== undefined; entry = this.#take(pool)) this.#sendAlone(entry);
        }
        while (this.#sending.size > 0) await Promise.allSettled([...this.#sending]);
    }

    /**
     * Leaves `done` for the next assign on `pool` from this client to carry, or sends it on
     * its own after `releaseDelayMs` (or on {@link close}); `settled` hears what became of
     * it, once.
     *
     * @internal Used by {@link Client.lease} and the Crawlee adapter.
     */
    deferDone(pool: string, done: Done, settled: (settled: DoneSettled) => void): void {
        doneBody(done); // A done the service would refuse fails here, not in a later assign.
        const entry: PendingDone = { pool, done, deadline: Date.now() + this.releaseDelayMs, timer: null, settled };
        this.#queue(entry, 'last');
    }

    #queue(entry: PendingDone, where: 'first' | 'last'): void {
        if (this.#pending.size === 0) process.on('beforeExit', this.#onBeforeExit);
        const queue = this.#pending.get(entry.pool) ?? [];
        if (where === 'first') queue.unshift(entry);
        else queue.push(entry);
        this.#pending.set(entry.pool, queue);
        entry.timer = setTimeout(() => {
            const waiting = this.#pending.get(entry.pool);
            const at = waiting?.indexOf(entry) ?? -1;
            if (at < 0) return;
            waiting!.splice(at, 1);
            this.#forget(entry);
            this.#sendAlone(entry);
        }, Math.max(entry.deadline - Date.now(), 0));
        // The deadline bounds how long a lease is held, not how long the process lives.
        entry.timer.unref();
    }

    /** The oldest done pending for `pool`, no longer pending. */
    #take(pool: string): PendingDone | undefined {
        const entry = this.#pending.get(pool)?.shift();
        if (entry !== undefined) this.#forget(entry);
        return entry;
    }

    /** A done an assign failed to carry: first in line again, with its own deadline. */
    #putBack(entry: PendingDone): void {
        this.#queue(entry, 'first');
    }

    /** Stops `entry`'s timer and drops its pool's queue, and the exit hook, once empty. */
    #forget(entry: PendingDone): void {
        if (entry.timer !== null) clearTimeout(entry.timer);
        entry.timer = null;
        if (this.#pending.get(entry.pool)?.length === 0) this.#pending.delete(entry.pool);
        if (this.#pending.size === 0) process.off('beforeExit', this.#onBeforeExit);
    }

    /** Sends a done as today's separate calls would: the release, then the report. */
    #sendAlone(entry: PendingDone): void {
        const { pool, done } = entry;
        const work = (async () => {
            const settled: DoneSettled = { carried: false, effect: { released: false } };
            if (done.lease !== undefined) {
                try {
                    await this.release(pool, done.lease);
                    settled.effect!.released = true;
                } catch (error) {
                    if (!(error instanceof NotFound && error.code === 'lease_not_found')) {
                        settled.releaseError = asServiceError(error);
                    }
                }
            }
            if (done.result !== undefined && done.proxy !== undefined) {
                try {
                    const answer = await this.report(pool, done.proxy, done.result, done.status, { target: done.target });
                    const applied = answer.outcomes[0];
                    if (applied === undefined) settled.effect!.effect = 'unknown';
                    else {
                        Object.assign(settled.effect!, {
                            proxy: applied.proxy,
                            effect: applied.effect,
                            consecutiveFailures: applied.consecutive_failures,
                        });
                        if (applied.banned_until !== undefined) settled.effect!.bannedUntil = applied.banned_until;
                    }
                } catch (error) {
                    settled.reportError = asServiceError(error);
                }
            }
            settle(entry, settled);
        })();
        this.#sending.add(work);
        void work.finally(() => this.#sending.delete(work));
    }

    /** Sends one request (a POST unless told); the answer or the error it means. */
    async #call(path: string, body?: unknown, method = 'POST'): Promise<Answer> {
        const headers = { ...this.#headers };
        if (body !== undefined) headers['content-type'] = 'application/json';
        let response: Response;
        let raw: string;
        try {
            response = await fetch(this.baseUrl + path, {
                method,
                headers,
                body: body === undefined ? undefined : JSON.stringify(body),
                signal: AbortSignal.timeout(this.timeoutMs),
            });
            raw = await response.text();
        } catch (error) {
            const cause = (error as { cause?: { message?: string } }).cause?.message;
            throw new Unreachable(null, 'unreachable', `cannot reach ${this.baseUrl}: ${cause ?? (error as Error).message}`);
        }
        const retryAfter = parseRetryAfter(response.headers.get('retry-after'));
        if (response.status >= 300) throw errorFor(response.status, raw, retryAfter);
        return { status: response.status, data: raw ? JSON.parse(raw) : null, retryAfter };
    }
}

/** A lease being renewed: what {@link renewInBackground} updates. */
export interface Renewing {
    pool: string;
    lease: Lease;
    renewals: number;
    lost: ProxyAllocatorError | null;
}

/**
 * Renews `held.lease` every third of its ttl (with that ttl) until stopped or the lease is
 * found gone (`held.lost`). The timer does not keep the process alive.
 *
 * @internal Used by {@link Client.lease} and the Crawlee adapter.
 */
export function renewInBackground(
    client: Client,
    held: Renewing,
    warn: (message: string) => void,
): { stop(): Promise<void> } {
    const ttlMs = held.lease.ttlMs;
    let running: Promise<void> = Promise.resolve();
    let stopped = false;
    const timer = setInterval(() => {
        running = running.then(async () => {
            if (stopped || held.lost) return;
            try {
                // The lease's own ttl, not the pool's that a bare renewal would use.
                held.lease = await client.renew(held.pool, held.lease.id, ttlMs);
                held.renewals += 1;
            } catch (error) {
                if (error instanceof NotFound) {
                    held.lost = error;
                    clearInterval(timer);
                }
                warn(`lease renewal failed: ${(error as Error).message}`);
            }
        });
    }, Math.max(ttlMs / 3, 10));
    timer.unref();
    return {
        async stop() {
            stopped = true;
            clearInterval(timer);
            await running;
        },
    };
}

/**
 * Tells a pending done's owner what became of it. The owner's hooks (its `onWarning`) run
 * here, inside another caller's assign or on a timer: one that throws must fail neither.
 */
function settle(entry: PendingDone, settled: DoneSettled): void {
    try {
        entry.settled(settled);
    } catch (error) {
        console.error(`proxy-allocator: a hook on a released lease threw: ${(error as Error).message}`);
    }
}

/** A failure of a call as the service's error type (a programming error wrapped too). */
function asServiceError(error: unknown): ProxyAllocatorError {
    if (error instanceof ProxyAllocatorError) return error;
    return new ProxyAllocatorError(null, 'client_error', (error as Error).message);
}

function ttlBody(ttlMs: number | undefined): Record<string, unknown> | undefined {
    return ttlMs === undefined ? undefined : { ttl_ms: ttlMs };
}

/** The body of an assign, without a field the caller did not set (none: no body at all). */
function assignBody(options: AssignOptions): Record<string, unknown> | undefined {
    // New assign fields join here once the service accepts them: it refuses unknown ones.
    const body: Record<string, unknown> = {};
    if (options.ttlMs !== undefined) body.ttl_ms = options.ttlMs;
    if (options.labels !== undefined) body.labels = options.labels;
    if (options.target !== undefined) body.target = options.target;
    if (options.count !== undefined) body.count = options.count;
    if (options.session !== undefined) body.session = options.session;
    if (options.sessionTtlMs !== undefined) body.session_ttl_ms = options.sessionTtlMs;
    if (options.done !== undefined) body.done = doneBody(options.done);
    if (options.exclude !== undefined) body.exclude = [...options.exclude];
    return Object.keys(body).length === 0 ? undefined : body;
}

/** One path segment, escaped so that no id can reach another route. */
function segment(text: string): string {
    return encodeURIComponent(text);
}

function expect(data: unknown): unknown {
    if (data === null) throw new ProxyAllocatorError(null, 'empty_answer', 'the service answered without a body');
    return data;
}

function parseRetryAfter(value: string | null): number | null {
    if (value === null) return null;
    const seconds = Number(value);
    return Number.isFinite(seconds) ? seconds : null;
}

function errorFor(status: number, raw: string, retryAfter: number | null): ProxyAllocatorError {
    let code = `http_${status}`;
    let message = `HTTP ${status}`;
    try {
        const detail = JSON.parse(raw).error;
        if (typeof detail.code === 'string' && typeof detail.message === 'string') {
            ({ code, message } = detail);
        }
    } catch {
        // Not the service's error shape (a proxy or load balancer answered): the status is all.
    }
    switch (status) {
        case 401:
            return new Unauthorized(status, code, message);
        case 403:
            return new Forbidden(status, code, message);
        case 404:
            return new NotFound(status, code, message);
        case 503:
            return new Unavailable(status, code, message, retryAfter);
        default:
            return new ProxyAllocatorError(status, code, message);
    }
}

function leaseFromJson(data: unknown): Lease {
    const lease = data as Record<string, unknown>;
    return { id: String(lease.id), expiresAt: String(lease.expires_at), ttlMs: Number(lease.ttl_ms) };
}

function doneBody(done: Done): Record<string, unknown> {
    if (done.lease === undefined && (done.proxy === undefined || done.result === undefined)) {
        throw new TypeError('done needs a lease, or a proxy and a result');
    }
    if (done.result !== undefined && !RESULTS.includes(done.result)) {
        throw new TypeError(`result is one of ${RESULTS.join(', ')}, not ${JSON.stringify(done.result)}`);
    }
    const body: Record<string, unknown> = {};
    for (const [key, value] of Object.entries(done)) if (value !== undefined) body[key] = value;
    return body;
}

function doneFromJson(data: unknown): DoneEffect {
    const done = data as Record<string, unknown>;
    const effect: DoneEffect = { released: Boolean(done.released) };
    if (done.proxy !== undefined) effect.proxy = String(done.proxy);
    if (done.effect !== undefined) effect.effect = done.effect as DoneEffect['effect'];
    if (done.consecutive_failures !== undefined) effect.consecutiveFailures = Number(done.consecutive_failures);
    if (done.banned_until !== undefined) effect.bannedUntil = String(done.banned_until);
    return effect;
}

function assignmentFromJson(data: Record<string, unknown>): Assignment {
    const assignment: Assignment = {
        pool: String(data.pool),
        proxy: String(data.proxy),
        assignments: Number(data.assignments),
    };
    if (data.in_flight !== undefined) assignment.inFlight = Number(data.in_flight);
    if (data.lease !== undefined) assignment.lease = leaseFromJson(data.lease);
    if (data.session !== undefined) {
        const pin = data.session as Record<string, unknown>;
        assignment.session = { id: String(pin.id), expiresAt: String(pin.expires_at), repinned: Boolean(pin.repinned) };
    }
    if (data.done !== undefined) assignment.done = doneFromJson(data.done);
    return assignment;
}
