/**
 * The dashboard served at /dashboard. It signs in with an API key (kept in this tab's
 * sessionStorage), takes a ticket from /api/dashboard/ticket and subscribes with the SDK
 * (the global `Herald` from /herald.js, any transport) to `herald:stats`, where the nodes
 * publish a digest of their /metrics every second. Rates are worked out here, between a
 * node's consecutive digests. Admin actions call the HTTP API with the key.
 * Everything shown is set as text, never parsed as HTML.
 */
import uPlot from "uplot";
import type * as HeraldSdk from "../src/index.js";

declare const Herald: typeof HeraldSdk;

/** A node's digest (see crates/server/src/web/dashboard.rs): metric names without the
 * `herald_` prefix, numbers or objects by label value. */
interface Digest {
  node: string;
  t: number;
  uptime_seconds: number;
  [metric: string]: unknown;
}

type ByLabel = Record<string, number>;

/** Seconds of history the charts keep. */
const KEEP_SECONDS = 300;
const TRANSPORTS = ["websocket", "sse", "stream", "iframe", "longpoll", "poll"];
const MEANINGS: Record<string, string> = {
  "1000": "client left",
  "1001": "going away",
  "3001": "shutdown",
  "3002": "insufficient state",
  "3003": "slow consumer",
  "3004": "write error",
  "3005": "no ping",
  "3006": "server error",
  "3007": "force reconnect",
  "3008": "backend unavailable",
  "3009": "broker unreachable",
  "3500": "invalid token",
  "3501": "bad request",
  "3502": "forbidden",
  "3503": "message too large",
  "3504": "token expired",
  "3505": "connection limit",
};
const COLORS = ["#2f6fdf", "#e0662b", "#1f9d6b", "#b23bb5", "#c9a21b", "#6b7280", "#d03a5b", "#3aa8c9", "#7a5cff", "#8a6d3b"];

function element<T extends HTMLElement>(id: string): T {
  const found = document.getElementById(id);
  if (found === null) throw new Error(`the page has no #${id}`);
  return found as T;
}

function num(v: unknown): number {
  return typeof v === "number" && Number.isFinite(v) ? v : 0;
}

function byLabel(d: Digest | undefined, metric: string): ByLabel {
  const v = d?.[metric];
  return typeof v === "object" && v !== null ? (v as ByLabel) : {};
}

/** Per-second rates of a cumulative metric between two digests, by label. */
function rates(now: Digest, before: Digest | undefined, metric: string): ByLabel {
  const out: ByLabel = {};
  if (before === undefined) return out;
  const dt = (now.t - before.t) / 1000;
  if (dt <= 0) return out;
  const a = byLabel(now, metric);
  const b = byLabel(before, metric);
  for (const [k, v] of Object.entries(a)) out[k] = Math.max(0, (v - (b[k] ?? 0)) / dt);
  return out;
}

function rate(now: Digest, before: Digest | undefined, metric: string): number {
  if (before === undefined) return 0;
  const dt = (now.t - before.t) / 1000;
  return dt > 0 ? Math.max(0, (num(now[metric]) - num(before[metric])) / dt) : 0;
}

function sum(v: ByLabel): number {
  return Object.values(v).reduce((a, b) => a + b, 0);
}

function bytes(n: number): string {
  if (n >= 1 << 30) return `${(n / (1 << 30)).toFixed(1)} GiB`;
  if (n >= 1 << 20) return `${(n / (1 << 20)).toFixed(1)} MiB`;
  if (n >= 1 << 10) return `${(n / (1 << 10)).toFixed(1)} KiB`;
  return `${Math.round(n)} B`;
}

function duration(seconds: number): string {
  if (seconds >= 86400) return `${Math.floor(seconds / 86400)}d ${Math.floor((seconds % 86400) / 3600)}h`;
  if (seconds >= 3600) return `${Math.floor(seconds / 3600)}h ${Math.floor((seconds % 3600) / 60)}m`;
  if (seconds >= 60) return `${Math.floor(seconds / 60)}m ${Math.floor(seconds % 60)}s`;
  return `${Math.floor(seconds)}s`;
}

