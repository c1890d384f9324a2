/**
 * The chat demo served at /chat. It uses the SDK exactly as a page would: the global
 * `Herald` from /herald.js. User text is only ever set as text, never parsed as HTML.
 */
import type * as HeraldSdk from "../src/index.js";

declare const Herald: typeof HeraldSdk;

interface ChatMessage {
  nick?: unknown;
  text?: unknown;
}

const TRANSPORT_ALIASES: Record<string, HeraldSdk.TransportName> = {
  ws: "websocket",
  websocket: "websocket",
  sse: "sse",
  stream: "stream",
  iframe: "iframe",
  longpoll: "longpoll",
  poll: "poll",
};

const HISTORY_SHOWN = 100;

function element<T extends HTMLElement>(id: string): T {
  const found = document.getElementById(id);
  if (found === null) throw new Error(`the page has no #${id}`);
  return found as T;
}

const params = new URLSearchParams(location.search);
const room = /^[A-Za-z0-9_.-]{1,64}$/.test(params.get("room") ?? "") ? params.get("room")! : "lobby";
const channel = `chat:${room}`;
const forced = params.get("transport");
const transport = forced === null ? undefined : TRANSPORT_ALIASES[forced];

const list = element<HTMLOListElement>("messages");
const notice = element<HTMLParagraphElement>("notice");
const stateLabel = element<HTMLSpanElement>("state");
const transportLabel = element<HTMLSpanElement>("transport");
const nickField = element<HTMLInputElement>("nick");
const textField = element<HTMLInputElement>("text");
const form = element<HTMLFormElement>("composer");
const people = element<HTMLDivElement>("people");
const hereCount = element<HTMLSpanElement>("here");
const memberList = element<HTMLUListElement>("members");

element<HTMLHeadingElement>("title").textContent = `Herald chat: #${room}`;
document.title = `#${room} · Herald chat`;
nickField.value = localStorage.getItem("herald-chat-nick") ?? `guest-${Math.floor(Math.random() * 9000 + 1000)}`;

const client = new Herald.Client(undefined, { transports: transport ?? "auto" });
const sub = client.newSubscription(channel);
const shown = new Set<number>();

function say(text: string): void {
  notice.textContent = text;
  notice.hidden = text === "";
}

if (forced !== null && transport === undefined) {
  say(`Unknown transport "${forced}"; using the automatic choice. Known: ws, sse, stream, iframe, longpoll, poll.`);
}

function render(offset: number, data: unknown): void {
  if (shown.has(offset)) return;
  shown.add(offset);
  const message: ChatMessage = typeof data === "object" && data !== null ? (data as ChatMessage) : { text: data };
  const item = document.createElement("li");
  item.dataset["offset"] = String(offset);
  const nick = document.createElement("span");
  nick.className = "nick";
  nick.textContent = typeof message.nick === "string" && message.nick !== "" ? message.nick : "anonymous";
  const text = document.createElement("span");
  text.className = "text";
  text.textContent = typeof message.text === "string" ? message.text : JSON.stringify(message.text ?? data);
  item.append(nick, text);
  // Keep offset order even when a reload and live messages interleave.
  let before: Element | null = null;
  for (const existing of Array.from(list.children)) {
    if (Number((existing as HTMLElement).dataset["offset"]) > offset) {
      before = existing;
      break;
    }
  }
  list.insertBefore(item, before);
  if (before === null) item.scrollIntoView({ block: "end" });
}

async function loadHistory(): Promise<HeraldSdk.HistoryResult> {
  const history = await client.history(channel, { limit: HISTORY_SHOWN });
  for (const p of history.publications ?? []) render(p.offset, p.data);
  return history;
}

sub.on("publication", (p) => render(p.offset, p.data));
sub.on("subscribed", (ctx) => {
  if (ctx.resumed && ctx.recovered === false) {
    say("Some messages could not be recovered after the connection dropped; the conversation was reloaded.");
    list.replaceChildren();
    shown.clear();
    void loadHistory();
  }
});
sub.on("error", (e) => say(`Subscription error ${e.code}: ${e.message}`));

// Who is here: loaded when subscribed, then kept up to date by join and leave pushes.
// Guests have no user name, so they show as "guest" and the start of their member id.
const members = new Map<string, HeraldSdk.Member>();
const PEOPLE_PAGES = 5;

function showPeople(): void {
  hereCount.textContent = String(members.size);
  const items = [...members.values()].map((m) => {
    const item = document.createElement("li");
    item.dataset["client"] = m.client;
    item.textContent = m.user ?? `guest ${m.client.slice(0, 4)}`;
    return item;
  });
  memberList.replaceChildren(...items);
  people.hidden = false;
}

async function loadPeople(): Promise<void> {
  const seen = new Map<string, HeraldSdk.Member>();
  let cursor: string | undefined;
  for (let page = 0; page < PEOPLE_PAGES; page += 1) {
    const answer = await sub.presence({ limit: 100, ...(cursor === undefined ? {} : { cursor }) });
    for (const m of answer.members) seen.set(m.client, m);
    cursor = answer.cursor;
    if (cursor === undefined) break;
  }
  members.clear();
  for (const [id, m] of seen) members.set(id, m);
  showPeople();
}

sub.on("subscribed", () => {
  loadPeople().catch(() => {
    // The server keeps no presence for this room: the list stays hidden.
  });
});
sub.on("join", ({ member }) => {
  members.set(member.client, member);
  showPeople();
});
sub.on("leave", ({ member }) => {
  members.delete(member.client);
  showPeople();
});
// The room passed the server's member threshold: some joins or leaves were not sent.
sub.on("missed", () => {
  loadPeople().catch(() => undefined);
});

function showState(): void {
  stateLabel.textContent = client.state;
  stateLabel.dataset["state"] = client.state;
  transportLabel.textContent = client.transportName ?? "-";
  document.body.dataset["state"] = client.state;
  document.body.dataset["transport"] = client.transportName ?? "";
}
client.on("state", showState);
client.on("connecting", showState);
client.on("connected", () => {
  showState();
  if (notice.textContent?.startsWith("Not connected")) say("");
});
client.on("disconnected", (ctx) => {
  showState();
  say(`Disconnected (${ctx.code}): ${ctx.reason}`);
});

client.once("connected", () => {
  loadHistory().then(
    (history) => sub.subscribe({ since: { epoch: history.epoch, offset: history.offset } }),
    (error: Error) => {
      say(`Could not load the conversation: ${error.message}`);
      sub.subscribe();
    },
  );
});
client.connect();
showState();

form.addEventListener("submit", (event) => {
  event.preventDefault();
  const text = textField.value.trim();
  if (text === "") return;
  const nick = nickField.value.trim().slice(0, 32) || "anonymous";
  localStorage.setItem("herald-chat-nick", nick);
  textField.value = "";
  sub.publish({ nick, text }).then(
    () => say(""),
    (error: Error) => {
      textField.value = text;
      say(`Not sent: ${error.message}`);
    },
  );
});

(globalThis as unknown as Record<string, unknown>)["heraldChat"] = { client, sub };
