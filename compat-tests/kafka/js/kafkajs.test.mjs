// kafkajs 2.2.4 against a rokka started on free loopback ports:
// produce/consume with keys, headers and timestamps, GZIP, a consumer group
// of two that splits partitions and commits, admin create/list/delete,
// transactions (commit, abort) read by read-committed and read-uncommitted
// consumers.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import kafkajs from 'kafkajs';
import { startRokka } from './rokka.mjs';

const { AssignerProtocol, Kafka, logLevel, CompressionTypes } = kafkajs;

let proc;
let kafka;

before(async () => {
  let ports;
  ({ proc, ports } = await startRokka('kafkajs'));
  kafka = new Kafka({ clientId: 'kafkajs-compat', brokers: [`127.0.0.1:${ports.kafka}`], logLevel: logLevel.NOTHING });
});

after(async () => {
  const exited = new Promise((r) => proc.on('exit', (code) => r(code)));
  proc.kill('SIGTERM');
  assert.equal(await exited, 0);
});

test('produce and consume with keys, headers, timestamps and gzip', async () => {
  const topic = 'kjs-basic';
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic, numPartitions: 1 }] });
  const producer = kafka.producer();
  await producer.connect();
  const messages = Array.from({ length: 50 }, (_, i) => ({
    key: `k${i}`, value: `v${i}`, headers: { h: `x${i}` }, timestamp: String(1700000000000 + i),
  }));
  await producer.send({ topic, messages: messages.slice(0, 25) });
  await producer.send({ topic, compression: CompressionTypes.GZIP, messages: messages.slice(25) });
  await producer.disconnect();
  const consumer = kafka.consumer({ groupId: 'kjs-basic-g' });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const got = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`only ${got.length} messages`)), 30000);
    consumer.run({
      eachMessage: async ({ message }) => {
        got.push(message);
        if (got.length === 50) { clearTimeout(timer); resolve(); }
      },
    });
  });
  await consumer.disconnect();
  got.forEach((m, i) => {
    assert.equal(m.key.toString(), `k${i}`);
    assert.equal(m.value.toString(), `v${i}`);
    assert.equal(m.headers.h.toString(), `x${i}`);
    assert.equal(m.timestamp, String(1700000000000 + i));
    assert.equal(m.offset, String(i));
  });
  const offsets = await admin.fetchOffsets({ groupId: 'kjs-basic-g', topics: [topic] });
  assert.equal(offsets[0].partitions[0].offset, '50');
  await admin.disconnect();
});