function fixed(n: number): string {
  return n >= 100 ? n.toFixed(0) : n >= 10 ? n.toFixed(1) : n.toFixed(2);
}

/** Replaces a table body's rows; each cell is text, or a node built by the caller. */
function fill(table: string, rows: (string | Node)[][]): void {
  const body = element<HTMLTableElement>(table).tBodies[0]!;
  body.replaceChildren(
    ...rows.map((cells) => {
      const tr = document.createElement("tr");
      for (const c of cells) {
        const td = document.createElement("td");
        if (typeof c === "string") td.textContent = c;
        else td.append(c);
        tr.append(td);
      }
      return tr;
    }),
  );
}

/** A node's latest digest and the rates since its previous one. */
interface NodeState {
  digest: Digest;
  deliveries: ByLabel;
  publications: number;
  namespaces: ByLabel;
  disconnects: ByLabel;
  threads: ByLabel;
  cpu: number;
}

const nodes = new Map<string, NodeState>();

/** A time series chart whose series (lines) may grow as new names appear. */
class Chart {
  private plot: uPlot | undefined;
  private names: string[] = [];
  private times: number[] = [];
  private columns = new Map<string, (number | null)[]>();

  constructor(
    private readonly target: HTMLElement,
    private readonly unit: string,
  ) {}

  add(time: number, values: Record<string, number | null>): void {
    for (const name of Object.keys(values)) {
      if (!this.columns.has(name)) this.columns.set(name, this.times.map(() => null));
    }
    this.times.push(time);
    for (const [name, column] of this.columns) column.push(values[name] ?? null);
    while (this.times.length > 0 && this.times[0]! < time - KEEP_SECONDS) {
      this.times.shift();
      for (const column of this.columns.values()) column.shift();
    }
    this.draw();
  }

  private draw(): void {
    const names = [...this.columns.keys()].sort();
    const data: uPlot.AlignedData = [this.times, ...names.map((n) => this.columns.get(n)!)];
    const width = Math.max(320, this.target.clientWidth || 560);
    if (this.plot === undefined || names.join() !== this.names.join()) {
      this.plot?.destroy();
      this.names = names;
      this.plot = new uPlot(
        {
          width,
          height: 220,
          series: [
            {},
            ...names.map((label, i) => ({
              label,
              stroke: COLORS[i % COLORS.length]!,
              width: 1.5,
              spanGaps: true,
              value: (_u: uPlot, v: number | null) => (v === null ? "-" : `${fixed(v)}${this.unit}`),
            })),
          ],
          axes: [{}, { size: 72, values: (_u, ticks) => ticks.map((t) => `${fixed(t)}${this.unit}`) }],
          scales: { y: { range: (_u, min, max) => [Math.min(0, min), Math.max(max * 1.1, 1e-3)] } },
        },
        data,
        this.target,
      );
    } else {
      this.plot.setData(data);
    }
  }

  /** Points drawn so far (for tests). */
  get points(): number {
    return this.times.length;
  }
}

const charts = {
  connections: new Chart(element("chart-connections"), ""),
  deliveries: new Chart(element("chart-deliveries"), "/s"),
  latency: new Chart(element("chart-latency"), " ms"),
  threads: new Chart(element("chart-threads"), "%"),
};

/** Totals by label of a counter over every node, kept for a minute of looks, to say how
 * many happened in the last minute. */
class MinuteTotals {
  private looks: { t: number; totals: ByLabel }[] = [];
  constructor(private readonly metric: string) {}

  /** This look's totals and, per label, how many of them are from the last minute. */
  look(time: number, all: NodeState[]): [string, number, number][] {
    const totals: ByLabel = {};
    for (const n of all) for (const [label, v] of Object.entries(byLabel(n.digest, this.metric))) totals[label] = (totals[label] ?? 0) + v;
    this.looks.push({ t: time, totals });
    while (this.looks.length > 1 && this.looks[0]!.t < time - 60) this.looks.shift();
    const minuteAgo = this.looks[0]!.totals;
    return Object.entries(totals)
      .sort((a, b) => b[1] - a[1])
      .map(([label, total]) => [label, total - (minuteAgo[label] ?? 0), total]);
  }
}

