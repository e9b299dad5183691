// The RocketMQ 5 Node.js client driven by compat-tests/rocketmq5: one
// JSON line per message sent or received, then `{"done": n}`.
//   node client.mjs produce  <endpoint> <topic> <n> [prefix]
//   node client.mjs consume  <endpoint> <topic> <group> <n> [timeout_ms]
import { Producer, SimpleConsumer } from 'rocketmq-client-nodejs';

const [mode, endpoints, topic, ...rest] = process.argv.slice(2);
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const logger = { info() {}, warn() {}, error() {}, debug() {} };

async function produce(n, prefix) {
  const p = new Producer({ endpoints, topics: [topic], logger });
  await p.startup();
  for (let i = 0; i < n; i++) {
    const props = new Map([['n', String(i)], ['from', 'node']]);
    const opts = { topic, tag: 'TagN', keys: [`nk-${i}`], properties: props, body: Buffer.from(`${prefix}-${i}-é`) };
    if (i % 3 === 1) opts.messageGroup = `order-${i % 2}`;
    const r = await p.send(opts);
    out({ sent: r.messageId, offset: r.offset, i });
  }
  await p.shutdown();
  out({ done: n });
}

async function consume(group, n, timeoutMs) {
  const c = new SimpleConsumer({
    endpoints,
    consumerGroup: group,
    subscriptions: new Map([[topic, '*']]),
    awaitDuration: 2000,
    logger,
  });
  await c.startup();
  let got = 0;
  const deadline = Date.now() + timeoutMs;
  while (got < n && Date.now() < deadline) {
    const msgs = await c.receive(16, 30000);
    for (const m of msgs) {
      out({
        id: m.messageId,
        body: m.body.toString('hex'),
        tag: m.tag ?? null,
        keys: m.keys,
        props: Object.fromEntries(m.properties),
        group: m.messageGroup ?? null,
        attempt: m.deliveryAttempt,
        corrupted: m.corrupted === true,
      });
      await c.ack(m);
      got++;
    }
  }
  await c.shutdown();
  out({ done: got });
}

try {
  if (mode === 'produce') await produce(Number(rest[0]), rest[1] ?? 'node');
  else if (mode === 'consume') await consume(rest[0], Number(rest[1]), Number(rest[2] ?? 30000));
  else throw new Error(`unknown mode ${mode}`);
  process.exit(0);
} catch (e) {
  out({ error: String(e && e.stack ? e.stack : e) });
  process.exit(1);
}
