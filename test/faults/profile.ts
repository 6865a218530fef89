/**
 * The fast profile (reliability plan §5.0) the fault suite's workers run on,
 * and the bounds it gives.
 */

/**
 * The fast profile, in the Server's option names. The forwarder checks every
 * 500 ms and retries wait 0.5–1 s (jittered), so rescued tasks come back
 * quickly (both only shorten the tests, not the bounds under test).
 */
export const FAST = {
  leaseDuration: 3000,
  heartbeatInterval: 1000,
  recoverCutoff: 2000,
  recoverInterval: 1000,
  taskCheckInterval: 1000,
  delayedTaskCheckInterval: 500,
  shutdownTimeout: 6000,
  retryDelayMs: 500,
} as const;
export type Profile = { [K in keyof typeof FAST]: number };

/** B = L + C + R + 1 s of statement slack, from the last successful heartbeat (plan §5.0). */
export const BOUND_S = (FAST.leaseDuration + FAST.recoverCutoff + FAST.recoverInterval) / 1000 + 1;
/** The oracle allows 1 s of scheduler jitter on top of B. */
export const ORACLE_BOUND_S = BOUND_S + 1;
