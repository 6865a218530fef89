/**
 * The worker's view of one lease (server/lease.ts): the transitions the
 * processor and the heartbeater drive, and the abort a handler sees. No
 * database: the lease is a state machine over the worker's own clock (the
 * processor and heartbeater tests drive it against PostgreSQL).
 */
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { describe } from 'node:test';
import { FailedPreconditionError, LeaseExpiredError, TaskCanceledError } from '../src/index.js';
import { DatabaseClock } from '../src/internal/clock.js';
import { Lease } from '../src/server/lease.js';
import { test } from './helpers.js';

const key = { queue: 'default', id: 't1', seq: '1', token: '00000000-0000-0000-0000-000000000000' };
/** A lease claimed now on `clock` (a clock of its own unless given). */
const held = (trustMs = 60_000, clock = new DatabaseClock()) => new Lease(key, trustMs, clock.now(), clock);

describe('lease', () => {
  test('a heartbeat that misses a held lease loses it: the handler is aborted with LeaseExpiredError', () => {
    const lease = held();
    const aborts: Error[] = [];
    lease.onAbort((r) => aborts.push(r));
    assert.equal(lease.heartbeats, true);
    assert.equal(lease.missed(), true);
    assert.equal(lease.state, 'lost');
    assert.equal(lease.heartbeats, false);
    assert.ok(aborts[0] instanceof LeaseExpiredError);
    assert.equal(aborts.length, 1);
    // The signal, first read after the abort, is already aborted with the same reason.
    assert.equal(lease.signal.aborted, true);
    assert.equal(lease.signal.reason, aborts[0]);
    lease.release();
  });

  test('a settled lease missed by a heartbeat stays settled: its outcome write decides', () => {
    const lease = held();
    lease.settle();
    assert.equal(lease.missed(), false);
    assert.equal(lease.state, 'settled');
    assert.equal(lease.heartbeats, true);
    assert.equal(lease.abortReason, undefined);
    lease.release();
  });

  test('ctx.transaction: not extended while open; committed is final, and a later loss does not abort the handler', () => {
    const lease = held();
    lease.beginTransaction();
    assert.equal(lease.heartbeats, false);
    assert.throws(() => lease.beginTransaction(), FailedPreconditionError);
    lease.endTransaction(true);
    assert.equal(lease.state, 'committed');
    assert.equal(lease.heartbeats, false);
    assert.throws(() => lease.beginTransaction(), /already completed by ctx.transaction/);
    lease.lose();
    assert.equal(lease.state, 'committed');
    assert.equal(lease.abortReason, undefined);
    lease.release();
  });

  test('a transaction that did not commit leaves the lease held; one that lost it leaves it lost', () => {
    const rolledBack = held();
    rolledBack.beginTransaction();
    rolledBack.endTransaction(false);
    assert.equal(rolledBack.state, 'held');
    rolledBack.release();

    const fenced = held();
    fenced.beginTransaction();
    fenced.lose();
    fenced.endTransaction(false);
    assert.equal(fenced.state, 'lost');
    assert.throws(() => fenced.beginTransaction(), LeaseExpiredError);
    fenced.release();
  });

  test('the first abort wins; the signal read before it follows it', () => {
    const lease = held();
    const signal = lease.signal;
    lease.abort(new TaskCanceledError());
    lease.lose();
    assert.ok(signal.reason instanceof TaskCanceledError);
    assert.ok(lease.abortReason instanceof TaskCanceledError);
    assert.equal(lease.state, 'lost');
    lease.release();
  });

  test('with no extension within trustMs of the last one sent, the lease is lost by its own timer', () => {
    const clock = new DatabaseClock();
    const lease = held(30_000, clock);
    const aborts: Error[] = [];
    lease.onAbort((r) => aborts.push(r));
    clock.advance(29_000);
    assert.equal(lease.state, 'held');
    // An extension sent now trusts the lease for trustMs from its sending.
    lease.extended(clock.now());
    clock.advance(29_000);
    assert.equal(lease.state, 'held', 'extended: 29 s into its new trust');
    clock.advance(1_000);
    assert.ok(aborts[0] instanceof LeaseExpiredError);
    assert.equal(lease.state, 'lost');
    assert.equal(aborts.length, 1);
    // A released lease is left alone: nothing fires after release.
    const other = held(20, clock);
    other.release();
    clock.advance(60_000);
    assert.equal(other.state, 'released');
    assert.equal(other.abortReason, undefined);
  });

  test('a monotonic clock that stepped back while an extension was out loses the lease, never extends it', () => {
    const sentAt = performance.now();
    const lease = held(60_000);
    const real = performance.now.bind(performance);
    // The clock now reads 10 s before the extension was sent.
    performance.now = () => real() - 10_000 - (real() - sentAt);
    try {
      lease.extended(sentAt);
    } finally {
      performance.now = real;
    }
    assert.equal(lease.state, 'lost');
    assert.ok(lease.abortReason instanceof LeaseExpiredError);
    // The same at claim: a lease whose claim was sent "after" now is never trusted.
    performance.now = () => real() - 10_000;
    let late: Lease;
    try {
      late = new Lease(key, 60_000, real(), new DatabaseClock());
    } finally {
      performance.now = real;
    }
    assert.equal(late.state, 'lost');
    lease.release();
    late.release();
  });
});