const disconnectTotals = new MinuteTotals("disconnects_total");
/** Clients refused by a limit (`herald_refusals_total`): behind a proxy that is not trusted,
 * per-address limits refuse the whole audience, and this is where an operator sees it. */
const refusalTotals = new MinuteTotals("refusals_total");

function onDigest(d: Digest): void {
  const previous = nodes.get(d.node);
  if (previous !== undefined && d.t <= previous.digest.t) return;
  const before = previous?.digest;
  const cpuDelta = before === undefined ? 0 : rate(d, before, "process_cpu_seconds_total");
  nodes.set(d.node, {
    digest: d,
    deliveries: rates(d, before, "pushes_total"),
    publications: rate(d, before, "publications_fanned_out_total"),
    namespaces: rates(d, before, "publications_total"),
    disconnects: rates(d, before, "disconnects_total"),
    threads: Object.fromEntries(Object.entries(rates(d, before, "thread_cpu_seconds_total")).map(([k, v]) => [k, v * 100])),
    cpu: cpuDelta * 100,
  });
}

/** Each node's latest percentile `KIND.pNN` (ms), null where it observed nothing. */
function latest(metric: string): (number | null)[] {
  const [kind, percentile] = metric.split(".") as [string, "p50" | "p99"];
  return [...nodes.values()].map((n) => {
    const v = (n.digest["latency_ms"] as Record<string, { p50?: number | null; p99?: number | null }> | undefined)?.[kind];
    return typeof v?.[percentile] === "number" ? v[percentile] : null;
  });
}

function render(): void {
  const all = [...nodes.values()];
  if (all.length === 0) return;
  const time = Math.max(...all.map((n) => n.digest.t)) / 1000;
  const several = all.length > 1;
  const short = (id: string) => id.slice(0, 6);

  const connections: Record<string, number> = {};
  const deliveries: Record<string, number> = {};
  for (const t of TRANSPORTS) {
    const open = sum(Object.fromEntries(all.map((n) => [n.digest.node, byLabel(n.digest, "connections")[t] ?? 0])));
    const rateOf = all.reduce((a, n) => a + (n.deliveries[t] ?? 0), 0);
    if (open > 0 || connections[t] !== undefined) connections[t] = open;
    if (rateOf > 0 || open > 0) deliveries[t] = rateOf;
  }
  charts.connections.add(time, connections);
  charts.deliveries.add(time, deliveries);
  // The worst node's; null (a gap) while no node observed any.
  const worst = (metric: string): number | null => {
    const seen = latest(metric).filter((v) => v !== null);
    return seen.length === 0 ? null : Math.max(...seen);
  };
  const deliveryP99 = worst("delivery.p99");
  charts.latency.add(time, {
    "publish p50": worst("publish.p50"),
    "publish p99": worst("publish.p99"),
    "delivery p50": worst("delivery.p50"),
    "delivery p99": deliveryP99,
  });
  if (deliveryP99 !== null) document.body.dataset["deliveryP99"] = fixed(deliveryP99);
  const threads: Record<string, number> = {};
  for (const n of all) {
    for (const [name, v] of Object.entries(n.threads)) threads[several ? `${short(n.digest.node)} ${name}` : name] = v;
  }
  charts.threads.add(time, threads);

  fill(
    "nodes",
    all
      .sort((a, b) => a.digest.node.localeCompare(b.digest.node))
      .map((n) => [
        n.digest.node,
        duration(n.digest.uptime_seconds),
        String(sum(byLabel(n.digest, "connections"))),
        fixed(sum(n.deliveries)),
        fixed(n.publications),
        `${fixed(n.cpu)}%`,
        bytes(num(n.digest["process_resident_memory_bytes"])),
        String(num(n.digest["process_open_fds"])),
        bytes(sum(byLabel(n.digest, "queued_bytes"))),
        brokerState(n.digest),
      ]),
  );

  const namespaces: Record<string, [number, number]> = {};
  for (const n of all) {
    for (const [ns, total] of Object.entries(byLabel(n.digest, "publications_total"))) {
      const entry = (namespaces[ns] ??= [0, 0]);
      entry[0] += n.namespaces[ns] ?? 0;
      entry[1] += total;
    }
  }
  fill(
    "namespaces",
    Object.entries(namespaces)
      .filter(([ns]) => ns !== "herald")
      .sort((a, b) => b[1][0] - a[1][0] || b[1][1] - a[1][1])
      .slice(0, 10)
      .map(([ns, [r, total]]) => [ns, fixed(r), String(total)]),
  );

  fill(
    "disconnects",
    disconnectTotals
      .look(time, all)
      .map(([code, minute, total]) => [code, MEANINGS[code] ?? (Number(code) >= 4000 ? "application" : ""), String(minute), String(total)]),
  );
  fill(
    "refusals",
    refusalTotals
      .look(time, all)
      .filter(([, , total]) => total > 0)
      .map(([limit, minute, total]) => [limit, String(minute), String(total)]),
  );

  const totalConnections = all.reduce((a, n) => a + sum(byLabel(n.digest, "connections")), 0);
  element("summary").textContent = `${all.length} node${several ? "s" : ""} · ${totalConnections} connections · ${fixed(all.reduce((a, n) => a + sum(n.deliveries), 0))} deliveries/s`;
  document.body.dataset["points"] = String(charts.deliveries.points);
  document.body.dataset["deliveries"] = fixed(all.reduce((a, n) => a + sum(n.deliveries), 0));
}

