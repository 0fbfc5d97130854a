// One-shot replication with PouchDB's own replicator (npm `pouchdb`, pinned in
// integration/package.json), for BenchmarkReplicationSideBySide.
//
//   node replicate.js <source-url> <target-url> [batch_size]
//
// Without batch_size PouchDB's defaults are used (batch_size 100,
// batches_limit 10). Prints one JSON line on stdout:
//   {"ms": wall time of PouchDB.replicate, "docs_written": n,
//    "doc_write_failures": n, "cpu_ms": this process's CPU during it}
// Node's start-up and module loading are not timed.
'use strict';

const PouchDB = require('pouchdb');

async function main() {
  const [src, tgt, batch] = process.argv.slice(2);
  if (!src || !tgt) {
    console.error('usage: node replicate.js <source-url> <target-url> [batch_size]');
    process.exit(2);
  }
  const opts = {};
  if (batch) opts.batch_size = Number(batch);
  const source = new PouchDB(src, { skip_setup: true });
  const target = new PouchDB(tgt, { skip_setup: true });
  const cpu0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  const res = await PouchDB.replicate(source, target, opts);
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  const cpu = process.cpuUsage(cpu0);
  if (res.status !== 'complete' || !res.ok) {
    console.error(JSON.stringify(res));
    process.exit(1);
  }
  console.log(JSON.stringify({
    ms,
    docs_written: res.docs_written,
    doc_write_failures: res.doc_write_failures,
    cpu_ms: (cpu.user + cpu.system) / 1000,
  }));
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : String(err));
  process.exit(1);
});