describe('database clock (tests move it instead of sleeping)', () => {
  test('advance accumulates forward moves and refuses anything else', () => {
    const clock = new DatabaseClock();
    assert.equal(clock.offsetMs, 0);
    clock.advance(700);
    clock.advance(0);
    clock.advance(300);
    assert.equal(clock.offsetMs, 1000);
    for (const bad of [-1, Number.NaN, Number.POSITIVE_INFINITY]) assert.throws(() => clock.advance(bad), RangeError);
    assert.equal(clock.offsetMs, 1000);
  });

  test("the process's timers come due on the clock: advance fires them in their order, a cancelled one never", async () => {
    const clock = new DatabaseClock();
    const fired: string[] = [];
    const start = clock.now();
    clock.setTimeout(() => fired.push('b'), 2000);
    clock.setTimeout(() => fired.push('a'), 1000);
    const c = clock.setTimeout(() => fired.push('c'), 1500);
    // One that an earlier one cancels in the same advance does not fire either.
    const late = clock.setTimeout(() => fired.push('late'), 2500);
    clock.setTimeout(() => late.cancel(), 2400);
    c.cancel();
    // (Real time counts too: well short of the first, so that a slow turn cannot reach it.)
    clock.advance(500);
    assert.deepEqual(fired, []);
    clock.advance(3000);
    assert.deepEqual(fired, ['a', 'b']);
    assert.ok(clock.now() - start >= 3500);
    const slept = clock.sleep(60_000);
    clock.advance(60_000);
    await slept;
    // Real time still counts: a timer of 1 ms fires without an advance.
    await new Promise<void>((resolve) => clock.setTimeout(resolve, 1));
  });

  test('timers due in one millisecond share a Node timer: each fires once, a cancelled one never, the others still', async () => {
    const clock = new DatabaseClock();
    // A claim's leases: one due time, one Node timer, each fired once, a cancelled one never.
    const fired: number[] = [];
    const timers = Array.from({ length: 100 }, (_, i) => clock.setTimeout(() => fired.push(i), 5));
    timers[7]!.cancel();
    await new Promise<void>((resolve) => clock.setTimeout(resolve, 20));
    assert.deepEqual(
      fired,
      [...Array(100).keys()].filter((i) => i !== 7),
    );
  });

  test('a timer set after an advance fires in its own real time, never with one set before the advance', async () => {
    const clock = new DatabaseClock();
    const early = clock.setTimeout(() => {}, 10_000);
    clock.advance(9_990);
    // On the clock, one of these comes due in the very millisecond the 10 s timer does, whose
    // Node timer fires 10 s from its start: each must fire within its own delay of real time.
    const fired = await Promise.race([
      Promise.all(Array.from({ length: 41 }, (_, d) => new Promise<void>((resolve) => clock.setTimeout(resolve, d)))).then(() => true),
      new Promise<false>((resolve) => setTimeout(() => resolve(false), 2_000)),
    ]);
    early.cancel();
    assert.equal(fired, true, 'every timer of 0–40 ms fired within 2 s');
  });
});
