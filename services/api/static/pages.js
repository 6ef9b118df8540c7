// The list pages: clients (and one client), subscriptions, topics, retained
// messages, bans, users, alarms, nodes, listeners, plugins. Each is a function of
// (main, page, arg): it fills `main`; `page` holds what ends when the user
// leaves (timers, listeners) and `page.query`, the hash's ?name=value.

import { call, has, seg } from "./api.js";
import { nodeTable } from "./overview.js";
import {
  attempt, button, el, filterForm, link, notice, pagedList, protocol, table, time,
} from "./ui.js";

const ANY = ["", "any"];

function kick(clientid, after) {
  return button("Kick", async () => {
    if (!window.confirm(`Kick ${clientid}? (DISCONNECT 0x98 on MQTT 5; its will is sent)`)) return;
    await call("DELETE", `/clients/${seg(clientid)}`);
    notice(`Kicked ${clientid}.`);
    await after();
  }, { class: "danger" });
}

function clientLink(clientid) {
  return link(`#/clients/${seg(clientid)}`, clientid);
}

export async function clients(main, page) {
  const list = pagedList("/clients", [
    { title: "Client id", value: (c) => clientLink(c.clientid) },
    { title: "User name", value: (c) => c.username },
    { title: "Node", value: (c) => c.node },
    { title: "State", value: (c) => (c.connected ? "connected" : "disconnected") },
    { title: "MQTT", value: (c) => protocol(c.proto_ver) },
    { title: "Address", value: (c) => (c.ip_address ? `${c.ip_address}:${c.port}` : "") },
    { title: "Connected at", value: (c) => time(c.connected_at) },
    { title: "Subscriptions", value: (c) => c.subscriptions_cnt },
    { title: "Queue", value: (c) => c.mqueue_len },
    { title: "", value: (c) => (c.connected ? kick(c.clientid, () => list.reload()) : "") },
  ], { empty: "No client matches." });
  const form = filterForm([
    { name: "like_clientid", label: "Client id contains" },
    { name: "like_username", label: "User name contains" },
    { name: "conn_state", label: "State", options: [ANY, ["connected", "connected"],
      ["disconnected", "disconnected"]] },
    { name: "node", label: "Node", value: page.query.node },
  ], (filters) => list.search(filters));
  main.append(el("h2", {}, "Clients"), form, list.element);
  await list.search(page.query.node ? { node: page.query.node } : {});
}

export async function client(main, page, clientid) {
  const c = await call("GET", `/clients/${seg(clientid)}`);
  const fields = [
    ["Client id", c.clientid], ["User name", c.username], ["Node", c.node],
    ["State", c.connected ? "connected" : "disconnected"], ["MQTT", protocol(c.proto_ver)],
    ["Address", c.ip_address ? `${c.ip_address}:${c.port}` : ""], ["Listener", c.listener],
    ["Clean start", c.clean_start], ["Session expiry (s)", c.expiry_interval],
    ["Keep alive (s)", c.keepalive], ["Connected at", time(c.connected_at)],
    ["Disconnected at", time(c.disconnected_at)], ["In flight (out)", c.inflight_cnt],
    ["In flight (in)", c.inbound_inflight], ["Send quota", c.send_quota],
    ["Queued", c.mqueue_len], ["Dropped from its queue", c.mqueue_dropped],
  ];
  main.append(
    el("p", {}, link("#/clients", "← Clients")),
    el("h2", {}, "Client ", el("code", {}, c.clientid)),
    c.connected ? el("p", {}, kick(c.clientid, () => { location.hash = "#/clients"; })) : "",
    table([{ title: "", value: (f) => f[0] }, { title: "", value: (f) => f[1] }], fields),
    el("h3", {}, "Subscriptions"),
    table([
      { title: "Topic filter", value: (s) => s.topic },
      { title: "QoS", value: (s) => s.qos },
      { title: "No local", value: (s) => Boolean(s.nl) },
      { title: "Retain as published", value: (s) => Boolean(s.rap) },
    ], c.subscriptions || [], "No subscription."),
  );
}

export async function subscriptions(main) {
  const list = pagedList("/subscriptions", [
    { title: "Client id", value: (s) => clientLink(s.clientid) },
    { title: "Topic filter", value: (s) => s.topic },
    { title: "QoS", value: (s) => s.qos },
    { title: "Shared group", value: (s) => s.share_group },
    { title: "Node", value: (s) => s.node },
  ], { empty: "No subscription matches." });
  const form = filterForm([
    { name: "clientid", label: "Client id" },
    { name: "topic", label: "Topic filter (exact)" },
    { name: "qos", label: "QoS", options: [ANY, ["0", "0"], ["1", "1"], ["2", "2"]] },
    { name: "share_group", label: "Shared group" },
    { name: "node", label: "Node" },
  ], (filters) => list.search(filters));
  main.append(el("h2", {}, "Subscriptions"), form, list.element);
  await list.search({});
}

