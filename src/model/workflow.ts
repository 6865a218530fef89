/**
 * Workflows at enqueue: checks the dependency graph of one enqueue call. How
 * each task starts is the database's to decide (enqueue_tasks(), migration
 * 0009), from the stored dependencies it locks: a task starts `archived` when
 * a dependency already failed and its policy is 'archive' (and so, in turn,
 * do the call's tasks that depend on it); otherwise it waits for the
 * dependencies that have not finished, and starts as any task does when
 * there are none. A dependency already completed counts as done; one already
 * archived counts as failed. A dependency that does not exist is a
 * TaskNotFoundError, one in a group a ValidationError.
 */
import { InvalidOptionError } from './errors.js';
import { taskName, type TaskRecord } from './task.js';

/** Refuses a cycle among the call's tasks (a ValidationError naming it). */
export function checkDependencyGraph(records: readonly TaskRecord[]): void {
  topologicalOrder(records, new Map(records.map((r, i) => [taskName(r), i])));
}

/** The call's tasks, each after the tasks of the call it depends on; a cycle is a ValidationError naming it. */
function topologicalOrder(records: readonly TaskRecord[], index: ReadonlyMap<string, number>): number[] {
  const order: number[] = [];
  // 0: not visited, 1: on the current path, 2: done.
  const mark = new Uint8Array(records.length);
  const path: number[] = [];
  const visit = (start: number): void => {
    // Iterative depth-first search: a chain of thousands must not overflow the stack.
    const stack: { n: number; next: number }[] = [{ n: start, next: 0 }];
    mark[start] = 1;
    path.push(start);
    while (stack.length > 0) {
      const top = stack[stack.length - 1]!;
      const deps = records[top.n]!.dependsOn;
      if (top.next < deps.length) {
        const j = index.get(taskName(deps[top.next++]!));
        if (j === undefined || mark[j] === 2) continue;
        if (mark[j] === 1) {
          const cycle = [...path.slice(path.indexOf(j)), j].map((k) => taskName(records[k]!));
          throw new InvalidOptionError('dependsOn', `forms a cycle: ${cycle.join(' → ')}`);
        }
        mark[j] = 1;
        path.push(j);
        stack.push({ n: j, next: 0 });
      } else {
        stack.pop();
        path.pop();
        mark[top.n] = 2;
        order.push(top.n);
      }
    }
  };
  for (let n = 0; n < records.length; n++) if (mark[n] === 0) visit(n);
  return order;
}
