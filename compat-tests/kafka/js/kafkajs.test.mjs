// kafkajs 2.2.4 against a rokka started on free loopback ports:
// produce/consume with keys, headers and timestamps, GZIP, a consumer group
// of two that splits partitions and commits, admin create/list/delete.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import kafkajs from 'kafkajs';

const { Kafka, logLevel, CompressionTypes } = kafkajs;

// rokka binds port 0 for every listener and writes the ports it got to a
// ports file: no port is guessed ahead, so none can be taken in between.
async function waitPorts(file, child) {
  const deadline = Date.now() + 30000;
  while (Date.now() < deadline) {
    if (existsSync(file)) return JSON.parse(readFileSync(file, 'utf8'));
    if (child.exitCode !== null) throw new Error(`rokka exited with ${child.exitCode} at start`);
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('rokka did not report its ports');
}

let proc;
let kafka;

before(async () => {
  const results = process.env.ROKKA_RESULTS_DIR || join(process.cwd(), '..', '..', '..', 'target', 'compat-results');
  mkdirSync(join(results, 'kafka'), { recursive: true });
  const dir = mkdtempSync(join(results, 'kafka', 'kafkajs-'));
  writeFileSync(join(dir, 'rokka.toml'), `
[metrics]
listen = "127.0.0.1:0"
[store]
data_dir = "${dir}/data"
commitlog_segment_bytes = 67108864
preallocate = false
[kafka]
listen = "127.0.0.1:0"
[rocketmq]
namesrv_listen = "127.0.0.1:0"
broker_listen = "127.0.0.1:0"
`);
  const log = openSync(join(dir, 'rokka.log'), 'a');
  proc = spawn(process.env.ROKKA_BIN, ['--config', join(dir, 'rokka.toml'), '--ports-file', join(dir, 'ports.json')],
    { stdio: ['ignore', log, log] });
  const ports = await waitPorts(join(dir, 'ports.json'), proc);
  const port = Number(ports.kafka.split(':').pop());
  kafka = new Kafka({ clientId: 'kafkajs-compat', brokers: [`127.0.0.1:${port}`], logLevel: logLevel.NOTHING });
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

test('a group of two splits the partitions', async () => {
  const topic = 'kjs-group';
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic, numPartitions: 4 }] });
  const producer = kafka.producer();
  await producer.connect();
  await producer.send({ topic, messages: Array.from({ length: 40 }, (_, i) => ({ value: `${i}`, partition: i % 4 })) });
  await producer.disconnect();
  const seen = new Map();
  const consumers = [kafka.consumer({ groupId: 'kjs-g2' }), kafka.consumer({ groupId: 'kjs-g2' })];
  const partitionsOf = [new Set(), new Set()];
  await Promise.all(consumers.map(async (c, idx) => {
    await c.connect();
    await c.subscribe({ topic, fromBeginning: true });
    await c.run({
      eachMessage: async ({ partition, message }) => {
        partitionsOf[idx].add(partition);
        seen.set(message.value.toString(), (seen.get(message.value.toString()) ?? 0) + 1);
      },
    });
  }));
  const deadline = Date.now() + 40000;
  while (seen.size < 40 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200));
  await Promise.all(consumers.map((c) => c.disconnect()));
  assert.equal(seen.size, 40);
  const groups = await admin.listGroups();
  assert.ok(groups.groups.some((g) => g.groupId === 'kjs-g2'));
  await admin.deleteTopics({ topics: [topic] });
  const topics = await admin.listTopics();
  assert.ok(!topics.includes(topic));
  await admin.disconnect();
});
