/**
 * Fossil deltas (https://fossil-scm.org/home/doc/trunk/www/delta_format.wiki), as Herald
 * sends them to a subscription made with `delta: "fossil"`: the next publication's data as
 * the difference from the previous one's. Applying one is a few lines, so the SDK keeps no
 * dependency for it; every delta carries a checksum of its result, which is checked.
 */

const DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~";
const VALUES = new Int8Array(128).fill(-1);
for (let i = 0; i < DIGITS.length; i++) VALUES[DIGITS.charCodeAt(i)] = i;

/** A delta that does not apply: the client resubscribes from its position. */
export class DeltaError extends Error {}

/** The bytes `delta` makes of `source`; throws `DeltaError` when it does not apply. */
export function applyDelta(source: Uint8Array, delta: Uint8Array): Uint8Array {
  let at = 0;
  const number = (): number => {
    const start = at;
    let value = 0;
    while (at < delta.length) {
      const c = delta[at]!;
      const digit = c < 128 ? VALUES[c]! : -1;
      if (digit < 0) break;
      value = value * 64 + digit;
      at++;
    }
    if (at === start) throw new DeltaError("a number expected");
    return value;
  };
  const size = number();
  if (delta[at++] !== 0x0a) throw new DeltaError("no newline after the size");
  const out = new Uint8Array(size);
  let written = 0;
  while (at < delta.length) {
    const count = number();
    const command = delta[at++];
    if (command === 0x40 /* @: copy from the source */) {
      const offset = number();
      if (delta[at++] !== 0x2c) throw new DeltaError("no comma after a copy");
      if (offset + count > source.length || written + count > size) throw new DeltaError("a copy past the end");
      out.set(source.subarray(offset, offset + count), written);
      written += count;
    } else if (command === 0x3a /* :: literal bytes */) {
      if (at + count > delta.length || written + count > size) throw new DeltaError("a literal past the end");
      out.set(delta.subarray(at, at + count), written);
      written += count;
      at += count;
    } else if (command === 0x3b /* ;: the checksum, and the end */) {
      if (written !== size) throw new DeltaError("the result is short");
      if (checksum(out) !== count) throw new DeltaError("bad checksum");
      return out;
    } else {
      throw new DeltaError("unknown command");
    }
  }
  throw new DeltaError("no end");
}

/** Fossil's checksum: the sum of the bytes as big-endian 32-bit words (the last padded). */
function checksum(bytes: Uint8Array): number {
  let sum = 0;
  let i = 0;
  for (; i + 4 <= bytes.length; i += 4) {
    sum = (sum + ((bytes[i]! << 24) >>> 0) + (bytes[i + 1]! << 16) + (bytes[i + 2]! << 8) + bytes[i + 3]!) >>> 0;
  }
  let last = 0;
  for (let shift = 24; i < bytes.length; i++, shift -= 8) last += bytes[i]! << shift;
  return (sum + (last >>> 0)) >>> 0;
}
