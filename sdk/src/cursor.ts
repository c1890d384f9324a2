/** The cursor: every channel's position in one string, `CHANNEL;EPOCH;OFFSET|…`
 * (docs/protocol.md, "The cursor"). HTTP transports resume with it. */

export interface Position {
  /** The newest offset the client has processed (0: nothing yet). */
  offset: number;
  /** The stream's epoch; offsets compare only within one epoch. Absent: accept any. */
  epoch?: string;
}

export function encodeCursor(positions: Iterable<[string, Position]>): string {
  const parts: string[] = [];
  for (const [channel, p] of positions) {
    parts.push(`${channel};${p.epoch ?? "*"};${p.offset}`);
  }
  return parts.join("|");
}

export function decodeCursor(cursor: string): Map<string, Position> {
  const out = new Map<string, Position>();
  if (cursor === "") return out;
  for (const entry of cursor.split("|")) {
    const fields = entry.split(";");
    if (fields.length !== 3) throw new Error(`cursor entry ${JSON.stringify(entry)} is not CHANNEL;EPOCH;OFFSET`);
    const [channel, epoch, offsetText] = fields as [string, string, string];
    const offset = Number(offsetText);
    if (channel === "" || epoch === "" || !/^\d+$/.test(offsetText) || !Number.isSafeInteger(offset)) {
      throw new Error(`cursor entry ${JSON.stringify(entry)} is not CHANNEL;EPOCH;OFFSET`);
    }
    out.set(channel, epoch === "*" ? { offset } : { offset, epoch });
  }
  return out;
}
