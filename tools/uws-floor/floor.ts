// The uWebSockets floor `herald bench --floor` measures servers against: Bun's native
// pub/sub (uWebSockets underneath, one thread), with no protocol at all. A client opens
// `/ws/CHANNEL` and is subscribed to it; `POST /pub/CHANNEL` sends the body to every
// subscriber as one text frame. Nothing is stored, checked or acknowledged: what any real
// server does on top of this is its cost.
const server = Bun.serve({
  hostname: "127.0.0.1",
  port: Number(process.env.PORT ?? 0),
  async fetch(req, server) {
    const [, kind, channel] = new URL(req.url).pathname.split("/");
    if (kind === "ws" && channel && server.upgrade(req, { data: { channel } })) return;
    if (kind === "pub" && channel && req.method === "POST") {
      server.publish(channel, await req.text());
      return new Response("{}");
    }
    return new Response("not found", { status: 404 });
  },
  websocket: {
    open(ws) {
      ws.subscribe((ws.data as { channel: string }).channel);
    },
    message() {},
  },
});
console.log(`listening ${server.port}`);
