// Publish latency against a running Herald: one WebSocket client publishes one message at a
// time and times each acknowledgement (the reply with the offset). Measures what a publish
// hook adds (docs/benchmarks.md, "Hooks").
//
//   node scripts/publish-latency.mjs URL [CHANNEL=room:latency] [PUBLICATIONS=2000]
import WebSocket from "ws";

const [url, channel = "room:latency", total = "2000"] = process.argv.slice(2);
if (!url) {
  console.error("usage: node scripts/publish-latency.mjs http://127.0.0.1:8080 [CHANNEL] [PUBLICATIONS]");
  process.exit(2);
}
const ws = new WebSocket(url.replace(/^http/, "ws") + "/connection/websocket");
await new Promise((resolve, reject) => {
  ws.once("open", resolve);
  ws.once("error", reject);
});

let waiting = null;
ws.on("message", (data) => {
  for (const line of String(data).split("\n")) {
    const reply = JSON.parse(line);
    if (waiting !== null && reply.id === waiting.id) waiting.done(reply);
  }
});
const ask = (id, command) =>
  new Promise((resolve) => {
    waiting = { id, done: resolve };
    ws.send(JSON.stringify({ id, ...command }));
  });

const connected = await ask(1, { connect: {} });
if (connected.error) throw new Error(JSON.stringify(connected.error));
const micros = [];
for (let n = 0; n < Number(total); n++) {
  const started = process.hrtime.bigint();
  const reply = await ask(n + 2, { publish: { channel, data: { text: `message ${n}` } } });
  if (reply.error) throw new Error(JSON.stringify(reply.error));
  micros.push(Number(process.hrtime.bigint() - started) / 1000);
}
ws.close();
micros.sort((a, b) => a - b);
const at = (q) => +(micros[Math.min(micros.length - 1, Math.floor(q * micros.length))] / 1000).toFixed(3);
console.log(JSON.stringify({ publications: micros.length, p50_ms: at(0.5), p90_ms: at(0.9), p99_ms: at(0.99), max_ms: at(1) }));
