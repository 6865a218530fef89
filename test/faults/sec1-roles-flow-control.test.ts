/**
 * SEC1 (R24), flow control (0007) and enqueue() in SQL (0008): the
 * least-privilege roles of `pgasynq roles` (set up as sec1.ts does, on a
 * cluster of this file's own). A producer enqueues from a trigger of its own
 * table and by calling enqueue() (nobody else may), the admin alone sets a
 * queue's limits, and a worker's Server claims within them (claim_limited()).
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { Client, Inspector, Task } from '../../src/index.js';
import { waitFor } from '../helpers.js';
import { as, assertNoneRefused, KINDS, refused, S, su, url, useRolesCluster, workerRoleServer, type LogLine } from './sec1.js';

useRolesCluster();

describe('SEC1 roles', () => {
  test('flow control: a producer enqueues in SQL (from a trigger), the admin sets limits, a worker claims within them', async () => {
    // The application's table, whose trigger enqueues as whoever inserts the row.
    await su.query(`
      CREATE TABLE public.orders (id int PRIMARY KEY, tenant text NOT NULL);
      CREATE FUNCTION public.orders_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        PERFORM "${S}".enqueue('order:confirm', jsonb_build_object('order', NEW.id), queue => 'lim',
                               task_id => 'order-' || NEW.id, concurrency_key => NEW.tenant);
        RETURN NEW;
      END
      $$;
      CREATE TRIGGER orders_enqueue AFTER INSERT ON public.orders FOR EACH ROW EXECUTE FUNCTION public.orders_enqueue();
      GRANT SELECT, INSERT ON public.orders TO ${KINDS.map((k) => `pgasynq_${k}`).join(', ')};`);
    try {
      // producer: the trigger, a call of its own, the library's enqueue with a priority and a key.
      await as('producer', "INSERT INTO public.orders SELECT g, 'tenant-' || (g % 2) FROM generate_series(1, 6) g");
      const direct = await as(
        'producer',
        "SELECT {{S}}.enqueue('order:confirm', '{\"order\": 0}', queue => 'lim', task_id => 'order-0', priority => 10, concurrency_key => 'tenant-0') AS id",
      );
      assert.equal(direct.rows[0].id, 'order-0');
      const producer = new Client({ connectionString: url('producer'), schema: S });
      try {
        const lib = await producer.enqueue(new Task('order:confirm', { order: 7 }), {
          queue: 'lim',
          taskId: 'order-7',
          priority: 10,
          concurrencyKey: 'tenant-1',
        });
        assert.deepEqual([lib.priority, lib.concurrencyKey], [10, 'tenant-1']);
      } finally {
        await producer.close();
      }
      await assert.rejects(as('producer', "SELECT {{S}}.enqueue('order:confirm', priority => 101)"), (err: { code?: string; column?: string }) => {
        assert.deepEqual([err.code, err.column], ['22023', 'priority']);
        return true;
      });
      // Nobody else may call enqueue(): not through a trigger, not directly.
      await refused(as('monitor', "INSERT INTO public.orders VALUES (100, 'x')"), 'monitor: the trigger calls enqueue()');
      for (const kind of ['worker', 'monitor', 'inspector', 'admin'] as const) {
        await refused(as(kind, "SELECT {{S}}.enqueue('order:confirm')"), `${kind}: enqueue()`);
      }
      assert.equal((await su.query('SELECT count(*)::int AS n FROM public.orders')).rows[0].n, 6);
      // The rule functions enqueue() calls are the owner's alone.
      for (const kind of KINDS.filter((k) => k !== 'owner')) {
        await refused(as(kind, "SELECT {{S}}.enqueue_text_rule('x', 1)"), `${kind}: enqueue_text_rule()`);
      }

      const inspector = new Inspector({ connectionString: url('inspector'), schema: S });
      try {
        const byTrigger = await inspector.getTaskInfo('lim', 'order-1');
        assert.deepEqual([byTrigger.state, byTrigger.payload, byTrigger.priority, byTrigger.concurrencyKey], ['pending', { order: 1 }, 0, 'tenant-1']);
        const byCall = await inspector.getTaskInfo('lim', 'order-0');
        assert.deepEqual([byCall.priority, byCall.concurrencyKey], [10, 'tenant-0']);
      } finally {
        await inspector.close();
      }

      // Only the admin sets limits.
      for (const kind of ['producer', 'worker', 'monitor', 'inspector'] as const) {
        await refused(as(kind, 'UPDATE {{S}}.queues SET concurrency = 1 WHERE false'), `${kind}: UPDATE queues.concurrency`);
        const i = new Inspector({ connectionString: url(kind), schema: S });
        try {
          await refused(i.setQueueLimits('lim', { concurrency: 1, keyConcurrency: null, rateLimit: null }), `${kind}: setQueueLimits`);
        } finally {
          await i.close();
        }
      }
      const admin = new Inspector({ connectionString: url('admin'), schema: S });
      try {
        await admin.setQueueLimits('lim', { concurrency: 2, keyConcurrency: 1, rateLimit: { limit: 100, interval: 60_000 } });
        assert.deepEqual((await admin.getQueueInfo('lim')).limits, { concurrency: 2, keyConcurrency: 1, rateLimit: { limit: 100, interval: 60_000 } });
      } finally {
        await admin.close();
      }
      // No Inspector action changes a task's priority: nobody but the owner does.
      await refused(as('admin', 'UPDATE {{S}}.tasks SET priority = 1 WHERE false'), 'admin: UPDATE tasks.priority');
      await refused(as('worker', 'UPDATE {{S}}.task_states SET priority = 1 WHERE false'), 'worker: UPDATE task_states.priority');
      await refused(as('producer', 'UPDATE {{S}}.task_states SET concurrency_key = NULL WHERE false'), 'producer: UPDATE task_states.concurrency_key');
      // claim_limited() is the worker's alone (0010: the owner's, granted to the worker).
      await refused(as('producer', "SELECT * FROM {{S}}.claim_limited(ARRAY['lim'], ARRAY[1], 1, 'me', 1000, 0)"), 'producer: claim_limited()');

      // worker: a Server claims the limited queue (claim_limited()), two at a time, one per tenant,
      // the priority-10 tasks first.
      const started: string[] = [];
      const running = new Map<string, string>();
      let most = 0;
      let twoOfOneTenant = false;
      const logs: LogLine[] = [];
      const server = workerRoleServer(logs, { queues: { lim: 1 } });
      try {
        await server.start(async (task, ctx) => {
          const tenant = `tenant-${(task.payload as { order: number }).order % 2}`;
          if ([...running.values()].includes(tenant)) twoOfOneTenant = true;
          running.set(ctx.taskId, tenant);
          started.push(ctx.taskId);
          most = Math.max(most, running.size);
          await new Promise((r) => setTimeout(r, 100));
          running.delete(ctx.taskId);
        });
        await waitFor(() => started.length === 8 && running.size === 0, 20_000, `every order confirmed (started: ${started.join(', ')})`);
      } finally {
        await server.shutdown();
      }
      assert.deepEqual(started.slice(0, 2).sort(), ['order-0', 'order-7'], `the priority-10 tasks first: ${started.join(', ')}`);
      assert.equal(most, 2, 'at most 2 active (concurrency)');
      assert.equal(twoOfOneTenant, false, 'one task per tenant at a time (keyConcurrency)');
      const starts = await su.query(`SELECT sum(tasks)::int AS n FROM "${S}".queue_starts WHERE queue = 'lim'`);
      assert.equal(starts.rows[0].n, 8, 'every start logged for the rate limit');
      assertNoneRefused(logs);
    } finally {
      await su.query('DROP TABLE public.orders; DROP FUNCTION public.orders_enqueue()');
    }
  });
});