export async function topics(main) {
  const list = pagedList("/topics", [
    { title: "Topic filter", value: (t) => t.topic },
    { title: "Node", value: (t) => t.node },
  ], { empty: "No topic matches." });
  const form = filterForm([
    { name: "topic", label: "Topic filter (exact)" },
    { name: "node", label: "Node" },
  ], (filters) => list.search(filters));
  main.append(el("h2", {}, "Topics"), form, list.element);
  await list.search({});
}

function decoded(base64) {
  const raw = Uint8Array.from(atob(base64), (ch) => ch.charCodeAt(0));
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(raw);
  } catch {
    return Array.from(raw, (b) => b.toString(16).padStart(2, "0")).join(" ") + "  (hex)";
  }
}

export async function retained(main) {
  const payload = el("pre", { class: "payload", hidden: true });
  const path = (topic) => `/mqtt/retainer/message/${seg(topic)}`;
  const list = pagedList("/mqtt/retainer/messages", [
    { title: "Topic", value: (m) => m.topic },
    { title: "QoS", value: (m) => m.qos },
    { title: "From", value: (m) => m.from_clientid },
    { title: "Published at", value: (m) => time(m.publish_at) },
    { title: "Expires", value: (m) => time(m.expires_at) },
    {
      title: "",
      value: (m) => el("span", { class: "actions" },
        button("Payload", async () => {
          const one = await call("GET", path(m.topic));
          payload.textContent = `${m.topic}\n\n${decoded(one.payload || "")}`;
          payload.hidden = false;
        }),
        button("Delete", async () => {
          if (!window.confirm(`Delete the retained message of ${m.topic}?`)) return;
          await call("DELETE", path(m.topic));
          notice(`Deleted the retained message of ${m.topic}.`);
          payload.hidden = true;
          await list.reload();
        }, { class: "danger" })),
    },
  ], { empty: "No retained message matches." });
  const form = filterForm([{ name: "topic", label: "Topic contains" }],
    (filters) => list.search(filters));
  main.append(el("h2", {}, "Retained messages"), form, list.element, payload);
  await list.search({});
}

export async function banned(main) {
  const kinds = [["clientid", "client id"], ["username", "user name"], ["peerhost", "address (CIDR)"]];
  const list = pagedList("/banned", [
    { title: "What", value: (b) => b.as },
    { title: "Who", value: (b) => b.who },
    { title: "Reason", value: (b) => b.reason },
    { title: "By", value: (b) => b.by },
    { title: "Until", value: (b) => (b.until ? time(b.until) : "never ends") },
    {
      title: "",
      value: (b) => button("Lift", async () => {
        await call("DELETE", `/banned/${seg(b.as)}/${seg(b.who)}`);
        notice(`Lifted the ban of ${b.as} ${b.who}.`);
        await list.reload();
      }),
    },
  ], { empty: "Nobody is banned." });
  const add = filterForm([
    { name: "as", label: "Ban a", options: kinds },
    { name: "who", label: "Who" },
    { name: "duration", label: "For (seconds; empty: for good)", type: "number" },
    { name: "reason", label: "Reason" },
  ], async (form) => {
    if (!form.who) throw new Error("say who to ban");
    const body = { as: form.as, who: form.who, reason: form.reason || "" };
    if (form.duration) body.duration = Number(form.duration);
    await call("POST", "/banned", { body });
    notice(`Banned ${body.as} ${body.who}; their clients are disconnected.`);
    await list.reload();
  }, "Ban");
  main.append(el("h2", {}, "Banned"), add, list.element);
  await list.search({});
}

