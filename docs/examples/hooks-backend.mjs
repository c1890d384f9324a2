// An application backend for Herald's hooks (docs/hooks.md), with no dependencies:
//   node docs/examples/hooks-backend.mjs            # listens on 127.0.0.1:3000 (PORT to change)
// Sessions are cookies (`session=alice-secret`), rooms keep their messages in memory (the
// "database"), and every event Herald posts is logged once, by id.
import { createServer } from "node:http";

const sessions = { "alice-secret": { user: "alice", name: "Alice" }, "bob-secret": { user: "bob", name: "Bob" } };
const rooms = new Map(); // room channel -> stored messages
const seenEvents = new Set();

const ok = (result) => ({ result });
const refuse = (code, message) => ({ error: { code, message } });

/** The one access rule, asked by every hook that reads or writes a room: `room:staff` is
 * alice's only. Keep such a rule in one place, so that no way in forgets it. */
const mayUse = (user, room) => room !== "room:staff" || user === "alice";

/** Answers one hook request: `path` is the hook's, `body` what Herald posted. */
export function handle(path, body) {
  switch (path) {
    case "/connect": {
      const session = sessions[body.cookies?.session];
      if (session === undefined) return ok({}); // anonymous: the namespace rules decide
      return ok({ user: session.user, info: { name: session.name }, subscribe: ["room:*"] });
    }
    case "/subscribe": {
      if (!mayUse(body.user, body.channel)) return refuse(1003, "staff only");
      const messages = rooms.get(body.channel) ?? [];
      // `info`: this connection's role in the room, shown with its presence (Phoenix metas).
      const role = body.user === "alice" ? "host" : "guest";
      return ok({ data: { topic: `Welcome to ${body.channel}`, messages: messages.length }, info: { role } });
    }
    case "/publish": {
      if (!mayUse(body.user, body.channel)) return refuse(1003, "staff only");
      const text = body.data?.text;
      if (typeof text !== "string" || text.trim() === "") return refuse(1001, "a message needs text");
      // Store, then broadcast: Herald publishes what this answers.
      const stored = { id: crypto.randomUUID(), text: text.trim(), by: body.user ?? "guest", at: Date.now() };
      rooms.set(body.channel, [...(rooms.get(body.channel) ?? []), stored]);
      return ok({ data: stored });
    }
    case "/rpc":
      if (body.method === "whoami") return ok({ data: { user: body.user ?? null, transport: body.transport } });
      if (body.method === "messages") {
        const room = body.data?.room;
        if (typeof room !== "string" || !mayUse(body.user, room)) return refuse(1003, "not your room");
        return ok({ data: rooms.get(room) ?? [] });
      }
      return refuse(1004, `unknown method ${body.method}`);
    case "/events":
      for (const event of body.events) {
        if (seenEvents.has(event.id)) continue; // delivered again after a retry
        seenEvents.add(event.id);
        console.log(`${event.type} ${event.client} ${event.user ?? "(anonymous)"} ${event.channel ?? ""}`);
      }
      if (body.dropped || body.lost_batches) console.log(`missed: ${body.dropped ?? 0} events, ${body.lost_batches ?? 0} batches`);
      return ok({});
    default:
      return undefined;
  }
}

/** An HTTP server answering hooks with `handle`. */
export function server() {
  return createServer((req, res) => {
    let text = "";
    req.on("data", (chunk) => (text += chunk));
    req.on("end", () => {
      let answer;
      try {
        answer = req.method === "POST" ? handle(req.url, JSON.parse(text)) : undefined;
      } catch {
        // Not JSON, or not the shape Herald sends: say so, and keep serving.
        res.writeHead(400, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: "not a hook request" }));
        return;
      }
      res.writeHead(answer === undefined ? 404 : 200, { "content-type": "application/json" });
      res.end(JSON.stringify(answer ?? { error: "not a hook" }));
    });
  });
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const port = Number(process.env.PORT ?? 3000);
  server().listen(port, "127.0.0.1", () => console.log(`hooks backend on http://127.0.0.1:${port}`));
}
