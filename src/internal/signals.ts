/**
 * The signals that end a `run()`: SIGTERM (what process managers send) and
 * SIGINT (Ctrl-C), as in asynq's signals_unix.go.
 */

/**
 * Whether this process has had SIGTERM or SIGINT while a run() waited for it. A process that is
 * told to stop stays told: a run() that comes later (a Scheduler's beside a Server's in one
 * Promise.all, whose start took longer) shuts down as soon as it has started, instead of waiting
 * for a signal that already came.
 */
let terminated = false;

/** Resolves on the first SIGTERM or SIGINT (at once if one came already); `cancel` removes its listeners. */
function untilTerminated(): { done: Promise<void>; cancel: () => void } {
  if (terminated) return { done: Promise.resolve(), cancel: () => {} };
  let cancel = () => {};
  const done = new Promise<void>((resolve) => {
    const onSignal = () => {
      terminated = true;
      cancel();
      resolve();
    };
    cancel = () => {
      process.off('SIGTERM', onSignal);
      process.off('SIGINT', onSignal);
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
  });
  return { done, cancel };
}

/**
 * What every run() does: start, wait for SIGTERM or SIGINT, shut down. The listeners are in
 * place before the start begins, so a signal during a slow start neither kills the process
 * halfway nor is lost: the shutdown follows the start. A start that fails removes them again.
 */
export async function runUntilTerminated(start: () => Promise<void>, shutdown: () => Promise<void>): Promise<void> {
  const signal = untilTerminated();
  try {
    await start();
  } catch (err) {
    signal.cancel();
    throw err;
  }
  await signal.done;
  await shutdown();
}