// Polls `cond` every 100 ms until it holds; after `ms`, fails with `what()`.
async function waitFor(cond, what, ms = 30000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await cond()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${what()}`);
}

const sorted = (xs) => [...xs].sort((a, b) => a - b);

test('a group of two splits the partitions', async () => {
  const topic = 'kjs-group';
  const groupId = 'kjs-g2';
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic, numPartitions: 4 }] });
  const consumers = [kafka.consumer({ groupId }), kafka.consumer({ groupId })];
  // Each member's partitions after its latest join (GROUP_JOIN events).
  const assigned = [null, null];
  const partitionsOf = [new Set(), new Set()];
  const deliveries = []; // [member, partition, value]
  await Promise.all(consumers.map(async (c, idx) => {
    c.on(c.events.GROUP_JOIN, ({ payload }) => {
      assigned[idx] = sorted(payload.memberAssignment[topic] ?? []);
    });
    await c.connect();
    await c.subscribe({ topic, fromBeginning: true });
    await c.run({
      eachMessage: async ({ partition, message }) => {
        partitionsOf[idx].add(partition);
        deliveries.push([idx, partition, message.value.toString()]);
      },
    });
  }));
  // Produce once the group is Stable with both members, each holding a
  // share of the topic (as Rokka and both clients see it).
  let described;
  await waitFor(async () => {
    const { groups: [g] } = await admin.describeGroups([groupId]);
    described = {
      state: g.state,
      members: g.members.map((m) => sorted(AssignerProtocol.MemberAssignment.decode(m.memberAssignment)?.assignment[topic] ?? [])),
    };
    const split = (parts) => parts.length === 2 && parts.every((p) => p && p.length > 0)
      && sorted(parts.flat()).join() === '0,1,2,3';
    return described.state === 'Stable' && split(described.members) && split(assigned);
  }, () => `a Stable group splitting the topic between both members: ${JSON.stringify({ described, assigned })}`, 40000);
  const producer = kafka.producer();
  await producer.connect();
  await producer.send({ topic, messages: Array.from({ length: 40 }, (_, i) => ({ value: `${i}`, partition: i % 4 })) });
  await producer.disconnect();
  await waitFor(() => new Set(deliveries.map(([, , v]) => v)).size === 40,
    () => `all 40 values delivered (${deliveries.length} deliveries)`, 40000);
  await Promise.all(consumers.map((c) => c.disconnect()));

  // Every value exactly once, from the partition it was produced to.
  const counts = new Map();
  for (const [, partition, v] of deliveries) {
    counts.set(v, (counts.get(v) ?? 0) + 1);
    assert.equal(partition, Number(v) % 4, `value ${v} came from partition ${partition}`);
  }
  assert.deepEqual(sorted([...counts.keys()].map(Number)), Array.from({ length: 40 }, (_, i) => i));
  assert.deepEqual([...counts].filter(([, n]) => n !== 1), [], 'values delivered more than once');
  // Both members consumed, from disjoint partition sets that cover the topic.
  const [p0, p1] = partitionsOf.map(sorted);
  assert.ok(p0.length > 0 && p1.length > 0, `both members consumed: ${JSON.stringify([p0, p1])}`);
  assert.deepEqual(p0.filter((p) => p1.includes(p)), [], `disjoint partitions: ${JSON.stringify([p0, p1])}`);
  assert.deepEqual(sorted([...p0, ...p1]), [0, 1, 2, 3]);
  // The group committed every partition's end.
  const offsets = await admin.fetchOffsets({ groupId, topics: [topic] });
  assert.deepEqual(offsets[0].partitions.map((p) => [p.partition, p.offset]).sort(), [[0, '10'], [1, '10'], [2, '10'], [3, '10']]);

  const groups = await admin.listGroups();
  assert.ok(groups.groups.some((g) => g.groupId === groupId));
  await admin.deleteTopics({ topics: [topic] });
  const topics = await admin.listTopics();
  assert.ok(!topics.includes(topic));
  await admin.disconnect();
});

test('transactions: commit and abort, read_committed sees only the committed', async () => {
  const topic = 'kjs-txn';
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic, numPartitions: 2 }] });
  const producer = kafka.producer({ transactionalId: 'kjs-txn-id', idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  const send = async (prefix, n, commit) => {
    const tx = await producer.transaction();
    await tx.send({ topic, messages: Array.from({ length: n }, (_, i) => ({ value: `${prefix}${i}`, partition: i % 2 })) });
    if (commit) await tx.commit(); else await tx.abort();
  };
  await send('c', 10, true);
  await send('a', 7, false);
  await send('d', 5, true);
  await producer.disconnect();
  const read = async (readUncommitted, want) => {
    const consumer = kafka.consumer({ groupId: `kjs-txn-${readUncommitted}`, readUncommitted });
    await consumer.connect();
    await consumer.subscribe({ topic, fromBeginning: true });
    const got = [];
    await consumer.run({ eachMessage: async ({ message }) => { got.push(message.value.toString()); } });
    await waitFor(() => got.length >= want, () => `${want} records (${got.length})`, 30000);
    await new Promise((r) => setTimeout(r, 1000)); // nothing more arrives
    await consumer.disconnect();
    return got.sort();
  };
  const committed = [...Array.from({ length: 10 }, (_, i) => `c${i}`), ...Array.from({ length: 5 }, (_, i) => `d${i}`)].sort();
  assert.deepEqual(await read(false, 15), committed);
  const all = await read(true, 22);
  assert.equal(all.length, 22);
  assert.deepEqual(all.filter((v) => v.startsWith('a')).length, 7);
  await admin.disconnect();
});
