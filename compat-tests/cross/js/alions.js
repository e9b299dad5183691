'use strict';
// ali-ons (npm), a RocketMQ remoting client written in JavaScript, against
// rokka. Prints one JSON object per line; exits non-zero on failure.
//   node alions.js produce <namesrv> <topic> <n> <prefix>
//       sends n messages (tag TagA for odd i, TagB for even, key k-<prefix>-<i>,
//       one with setStartDeliverTime now + 3 s), prints each result
//   node alions.js consume <namesrv> <topic> <group> <tag expr> <n> [retry-body]
//       push-consumes until n distinct bodies arrived (at most 60 s); the
//       message with body retry-body is answered ACTION_RETRY once, so it
//       must come back
const httpclient = require('urllib');
const { Producer, Consumer, Message } = require('ali-ons');

const [cmd, ns, topic] = process.argv.slice(2, 5);
const common = { httpclient, accessKeyId: 'ak', accessKeySecret: 'sk', nameSrv: ns, persistent: false };
const out = o => console.log(JSON.stringify(o));

async function produce(n, prefix) {
  const producer = new Producer({ ...common, producerGroup: `PG_${prefix}` });
  await producer.ready();
  for (let i = 0; i < n; i++) {
    const msg = new Message(topic, i % 2 ? 'TagA' : 'TagB', `${prefix}-${i}`);
    msg.keys = [`k-${prefix}-${i}`];
    msg.properties.n = String(i);
    if (i === n - 1) msg.setStartDeliverTime(Date.now() + 3000);
    const r = await producer.send(msg);
    out({ sent: `${prefix}-${i}`, status: r.sendStatus, msgId: r.msgId, queue: r.messageQueue.queueId, delayed: i === n - 1 });
  }
  await producer.close();
}

async function consume(group, expr, n, retryBody) {
  const consumer = new Consumer({ ...common, consumerGroup: group, consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET' });
  const got = new Map();
  let retried = false;
  consumer.subscribe(topic, expr, async msg => {
    const body = msg.body.toString();
    if (body === retryBody && !retried) {
      retried = true;
      out({ retrying: body, reconsumeTimes: msg.reconsumeTimes });
      return Consumer.ACTION_RETRY;
    }
    if (!got.has(body)) {
      out({ body, tags: msg.tags, keys: msg.keys, n: msg.properties.n, reconsumeTimes: msg.reconsumeTimes, born: Number(msg.bornTimestamp), stored: Number(msg.storeTimestamp) });
    }
    got.set(body, (got.get(body) || 0) + 1);
  });
  consumer.on('error', err => out({ error: String(err && err.message) }));
  await consumer.ready();
  const t0 = Date.now();
  while (got.size < n && Date.now() - t0 < 60000) await new Promise(r => setTimeout(r, 200));
  // A moment more: a message delivered twice would show here.
  await new Promise(r => setTimeout(r, 1500));
  out({ done: got.size, twice: [...got.entries()].filter(([, c]) => c > 1).map(([b]) => b), retried });
  await consumer.close();
  return got.size >= n;
}

(async () => {
  if (cmd === 'produce') {
    await produce(Number(process.argv[5]), process.argv[6]);
  } else if (cmd === 'consume') {
    const ok = await consume(process.argv[5], process.argv[6], Number(process.argv[7]), process.argv[8]);
    process.exit(ok ? 0 : 1);
  } else {
    throw new Error(`unknown command ${cmd}`);
  }
  process.exit(0);
})().catch(e => {
  out({ fatal: String(e && e.stack) });
  process.exit(2);
});
