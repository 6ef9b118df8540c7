// MQTT.js in a browser page, driven by the interop matrix (tests/interop/browser.py).
//
// The same operations as driver.mjs, on the browser bundle (the `mqtt` global of
// node_modules/mqtt/dist/mqtt.min.js), over WebSocket, the one transport a page has.
// Selenium calls window.weirOps[op](args), which resolves to the answer.
(() => {
  const conns = new Map();
  const b64 = (bytes) => btoa(String.fromCharCode(...new Uint8Array(bytes)));
  const unb64 = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  const utf8 = new TextEncoder();

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
    if (p.correlation_data !== undefined) out.correlationData = unb64(p.correlation_data);
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
      payload: b64(payload),
      qos: packet.qos,
      retain: packet.retain,
      user_properties: user,
      response_topic: p.responseTopic ?? null,
      correlation_data: p.correlationData ? b64(p.correlationData) : null,
      message_expiry: p.messageExpiryInterval ?? null,
      content_type: p.contentType ?? null,
    };
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
        (err) => resolve(err ? String(err.code ?? err.message) : null),
      );
    });
  }

  window.weirOps = {
    connect(a) {
      const options = {
        clientId: a.client_id,
        protocolVersion: a.version,
        clean: a.clean,
        reconnectPeriod: 0,
        connectTimeout: 10000,
        keepalive: 30,
      };
      if (a.version === 5) {
        options.properties = {};
        if (a.session_expiry) options.properties.sessionExpiryInterval = a.session_expiry;
      }
      if (a.will) {
        options.will = { topic: a.will.topic, payload: unb64(a.will.payload), qos: a.will.qos, retain: false };
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
        client.once('error', (err) => { client.end(true); reject(err); });
      });
    },
    async subscribe(a) {
      const granted = await use(a.conn).client.subscribeAsync(a.filter, { qos: a.qos });
      return { granted: granted.map((g) => g.qos) };
    },
    async publish(a) {
      const err = await publishOne(use(a.conn).client, a, unb64(a.payload));
      if (err !== null) throw new Error(`publish failed: ${err}`);
      return {};
    },
    async burst(a) {
      const { client } = use(a.conn);
      const pending = [];
      for (let i = 0; i < a.count; i += 1) pending.push(publishOne(client, a, utf8.encode(String(i))));
      return { results: await Promise.all(pending) };
    },
    async messages(a) {
      const state = use(a.conn);
      const deadline = Date.now() + a.timeout_ms;
      while (state.inbox.length < a.count && Date.now() < deadline) {
        await new Promise((resolve) => {
          const timer = setTimeout(resolve, deadline - Date.now());
          state.waiters.push(() => { clearTimeout(timer); resolve(); });
        });
      }
      return { messages: state.inbox.splice(0, a.count) };
    },
    async stats(a) {
      const state = use(a.conn);
      return { disconnects: state.disconnects, closes: state.closes };
    },
    async drop(a) {
      use(a.conn).client.stream.destroy(); // the socket closes without DISCONNECT
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
})();
