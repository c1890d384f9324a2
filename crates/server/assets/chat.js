// Generated from sdk/demo/chat.ts by `npm run build` in sdk/; do not edit.
"use strict";
(() => {
  // demo/chat.ts
  var TRANSPORT_ALIASES = {
    ws: "websocket",
    websocket: "websocket",
    sse: "sse",
    stream: "stream",
    iframe: "iframe",
    longpoll: "longpoll",
    poll: "poll"
  };
  var HISTORY_SHOWN = 100;
  function element(id) {
    const found = document.getElementById(id);
    if (found === null) throw new Error(`the page has no #${id}`);
    return found;
  }
  var params = new URLSearchParams(location.search);
  var room = /^[A-Za-z0-9_.-]{1,64}$/.test(params.get("room") ?? "") ? params.get("room") : "lobby";
  var channel = `chat:${room}`;
  var forced = params.get("transport");
  var transport = forced === null ? void 0 : TRANSPORT_ALIASES[forced];
  var list = element("messages");
  var notice = element("notice");
  var stateLabel = element("state");
  var transportLabel = element("transport");
  var nickField = element("nick");
  var textField = element("text");
  var form = element("composer");
  var people = element("people");
  var hereCount = element("here");
  var memberList = element("members");
  element("title").textContent = `Herald chat: #${room}`;
  document.title = `#${room} \xB7 Herald chat`;
  nickField.value = localStorage.getItem("herald-chat-nick") ?? `guest-${Math.floor(Math.random() * 9e3 + 1e3)}`;
  var client = new Herald.Client(void 0, { transports: transport ?? "auto" });
  var sub = client.newSubscription(channel);
  var shown = /* @__PURE__ */ new Set();
  function say(text) {
    notice.textContent = text;
    notice.hidden = text === "";
  }
  if (forced !== null && transport === void 0) {
    say(`Unknown transport "${forced}"; using the automatic choice. Known: ws, sse, stream, iframe, longpoll, poll.`);
  }
  function render(offset, data) {
    if (shown.has(offset)) return;
    shown.add(offset);
    const message = typeof data === "object" && data !== null ? data : { text: data };
    const item = document.createElement("li");
    item.dataset["offset"] = String(offset);
    const nick = document.createElement("span");
    nick.className = "nick";
    nick.textContent = typeof message.nick === "string" && message.nick !== "" ? message.nick : "anonymous";
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = typeof message.text === "string" ? message.text : JSON.stringify(message.text ?? data);
    item.append(nick, text);
    let before = null;
    for (const existing of Array.from(list.children)) {
      if (Number(existing.dataset["offset"]) > offset) {
        before = existing;
        break;
      }
    }
    list.insertBefore(item, before);
    if (before === null) item.scrollIntoView({ block: "end" });
  }
  async function loadHistory() {
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
  var members = /* @__PURE__ */ new Map();
  var PEOPLE_PAGES = 5;
  function showPeople() {
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
  async function loadPeople() {
    const seen = /* @__PURE__ */ new Map();
    let cursor;
    for (let page = 0; page < PEOPLE_PAGES; page += 1) {
      const answer = await sub.presence({ limit: 100, ...cursor === void 0 ? {} : { cursor } });
      for (const m of answer.members) seen.set(m.client, m);
      cursor = answer.cursor;
      if (cursor === void 0) break;
    }
    members.clear();
    for (const [id, m] of seen) members.set(id, m);
    showPeople();
  }
  sub.on("subscribed", () => {
    loadPeople().catch(() => {
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
  sub.on("missed", () => {
    loadPeople().catch(() => void 0);
  });
  function showState() {
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
      (error) => {
        say(`Could not load the conversation: ${error.message}`);
        sub.subscribe();
      }
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
      (error) => {
        textField.value = text;
        say(`Not sent: ${error.message}`);
      }
    );
  });
  globalThis["heraldChat"] = { client, sub };
})();