// --- signing in, and the API ---

const KEY_STORAGE = "herald-dashboard-key";
let client: HeraldSdk.Client | undefined;

function setState(state: string, text: string): void {
  document.body.dataset["state"] = state;
  element("state").textContent = text;
}

async function api(path: string, body?: unknown): Promise<Record<string, unknown>> {
  const key = sessionStorage.getItem(KEY_STORAGE) ?? "";
  const response = await fetch(path, {
    method: body === undefined ? "GET" : "POST",
    headers: { Authorization: `apikey ${key}`, ...(body === undefined ? {} : { "Content-Type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const answer = (await response.json().catch(() => ({}))) as Record<string, unknown>;
  if (!response.ok) {
    const error = answer["error"] as { message?: string } | undefined;
    throw new Error(error?.message ?? `HTTP ${response.status}`);
  }
  return answer;
}

async function ticket(): Promise<string> {
  const answer = await api("/api/dashboard/ticket");
  return String(answer["token"]);
}

async function start(): Promise<void> {
  setState("connecting", "signing in");
  let first: string;
  try {
    first = await ticket();
  } catch (e) {
    sessionStorage.removeItem(KEY_STORAGE);
    element("signin-error").textContent = `Not signed in: ${(e as Error).message}`;
    setState("signed-out", "signed out");
    element("signin").hidden = false;
    return;
  }
  element("signin").hidden = true;
  element("board").hidden = false;
  element("signout").hidden = false;
  let fresh: string | undefined = first;
  client = new Herald.Client(undefined, {
    // The first ticket, then a new one whenever the SDK asks (expiry, reconnects).
    getToken: async () => {
      const t = fresh ?? (await ticket());
      fresh = undefined;
      return t;
    },
  });
  client.on("connected", (ctx) => setState("connected", `live over ${ctx.transport}`));
  client.on("disconnected", (ctx) => setState("disconnected", `disconnected (${ctx.code})`));
  client.on("connecting", () => setState("connecting", "connecting"));
  const stats = client.newSubscription("herald:stats");
  stats.on("publication", (ctx) => {
    const sample = ctx.data as { nodes?: Digest[] };
    for (const d of sample.nodes ?? []) onDigest(d);
    render();
  });
  stats.subscribe();
  client.connect();
  void listChannels("");
}

element<HTMLFormElement>("signin").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(KEY_STORAGE, element<HTMLInputElement>("key").value);
  element<HTMLInputElement>("key").value = "";
  element("signin-error").textContent = "";
  void start();
});

element("signout").addEventListener("click", () => {
  sessionStorage.removeItem(KEY_STORAGE);
  client?.disconnect();
  location.reload();
});

// --- actions on connections ---

function say(text: string): void {
  element("action-result").textContent = text;
}

function button(label: string, action: () => Promise<void>): HTMLButtonElement {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.addEventListener("click", () => {
    action().catch((e: Error) => say(e.message));
  });
  return b;
}

async function lookUp(): Promise<void> {
  const kind = element<HTMLSelectElement>("lookup-kind").value;
  const who = element<HTMLInputElement>("lookup-who").value.trim();
  const answer = await api(`/api/connections?${kind}=${encodeURIComponent(who)}`);
  const connections = (answer["connections"] as Record<string, unknown>[] | undefined) ?? [];
  const code = () => Number(element<HTMLInputElement>("close-code").value) || 3007;
  say(`${connections.length} connection${connections.length === 1 ? "" : "s"}${answer["unreachable"] ? ` (nodes not answering: ${String(answer["unreachable"])})` : ""}`);
  fill(
    "connections",
    connections.map((c) => {
      const client = String(c["client"]);
      const channels = document.createElement("span");
      for (const channel of (c["channels"] as string[] | undefined) ?? []) {
        channels.append(
          channel,
          " ",
          button("unsubscribe", async () => {
            const done = await api("/api/unsubscribe", { client, channel });
            say(`unsubscribed ${String(done["unsubscribed"])} from ${channel}`);
            await lookUp();
          }),
          " ",
        );
      }
      return [
        client,
        String(c["user"] ?? ""),
        String(c["transport"]),
        String(c["node"]),
        new Date(Number(c["since"]) * 1000).toLocaleTimeString(),
        channels,
        button("disconnect", async () => {
          const done = await api("/api/disconnect", { client, code: code() });
          say(`disconnected ${String(done["disconnected"])} with ${code()}`);
          await lookUp();
        }),
      ];
    }),
  );
}

element<HTMLFormElement>("lookup").addEventListener("submit", (e) => {
  e.preventDefault();
  lookUp().catch((err: Error) => say(err.message));
});

let nextCursor: string | undefined;

async function listChannels(cursor: string): Promise<void> {
  const prefix = element<HTMLInputElement>("channel-prefix").value.trim();
  const query = new URLSearchParams({ limit: "20", prefix, ...(cursor === "" ? {} : { cursor }) });
  const answer = await api(`/api/channels?${query.toString()}`);
  const channels = (answer["channels"] as { channel: string; subscribers: number }[] | undefined) ?? [];
  fill("channels", channels.map((c) => [c.channel, String(c.subscribers)]));
  nextCursor = answer["cursor"] as string | undefined;
  element<HTMLButtonElement>("channel-next").disabled = nextCursor === undefined;
}

element<HTMLFormElement>("channel-list").addEventListener("submit", (e) => {
  e.preventDefault();
  listChannels("").catch((err: Error) => say(err.message));
});
element("channel-next").addEventListener("click", () => {
  if (nextCursor !== undefined) listChannels(nextCursor).catch((err: Error) => say(err.message));
});

if (sessionStorage.getItem(KEY_STORAGE) !== null) void start();

/** The broker column: unreachable (with how many times it was lost), or its lag; then how a
 * remote broker is laid out, and how often the node followed a moved primary or subscribed
 * again (each time catching up from history). */
function brokerState(digest: Digest): string {
  const parts: string[] = [];
  if (digest["broker_up"] !== undefined && num(digest["broker_up"]) === 0) {
    parts.push(`unreachable (lost ${num(digest["broker_losses_total"])}x)`);
  } else {
    const lag = digest["broker_lag_seconds"];
    parts.push(lag === undefined ? "-" : `${fixed(num(lag) * 1000)} ms`);
  }
  const topology = Object.keys(byLabel(digest, "broker_topology"))[0];
  if (topology !== undefined) parts.push(topology);
  const moves = num(digest["broker_moves_total"]);
  if (moves > 0) parts.push(`moved ${moves}x`);
  const again = num(digest["broker_resubscriptions_total"]);
  if (again > 0) parts.push(`resubscribed ${again}x`);
  return parts.join(" · ");
}
