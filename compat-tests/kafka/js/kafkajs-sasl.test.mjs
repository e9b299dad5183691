// kafkajs 2.2.4 over a SASL_PLAINTEXT listener with SCRAM-SHA-256
// (docs/security.md): produce, consume in a group, commit; a wrong
// password is kafkajs' authentication error, not a hang. The user is
// provisioned as an operator would before the start: its salted SCRAM
// credential (never the password) in the data directory's users table.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, createHmac, pbkdf2Sync, randomBytes } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import kafkajs from 'kafkajs';
import { startRokka } from './rokka.mjs';

const { Kafka, logLevel } = kafkajs;

// RFC 5802: SaltedPassword, StoredKey = H(HMAC(SaltedPassword, "Client Key")),
// ServerKey = HMAC(SaltedPassword, "Server Key").
function scramSha256(password, iterations) {
  const salt = randomBytes(16);
  const salted = pbkdf2Sync(password, salt, iterations, 32, 'sha256');
  const clientKey = createHmac('sha256', salted).update('Client Key').digest();
  return {
    salt: salt.toString('base64'),
    iterations,
    stored_key: createHash('sha256').update(clientKey).digest().toString('base64'),
    server_key: createHmac('sha256', salted).update('Server Key').digest().toString('base64'),
  };
}

let proc;
let port;

before(async () => {
  let ports;
  ({ proc, ports } = await startRokka('kafkajs-sasl', 'sasl_listen = "127.0.0.1:0"', (dir) => {
    mkdirSync(join(dir, 'data', 'config'), { recursive: true });
    writeFileSync(join(dir, 'data', 'config', 'users.json'),
      JSON.stringify({ users: { carol: { 'SCRAM-SHA-256': scramSha256('carol-secret', 4096) } } }));
  }));
  port = ports.kafka_sasl;
});

after(async () => {
  const exited = new Promise((r) => proc.on('exit', (code) => r(code)));
  proc.kill('SIGTERM');
  assert.equal(await exited, 0);
});

function client(password) {
  return new Kafka({
    clientId: 'kafkajs-sasl',
    brokers: [`127.0.0.1:${port}`],
    sasl: { mechanism: 'scram-sha-256', username: 'carol', password },
    logLevel: logLevel.NOTHING,
    retry: { retries: 1 },
  });
}

test('SCRAM-SHA-256: produce, consume in a group, commit', async () => {
  const kafka = client('carol-secret');
  const topic = 'kjs-sasl';
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic, numPartitions: 1 }] });
  const producer = kafka.producer();
  await producer.connect();
  await producer.send({ topic, messages: Array.from({ length: 20 }, (_, i) => ({ value: `s${i}` })) });
  await producer.disconnect();
  const consumer = kafka.consumer({ groupId: 'kjs-sasl-g' });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const got = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`only ${got.length} messages`)), 30000);
    consumer.run({
      eachMessage: async ({ message }) => {
        got.push(message.value.toString());
        if (got.length === 20) {
          clearTimeout(timer);
          resolve();
        }
      },
    });
  });
  await consumer.disconnect();
  assert.deepEqual(got, Array.from({ length: 20 }, (_, i) => `s${i}`));
  const offsets = await admin.fetchOffsets({ groupId: 'kjs-sasl-g', topics: [topic] });
  assert.equal(offsets[0].partitions[0].offset, '20');
  await admin.disconnect();
});

test('a wrong password is an authentication error within seconds', async () => {
  const started = Date.now();
  const admin = client('wrong').admin();
  await assert.rejects(admin.connect(), (e) => /SASL|authentication/i.test(`${e.name} ${e.message}`));
  assert.ok(Date.now() - started < 10000);
});
