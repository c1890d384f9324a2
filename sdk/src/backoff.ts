/** Reconnect delays: exponential growth with jitter, so that clients cut off together
 * (a server restart) do not all come back in the same instant. */

export interface BackoffOptions {
  /** The first delay, in milliseconds. */
  minDelay: number;
  /** The cap, in milliseconds. */
  maxDelay: number;
}

/**
 * The delay before attempt number `attempt` (0 for the first retry): a random value between
 * half and all of `min(maxDelay, minDelay * 2^attempt)` ("equal jitter": never zero, never
 * above the cap).
 */
export function backoffDelay(
  attempt: number,
  options: BackoffOptions,
  random: () => number = Math.random,
): number {
  const exponent = Math.min(Math.max(attempt, 0), 30);
  const ceiling = Math.min(options.maxDelay, options.minDelay * 2 ** exponent);
  const half = ceiling / 2;
  return Math.round(half + random() * half);
}
