// A CommonJS TypeScript file that imports pgasynq, an ES module: it typechecks under
// "module": "nodenext" (TypeScript models Node's require() of ESM there); under "node16" it is
// TS1479, as the README says.
import { Client, Task } from 'pgasynq';

export const task: Task<{ a: number }> = new Task('cts:check', { a: 1 });
export const makeClient = (): Client => new Client({ logger: false });
