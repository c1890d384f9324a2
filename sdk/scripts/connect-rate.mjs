// Connects per second against a running Herald: each connection opens a WebSocket, sends
// `connect` (with a token when given), waits for the reply and closes. Measures the cost
// of checking tokens at connect (docs/benchmarks.md, "Tokens").
//
//   node scripts/connect-rate.mjs URL [TOKEN] [CONNECTIONS=5000] [CONCURRENCY=50]
import WebSocket from "ws";

const [url, token = "", total = "5000", concurrency = "50"] = process.argv.slice(2);
if (!url) {
  console.error("usage: node scripts/connect-rate.mjs http://127.0.0.1:8080 [TOKEN] [CONNECTIONS] [CONCURRENCY]");
  process.exit(2);
}
const wsUrl = url.replace(/^http/, "ws") + "/connection/websocket";
const connect = JSON.stringify({ id: 1, connect: token ? { token } : {} });

function once() {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(wsUrl);
    ws.on("open", () => ws.send(connect));
    ws.on("message", (data) => {
      const reply = JSON.parse(String(data).split("\n")[0]);
      ws.close();
      if (reply.error) reject(new Error(JSON.stringify(reply.error)));
      else resolve();
    });
    ws.on("close", (code) => {
      if (code !== 1005 && code !== 1000) reject(new Error(`closed with ${code}`));
    });
    ws.on("error", reject);
  });
}

let left = Number(total);
const started = process.hrtime.bigint();
await Promise.all(
  Array.from({ length: Number(concurrency) }, async () => {
    while (left > 0) {
      left -= 1;
      await once();
    }
  }),
);
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
console.log(JSON.stringify({ connections: Number(total), seconds: +seconds.toFixed(3), per_second: Math.round(Number(total) / seconds) }));
