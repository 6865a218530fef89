/**
 * Workflows at enqueue: checks the dependency graph of one enqueue call and
 * decides how each task starts. The broker locked the dependencies that were
 * already stored (so none can finish meanwhile) and reports their states; the
 * tasks of the call depend on those and on each other.
 *
 * A task starts `archived` when a dependency already failed and its policy is
 * 'archive' (and so, in turn, do the call's tasks that depend on it);
 * otherwise it waits for the dependencies that have not finished, and starts
 * as any task does when there are none. A dependency already completed counts
 * as done; one already archived counts as failed.
 */
import { InvalidOptionError, TaskNotFoundError } from './errors.js';
import { taskName, type TaskRecord, type TaskRef, type TaskState } from './task.js';

/** A stored dependency, as the broker locked it. */
export interface StoredDependency {
  seq: string;
  state: TaskState;
  grouped: boolean;
}

/** One edge to write: a dependency of the call's task `dependent` (an index into the records). */
export interface PlannedEdge {
  dependent: number;
  /** The dependency: another task of the call (an index), or a stored one (its seq). */
  dependency: { index: number } | { seq: string };
  ref: TaskRef;
  onFailure: 'archive' | 'run';
  /** Settled already: the stored dependency has finished. */
  outcome: 'completed' | 'failed' | null;
}

/** How one task of the call starts. */
export interface PlannedTask {
  /** Dependencies not finished; null for a task without any. */
  waitingFor: number | null;
  /** The error of a task archived at once because a dependency failed. */
  archivedBecause: string | null;
  /** Another task of the call depends on it. */
  hasDependents: boolean;
}

export interface DependencyPlan {
  tasks: PlannedTask[];
  edges: PlannedEdge[];
  /** The stored dependencies, whose rows must learn they have dependents. */
  stored: string[];
}

/** The dependencies of a call that are not tasks of the call (to be looked up). */
export function storedDependencies(records: readonly TaskRecord[]): TaskRef[] {
  const inCall = new Set(records.map(taskName));
  const out = new Map<string, TaskRef>();
  for (const r of records) for (const d of r.dependsOn) if (!inCall.has(taskName(d))) out.set(taskName(d), d);
  return [...out.values()];
}

/**
 * Refuses a cycle among the call's tasks, a dependency that does not exist
 * (TaskNotFoundError) or belongs to a group, and plans the rest.
 */
export function planDependencies(records: readonly TaskRecord[], stored: ReadonlyMap<string, StoredDependency>): DependencyPlan {
  const index = new Map(records.map((r, i) => [taskName(r), i]));
  const order = topologicalOrder(records, index);
  const tasks: PlannedTask[] = records.map((r) => ({ waitingFor: r.dependsOn.length > 0 ? 0 : null, archivedBecause: null, hasDependents: false }));
  const edges: PlannedEdge[] = [];
  const storedSeqs = new Set<string>();
  for (const n of order) {
    const r = records[n]!;
    const task = tasks[n]!;
    for (const ref of r.dependsOn) {
      const name = taskName(ref);
      const j = index.get(name);
      let outcome: PlannedEdge['outcome'] = null;
      let dependency: PlannedEdge['dependency'];
      if (j !== undefined) {
        tasks[j]!.hasDependents = true;
        // Earlier in the order: already planned. One archived at once has failed.
        if (tasks[j]!.archivedBecause !== null) outcome = 'failed';
        dependency = { index: j };
      } else {
        const s = stored.get(name);
        if (s === undefined) throw new TaskNotFoundError(ref.queue, ref.id);
        if (s.grouped) throw new InvalidOptionError('dependsOn', `names ${name}, which belongs to a group: grouped tasks are merged and cannot be waited for`);
        if (s.state === 'completed') outcome = 'completed';
        else if (s.state === 'archived') outcome = 'failed';
        storedSeqs.add(s.seq);
        dependency = { seq: s.seq };
      }
      if (outcome === null) task.waitingFor! += 1;
      if (outcome === 'failed' && r.onDependencyFailure === 'archive') task.archivedBecause ??= `dependency ${name} failed`;
      edges.push({ dependent: n, dependency, ref, onFailure: r.onDependencyFailure, outcome });
    }
  }
  return { tasks, edges, stored: [...storedSeqs] };
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