// The users MQTT clients log in as, in the stores `weir passwd` writes: the
// node's password file or its Redis. A store the node lacks says so in place.
export async function users(main) {
  const stores = [["password_file", "password file"], ["redis", "Redis"]];
  const store = el("select", { name: "backend" }, stores.map(([v, t]) => el("option", { value: v }, t)));
  const holder = el("div");
  const path = () => `/authentication/${store.value}/users`;

  async function show() {
    const list = pagedList(path(), [
      { title: "User", value: (u) => u.user_id },
      {
        title: "",
        value: (u) => button("Delete", async () => {
          if (!window.confirm(`Delete the user ${u.user_id}? (connected clients stay connected)`)) return;
          await call("DELETE", `${path()}/${seg(u.user_id)}`);
          notice(`Deleted the user ${u.user_id}.`);
          await list.reload();
        }, { class: "danger" }),
      },
    ], { empty: "No user." });
    holder.replaceChildren(list.element);
    try {
      await list.search({});
    } catch (err) {
      if (err.status !== 404) throw err;
      holder.replaceChildren(el("p", { class: "unavailable" }, `Not set up on this node: ${err.message}.`));
    }
  }
  store.addEventListener("change", () => attempt(show()));
  const add = filterForm([
    { name: "user_id", label: "User" },
    { name: "password", label: "Password", type: "password" },
  ], async (form) => {
    await call("POST", path(), { body: { user_id: form.user_id || "", password: form.password || "" } });
    add.querySelector("input[name=password]").value = ""; // not left on the screen
    notice(`Added the user ${form.user_id}.`);
    await show();
  }, "Add");
  main.append(el("h2", {}, "Users"),
    el("div", { class: "filters" }, el("label", {}, "Store", store)), add, holder);
  await show();
}

export async function alarms(main) {
  const columns = [
    { title: "Alarm", value: (a) => a.name },
    { title: "Node", value: (a) => a.node },
    { title: "Message", value: (a) => a.message },
    { title: "Since", value: (a) => time(a.activate_at) },
    { title: "Until", value: (a) => time(a.deactivate_at) },
  ];
  const active = pagedList("/alarms", columns, { empty: "No alarm is active." });
  const past = pagedList("/alarms", columns, { empty: "No past alarm." });
  const clear = has("DELETE", "/alarms")
    ? button("Forget the past alarms", async () => {
      await call("DELETE", "/alarms");
      notice("Past alarms forgotten.");
      await past.reload();
    })
    : "";
  main.append(el("h2", {}, "Alarms"), el("h3", {}, "Active"), active.element,
    el("h3", {}, "Past"), clear, past.element);
  await Promise.all([active.search({ activated: "true" }), past.search({ activated: "false" })]);
}

export async function nodes(main, page) {
  const holder = el("div");
  main.append(el("h2", {}, "Nodes"), holder);
  if (has("GET", "/log/level") && has("PUT", "/log/level")) main.append(await logLevel());
  page.every(5000, async () => holder.replaceChildren(nodeTable(await call("GET", "/nodes"))));
}

// The answering node's log level, as SIGHUP sets it (until the next SIGHUP or restart).
async function logLevel() {
  const { level } = await call("GET", "/log/level");
  const choice = el("select", { name: "level" },
    ["debug", "info", "warning", "error"].map((l) => el("option", { value: l, selected: l === level }, l)));
  return el("section", {}, el("h3", {}, "This node's log level"), el("p", { class: "filters" },
    choice,
    button("Set", async () => {
      const set = await call("PUT", "/log/level", { body: { level: choice.value } });
      notice(`Log level: ${set.level} (until a SIGHUP or a restart of this node).`);
    })));
}

export async function listeners(main) {
  const rows = await call("GET", "/listeners");
  main.append(el("h2", {}, "Listeners"), table([
    { title: "Listener", value: (l) => l.id || l.name },
    { title: "Type", value: (l) => l.type },
    { title: "Address", value: (l) => l.bind },
    { title: "Running", value: (l) => l.running },
    { title: "Connections", value: (l) => l.current_connections },
    { title: "Limit", value: (l) => l.max_connections },
  ], rows, "No listener."));
}

export async function plugins(main) {
  const holder = el("div");
  const canStart = has("PUT", "/plugins/{name}/start");
  const canStop = has("PUT", "/plugins/{name}/stop");
  const toggle = (p) => {
    const verb = p.running ? "stop" : "start";
    if (!(p.running ? canStop : canStart)) return "";
    return button(p.running ? "Stop" : "Start", async () => {
      await call("PUT", `/plugins/${seg(p.name)}/${verb}`);
      notice(`Plugin ${p.name}: ${verb === "stop" ? "stopped" : "started"} (until the node restarts).`);
      await load();
    });
  };
  async function load() {
    const rows = await call("GET", "/plugins");
    holder.replaceChildren(table([
      { title: "Plugin", value: (p) => p.name },
      { title: "Running", value: (p) => p.running },
      { title: "In the config", value: (p) => p.configured },
      { title: "", value: toggle },
    ], rows, "No plugin is installed or configured."));
  }
  main.append(el("h2", {}, "Plugins"), holder);
  await attempt(load());
}
