// A rokka for the kafkajs tests: started on free loopback ports (it binds
// port 0 for every listener and writes the ports it got to a ports file,
// so no port is guessed ahead), under the results directory CI keeps.
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

async function waitPorts(file, child) {
  const deadline = Date.now() + 30000;
  while (Date.now() < deadline) {
    if (existsSync(file)) return JSON.parse(readFileSync(file, 'utf8'));
    if (child.exitCode !== null) throw new Error(`rokka exited with ${child.exitCode} at start`);
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('rokka did not report its ports');
}

// Starts rokka with `kafkaExtra` lines in its [kafka] table, after
// `prepare(dir)` has seen its work directory (data under dir/data);
// resolves to { proc, ports } (ports: listener name -> port number).
export async function startRokka(name, kafkaExtra = '', prepare = () => {}) {
  const results = process.env.ROKKA_RESULTS_DIR || join(process.cwd(), '..', '..', '..', 'target', 'compat-results');
  mkdirSync(join(results, 'kafka'), { recursive: true });
  const dir = mkdtempSync(join(results, 'kafka', `${name}-`));
  prepare(dir);
  writeFileSync(join(dir, 'rokka.toml'), `
[metrics]
listen = "127.0.0.1:0"
[store]
data_dir = "${dir}/data"
commitlog_segment_bytes = 67108864
preallocate = false
# The suites share the machine's disk with the build: its fill level is not
# what they test (see compat-tests/common/rokka_fixture.py).
disk_max_used_percent = 0
disk_refuse_writes_percent = 0
[kafka]
listen = "127.0.0.1:0"
${kafkaExtra}
[rocketmq]
namesrv_listen = "127.0.0.1:0"
broker_listen = "127.0.0.1:0"
`);
  const log = openSync(join(dir, 'rokka.log'), 'a');
  const proc = spawn(process.env.ROKKA_BIN, ['--config', join(dir, 'rokka.toml'), '--ports-file', join(dir, 'ports.json')],
    { stdio: ['ignore', log, log] });
  const bound = await waitPorts(join(dir, 'ports.json'), proc);
  const ports = Object.fromEntries(Object.entries(bound).map(([k, v]) => [k, Number(v.split(':').pop())]));
  return { proc, ports };
}
