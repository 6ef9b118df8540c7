// MQTT.js driven by the interop matrix (tests/interop/clients/mqttjs.py).
//
// One JSON request per line on stdin, one JSON answer per line on stdout:
//   {"id": 1, "op": "connect", "args": {...}}  ->  {"id": 1, "ok": {...}}
//                                               or {"id": 1, "error": "...", "code": 135}
// Operations: connect, subscribe, publish, burst, messages, drop, end.
// Connections are named by the caller ("conn"); received messages are kept
// per connection until `messages` takes them. Payloads travel as base64.
// The scenarios themselves live in Python, the same for every client.

import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import mqtt from 'mqtt';

const conns = new Map(); // name -> {client, inbox, waiters, disconnects, closes}

function props(p) {
  if (!p) return undefined;
  const out = {};
  if (p.user_properties) {
    out.userProperties = {};
    for (const [k, v] of p.user_properties) {
      const had = out.userProperties[k];
      out.userProperties[k] = had === undefined ? v : [].concat(had, v);
    }
  }
  if (p.message_expiry !== undefined) out.messageExpiryInterval = p.message_expiry;
  if (p.response_topic !== undefined) out.responseTopic = p.response_topic;
  if (p.correlation_data !== undefined) out.correlationData = Buffer.from(p.correlation_data, 'base64');
  if (p.content_type !== undefined) out.contentType = p.content_type;
  if (p.topic_alias !== undefined) out.topicAlias = p.topic_alias;
  return out;
}

function received(topic, payload, packet) {
  const p = packet.properties || {};
  const user = [];
  for (const [k, v] of Object.entries(p.userProperties || {})) {
    for (const one of [].concat(v)) user.push([k, String(one)]);
  }
  return {
    topic,
    payload: Buffer.from(payload).toString('base64'),
    qos: packet.qos,
    retain: packet.retain,
    user_properties: user,
    response_topic: p.responseTopic ?? null,
    correlation_data: p.correlationData ? Buffer.from(p.correlationData).toString('base64') : null,
    message_expiry: p.messageExpiryInterval ?? null,
    content_type: p.contentType ?? null,
  };
}

function connect(a) {
  const options = {
    clientId: a.client_id,
    protocolVersion: a.version,
    clean: a.clean,
    reconnectPeriod: 0, // the matrix sees a disconnect, not a silent reconnect
    connectTimeout: 10000,
    keepalive: 30,
  };
  if (a.version === 5) {
    options.properties = {};
    if (a.session_expiry) options.properties.sessionExpiryInterval = a.session_expiry;
  }
  if (a.ca) options.ca = readFileSync(a.ca);
  if (a.will) {
    options.will = {
      topic: a.will.topic,
      payload: Buffer.from(a.will.payload, 'base64'),
      qos: a.will.qos,
      retain: false,
    };
  }
  const client = mqtt.connect(a.url, options);
  const state = { client, inbox: [], waiters: [], disconnects: [], closes: 0 };
  client.on('message', (topic, payload, packet) => {
    state.inbox.push(received(topic, payload, packet));
    for (const wake of state.waiters.splice(0)) wake();
  });
  client.on('disconnect', (packet) => state.disconnects.push(packet.reasonCode ?? 0));
  client.on('close', () => { state.closes += 1; });
  return new Promise((resolve, reject) => {
    client.once('connect', (connack) => {
      conns.set(a.conn, state);
      resolve({ session_present: connack.sessionPresent });
    });
    client.once('error', (err) => {
      client.end(true);
      reject(err);
    });
  });
}

function use(name) {
  const state = conns.get(name);
  if (!state) throw new Error(`no connection ${name}`);
  return state;
}

function publishOne(client, a, payload) {
  return new Promise((resolve) => {
    client.publish(
      a.topic,
      payload,
      { qos: a.qos, retain: Boolean(a.retain), properties: props(a.properties) },
      (err) => resolve(err ? (err.code ?? err.message) : null),
    );
  });
}

async function waitMessages(state, count, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  while (state.inbox.length < count && Date.now() < deadline) {
    await new Promise((resolve) => {
      const timer = setTimeout(resolve, deadline - Date.now());
      state.waiters.push(() => { clearTimeout(timer); resolve(); });
    });
  }
  return state.inbox.splice(0, count);
}

const ops = {
  connect,
  async subscribe(a) {
    const { client } = use(a.conn);
    const granted = await client.subscribeAsync(a.filter, { qos: a.qos });
    return { granted: granted.map((g) => g.qos) };
  },
  async publish(a) {
    const err = await publishOne(use(a.conn).client, a, Buffer.from(a.payload, 'base64'));
    if (err !== null) throw Object.assign(new Error(`publish failed: ${err}`), { code: err });
    return {};
  },
  async burst(a) {
    // Every PUBLISH written at once, as an application publishing in a loop does.
    const { client } = use(a.conn);
    const pending = [];
    for (let i = 0; i < a.count; i += 1) pending.push(publishOne(client, a, Buffer.from(String(i))));
    const results = await Promise.all(pending);
    return { results: results.map((r) => (r === null ? null : String(r))) };
  },
  async messages(a) {
    return { messages: await waitMessages(use(a.conn), a.count, a.timeout_ms) };
  },
  async stats(a) {
    const state = use(a.conn);
    return { disconnects: state.disconnects, closes: state.closes };
  },
  async drop(a) {
    use(a.conn).client.stream.destroy(); // no DISCONNECT: the will is published
    conns.delete(a.conn);
    return {};
  },
  async end(a) {
    const state = conns.get(a.conn);
    if (state) await state.client.endAsync();
    conns.delete(a.conn);
    return {};
  },
};

const lines = createInterface({ input: process.stdin });
lines.on('line', async (line) => {
  const request = JSON.parse(line);
  let answer;
  try {
    answer = { id: request.id, ok: await ops[request.op](request.args) };
  } catch (err) {
    answer = { id: request.id, error: String(err.message ?? err), code: err.code ?? null };
  }
  process.stdout.write(`${JSON.stringify(answer)}\n`);
});
lines.on('close', () => {
  for (const { client } of conns.values()) client.end(true);
  process.exit(0);
});
process.stdout.write(`${JSON.stringify({ ready: mqtt.MqttClient ? 'mqtt' : '?' })}\n`);
