// MQTT.js 5 publishing QoS 1 messages in bursts to a subscriber (bench/mqttjs_burst.py).
//
// node bench/mqttjs_burst.mjs URL COUNT BURST: a v5 subscriber on bench/burst (QoS 1),
// then a v5 publisher writing BURST PUBLISHes at a time without waiting (as an
// application publishing in a loop does), awaiting their PUBACKs before the next
// burst, until COUNT. Prints one JSON line: seconds from the first PUBLISH to the
// last message received (a broker that drops some is waited for IDLE_MS past its
// last one, not counted), messages received, PUBACK failures, and the DISCONNECTs
// and reconnects the publisher saw. MQTT.js keeps its defaults (reconnect after 1 s).
import { createRequire } from 'node:module';

const require = createRequire(new URL('../tests/interop/js/package.json', import.meta.url));
const mqtt = require('mqtt');

const [url, count, burst] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];
const opened = (options) => new Promise((resolve, reject) => {
  const client = mqtt.connect(url, { protocolVersion: 5, ...options });
  client.once('connect', () => resolve(client));
  client.once('error', reject);
});

const sub = await opened({ clientId: 'bench-sub' });
await sub.subscribeAsync('bench/burst', { qos: 1 });
const IDLE_MS = 5000;
let received = 0;
let lastAt = 0;
let done;
const all = new Promise((resolve) => { done = resolve; });
let idle = null;
sub.on('message', () => {
  received += 1;
  lastAt = performance.now();
  clearTimeout(idle);
  if (received === count) done();
  else idle = setTimeout(done, IDLE_MS);
});

const pub = await opened({ clientId: 'bench-pub' });
const seen = { disconnects: [], reconnects: 0 };
pub.on('disconnect', (packet) => seen.disconnects.push(packet.reasonCode));
pub.on('reconnect', () => { seen.reconnects += 1; });

const started = performance.now();
let failed = 0;
for (let sent = 0; sent < count; sent += burst) {
  const acks = [];
  for (let i = sent; i < Math.min(count, sent + burst); i += 1) {
    acks.push(pub.publishAsync('bench/burst', String(i), { qos: 1 }).catch(() => { failed += 1; }));
  }
  await Promise.all(acks);
}
const nothing = setTimeout(done, IDLE_MS);
await all;
clearTimeout(nothing);
clearTimeout(idle);
const seconds = (lastAt - started) / 1000;
console.log(JSON.stringify({ seconds, received, failed, ...seen }));
await pub.endAsync();
await sub.endAsync();
