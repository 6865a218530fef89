/**
 * Snooze: a handler's way to say "not now" (River's JobSnooze). The task goes
 * back to scheduled, due in `delayMs`, with its retry count unchanged; the
 * attempt counts neither as processed nor as failed, and no errorHandler
 * hears of it. Its own file: it validates its delay, and validation sits
 * above the errors every other model file shares.
 */
import { onCauseChain, PgasynqError } from './errors.js';
import { duration } from './validate.js';

/** Thrown by a handler: run the task again in `delayMs` (database clock), without using a retry. */
export class Snooze extends PgasynqError {
  readonly code = 'ERR_SNOOZE';
  /** How long from now the task is due again, in ms. */
  readonly delayMs: number;

  /** @throws InvalidOptionError naming `delayMs` unless it is a finite number of ms in [0, 2,147,483,647]. */
  constructor(delayMs: number) {
    const ms = duration(delayMs, 'delayMs');
    super(`snoozed for ${ms} ms`);
    this.delayMs = ms;
  }
}

/** The Snooze on `err`'s cause chain, if any (a handler may wrap it). */
export const snoozeOf = (err: unknown): Snooze | undefined => onCauseChain(err, 'ERR_SNOOZE') as Snooze | undefined;
