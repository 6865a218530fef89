/**
 * The signals that end a `run()`: SIGTERM (what process managers send) and
 * SIGINT (Ctrl-C), as in asynq's signals_unix.go.
 */

/** Resolves on the first SIGTERM or SIGINT, removing its listeners. */
export function untilTerminated(): Promise<void> {
  return new Promise<void>((resolve) => {
    const onSignal = () => {
      process.off('SIGTERM', onSignal);
      process.off('SIGINT', onSignal);
      resolve();
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
  });
}
