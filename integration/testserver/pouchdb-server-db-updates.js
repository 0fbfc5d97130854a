// PouchDB Server 4.2.0 with a real /_db_updates feed, answering as Apache
// CouchDB 3.4.3's global_changes does (integration/README.md, "_db_updates").
//
//   node pouchdb-server-db-updates.js <pouchdb-server's own arguments>
//
// pouchdb-server (npm, pinned in integration/package.json) is started
// unchanged, with the same arguments; only express-pouchdb's `_db_updates`
// route, a stub answering 400, is replaced before the app is built. The new
// route sits where the stub sat: after express-pouchdb's authentication and
// its `requiresServerAdmin` check on `GET /_db_updates` (401 "You are not a
// server admin." for anyone but a server admin once an admin exists).
//
// Events, as CouchDB's global_changes listener records them:
//   created  a database was created (PouchDB's constructor-level `created`
//            event for a name that did not exist),
//   updated  a document was written (the database's own _changes feed;
//            _local documents and _security do not count, as in CouchDB),
//   deleted  a database was deleted (the constructor-level `destroyed`).
// Like CouchDB's `_global_changes` database (one document per "type:db",
// whose _changes feed the endpoint reads), a repeated event moves its row to
// a new seq: a feed read from `since` lists each (type, db) pair at most once,
// at its latest seq. Seqs are opaque strings "<n>-<base64url>"; `since`
// accepts 0, "now" or a seq this server gave, anything else is a 400.
// PouchDB's internal databases (pouch__*, view indexes *-mrview-*) are not
// reported.
'use strict';

const path = require('path');
const Module = require('module');

// Resolve the packages exactly as pouchdb-server resolves them.
const serverMain = require.resolve('pouchdb-server/lib/index.js');
const serverRequire = Module.createRequire(serverMain);
const expressPouchDBMain = serverRequire.resolve('express-pouchdb');
const stubPath = path.join(path.dirname(expressPouchDBMain), 'routes', 'db-updates.js');
const epRequire = Module.createRequire(stubPath);

const SEQ_TAG = 'pouchdb-server-db-updates:';
const DEFAULT_TIMEOUT = 60000; // CouchDB's [chttpd] changes_timeout

function encodeSeq(n) {
  return n + '-' + Buffer.from(SEQ_TAG + n, 'utf8').toString('base64url');
}

// decodeSeq returns the integer behind a since value, or null if malformed.
function decodeSeq(s) {
  if (s === '0') {
    return 0;
  }
  const m = /^([0-9]+)-([A-Za-z0-9_-]+)$/.exec(s);
  if (!m) {
    return null;
  }
  const n = Number(m[1]);
  if (Buffer.from(m[2], 'base64url').toString('utf8') !== SEQ_TAG + m[1]) {
    return null;
  }
  return n;
}

function ignored(name) {
  return typeof name !== 'string' || name.startsWith('pouch__') ||
    name.indexOf('-mrview-') !== -1 || /^https?:\/\//.test(name);
}

// The feed's state: one entry per "type:db" (latest), and the entries in
// seq order (log; an entry a later event of its pair replaced stays there
// until a compaction, and is skipped). A feed reading since its last seq
// costs the rows after it, not every database's (10,000 user databases: a
// write's row reached each open feed through a walk of 10,000 entries).
class Updates {
  constructor() {
    this.seq = 0;
    this.latest = new Map(); // "type:db" -> {db_name, type, n}
    this.log = []; // entries, n ascending; replaced ones included
    this.waiters = new Set(); // functions called after each event
  }
  record(dbName, type) {
    const key = type + ':' + dbName;
    this.seq++;
    const e = {key: key, db_name: dbName, type: type, n: this.seq};
    this.latest.set(key, e);
    this.log.push(e);
    if (this.log.length > 2 * this.latest.size + 1024) {
      this.log = this.log.filter((x) => this.latest.get(x.key) === x);
    }
    for (const w of Array.from(this.waiters)) {
      w();
    }
  }
  // rows after since, oldest first
  since(n) {
    // the first entry after n (log is in n order)
    let lo = 0;
    let hi = this.log.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (this.log[mid].n > n) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    const out = [];
    for (let i = lo; i < this.log.length; i++) {
      const e = this.log[i];
      if (this.latest.get(e.key) === e) {
        out.push(e);
      }
    }
    return out;
  }
}

function row(e) {
  return {db_name: e.db_name, type: e.type, seq: encodeSeq(e.n)};
}

function badRequest(res, reason) {
  res.status(400).set({'Content-Type': 'application/json', 'Cache-Control': 'must-revalidate'});
  res.send(Buffer.from(JSON.stringify({error: 'bad_request', reason: reason}) + '\n'));
}

// parseQuery reads the raw query string (express-pouchdb JSON-parses
// req.query), as global_changes_httpd:parse_global_changes_query does.
function parseQuery(req) {
  const q = new URL(req.originalUrl, 'http://localhost').searchParams;
  const opts = {feed: 'normal', since: '0', limit: null, heartbeat: null, timeout: null, descending: false};
  function nonNegInt(v) {
    if (!/^[0-9]+$/.test(v)) {
      throw new Error('invalid_integer');
    }
    return Number(v);
  }
  for (const [k, v] of q) {
    switch (k) {
      case 'feed': opts.feed = v; break;
      case 'since': opts.since = v; break;
      case 'descending': if (v === 'true') { opts.descending = true; } break;
      case 'limit': opts.limit = nonNegInt(v); break;
      case 'heartbeat':
        if (v === 'true') {
          opts.heartbeat = DEFAULT_TIMEOUT;
        } else if (v !== 'false') {
          opts.heartbeat = nonNegInt(v);
        }
        break;
      case 'timeout': opts.timeout = nonNegInt(v); break;
      default: break; // unknown parameters are ignored, as CouchDB does
    }
  }
  return opts;
}

function install(app) {
  const updates = new Updates();
  app.dbUpdates = updates;
  const known = new Set(); // databases that exist
  const watchers = new Map(); // db name -> {db, feed}
  const ownOpening = new Set(); // names whose next `created` is our own instance's
  const deletingMissing = new Set(); // DELETE of a database that does not exist
  let Pouch = null;

  // watch follows a database's changes. A database created now is read
  // from 0 (every change of it happened after its creation); one that
  // existed when the server started from its last change ('now').
  function watch(name, since) {
    if (watchers.has(name)) {
      return;
    }
    // A dedicated instance, never closed by anyone else.
    const db = new Pouch(name);
    db.once('created', function () {
      // emitted just before the constructor's `created` for this instance
      ownOpening.add(name);
    });
    const feed = db.changes({live: true, since: since, return_docs: false});
    const w = {db: db, feed: feed, seen: 0, pending: []};
    feed.on('change', function (change) {
      if (known.has(name)) {
        updates.record(name, 'updated');
      }
      if (typeof change.seq === 'number' && change.seq > w.seen) {
        w.seen = change.seq;
      }
      w.pending = w.pending.filter(function (p) {
        if (p.seq <= w.seen) {
          p.resolve();
          return false;
        }
        return true;
      });
    });
    feed.on('error', function (err) {
      console.error('db-updates: changes of ' + name + ': ' + err);
    });
    watchers.set(name, w);
  }

  function unwatch(name) {
    const w = watchers.get(name);
    if (w) {
      watchers.delete(name);
      w.feed.cancel();
      for (const p of w.pending) {
        p.resolve();
      }
      w.pending = [];
    }
  }

  // recorded resolves once the database's changes feed has passed its
  // current update_seq: a write's answer goes out after its `updated` row
  // is in the feed (CouchDB records the event at the commit). A safety
  // net of 10 s keeps a lost change from holding an answer forever.
  function recorded(name) {
    const w = watchers.get(name);
    if (!w) {
      return Promise.resolve();
    }
    return w.db.info().then(function (info) {
      const seq = info.update_seq;
      if (typeof seq !== 'number' || seq <= w.seen || !watchers.has(name)) {
        return;
      }
      return new Promise(function (resolve) {
        const timer = setTimeout(resolve, 10000);
        w.pending.push({seq: seq, resolve: function () {
          clearTimeout(timer);
          resolve();
        }});
      });
    }).catch(function () {});
  }

  // express-pouchdb's setDBOnReq (every request to /db/...) asks
  // PouchDB.allDbs() and looks the name up in the array: three walks of
  // every database's name per request (pouchdb-all-dbs' cache keys, their
  // prefix cut, express-pouchdb's decodeURIComponent) and an indexOf, ~5 ms
  // of CPU per request at 10,000 databases. The names allDbs answered are
  // kept in a Set: a name in it skips the walk; a name not in it (a
  // database created since, or none) asks allDbs as before, which answers
  // after pouchdb-all-dbs recorded every earlier creation and deletion,
  // and refreshes the Set. Any deletion empties the Set (at the
  // `destroyed` event, before the DELETE is answered), so a deleted
  // database is never served from it.
  const utils = epRequire('../utils');
  const cleanFilename = epRequire('../clean-filename');
  const getOrCreateDB = epRequire('../create-or-delete-dbs').getOrCreateDB;
  const setDBOnReq = utils.setDBOnReq;
  let existing = null; // Set of allDbs' last answer, or null
  let deletions = 0; // databases destroyed so far
  utils.setDBOnReq = function (dbName, dbWrapper, req, res, next) {
    const name = cleanFilename(dbName);
    if (existing !== null && existing.has(name) && name.indexOf('/') === -1) {
      return getOrCreateDB(req.PouchDB, name).then(function (db) {
        return dbWrapper.wrap(name, db).then(function () {
          req.db = db;
          next();
        });
      });
    }
    const before = deletions;
    req.PouchDB.allDbs(function (err, dbs) {
      if (!err && deletions === before) { // none destroyed meanwhile
        existing = new Set(dbs);
      }
      setDBOnReq(dbName, dbWrapper, req, res, next);
    });
  };

  // Every database express-pouchdb serves requests with: bulkDocs carries
  // every document write (put, post, remove and attachments call it).
  const pouchWrappers = epRequire('pouchdb-wrappers');
  app.dbWrapper.registerWrapper(function (name, db, next) {
    pouchWrappers.installWrapperMethods(db, {
      bulkDocs: function (orig) {
        return orig().then(function (res) {
          return recorded(name).then(function () {
            return res;
          });
        });
      }
    });
    return next();
  });

  function onCreated(name) {
    if (ignored(name)) {
      return;
    }
    if (ownOpening.has(name)) {
      ownOpening.delete(name);
      return;
    }
    if (deletingMissing.has(name) || known.has(name)) {
      return; // a transient instance of DELETE /missing, or a re-open
    }
    known.add(name);
    updates.record(name, 'created');
    watch(name, 0);
  }

  function onDestroyed(name) {
    existing = null;
    deletions++;
    if (ignored(name)) {
      return;
    }
    if (deletingMissing.has(name)) {
      deletingMissing.delete(name);
      return;
    }
    if (!known.has(name)) {
      return;
    }
    known.delete(name);
    unwatch(name);
    updates.record(name, 'deleted');
  }

  app.daemonManager.registerDaemon({
    start: function (PouchDB) {
      Pouch = PouchDB;
      PouchDB.on('created', onCreated);
      PouchDB.on('destroyed', onDestroyed);
      // Databases that exist already (a server started on a data directory).
      return Promise.resolve(PouchDB.allDbs()).then(function (names) {
        for (const name of names) {
          if (!ignored(name) && !known.has(name)) {
            known.add(name);
            watch(name, 'now');
          }
        }
      }).catch(function (err) {
        console.error('db-updates: allDbs: ' + err);
      });
    },
    stop: function (PouchDB) {
      PouchDB.removeListener('created', onCreated);
      PouchDB.removeListener('destroyed', onDestroyed);
      for (const name of Array.from(watchers.keys())) {
        unwatch(name);
      }
      known.clear();
    }
  });

  // express-pouchdb's DELETE /:db destroys a database it never checks
  // exists: PouchDB opens it (a `created` event) and destroys it. That pair
  // is no event at all (CouchDB answers 404 and records nothing). This runs
  // before routes/db and changes nothing of the answer.
  app.delete('/:db', function (req, res, next) {
    if (!req.query.rev) {
      const name = cleanFilename(req.params.db);
      if (!known.has(name)) {
        deletingMissing.add(name);
        res.on('finish', function () {
          deletingMissing.delete(name);
        });
      }
    }
    next();
  });

  app.all('/_db_updates', function (req, res) {
    if (req.method !== 'GET') {
      res.status(405).set({Allow: 'GET', 'Content-Type': 'application/json', 'Cache-Control': 'must-revalidate'});
      res.send(Buffer.from(JSON.stringify({error: 'method_not_allowed', reason: 'Only GET allowed'}) + '\n'));
      return;
    }
    let opts;
    try {
      opts = parseQuery(req);
    } catch (e) {
      return badRequest(res, 'invalid_integer');
    }
    const feed = opts.feed;
    if (['normal', 'longpoll', 'continuous', 'eventsource'].indexOf(feed) === -1) {
      return badRequest(res, 'Supported `feed` types: normal, continuous, longpoll, eventsource');
    }
    let since;
    if (opts.since === 'now' || opts.descending) {
      since = updates.seq;
    } else {
      since = decodeSeq(opts.since);
      if (since === null) {
        return badRequest(res, "Malformed sequence supplied in 'since' parameter.");
      }
    }
    serve(req, res, feed, since, opts);
  });

  function serve(req, res, feed, since, opts) {
    let limit = opts.limit === null ? Infinity : opts.limit;
    const heartbeat = opts.heartbeat === null ? null : Math.min(DEFAULT_TIMEOUT, opts.heartbeat);
    const timeout = opts.timeout === null ? DEFAULT_TIMEOUT : Math.min(DEFAULT_TIMEOUT, opts.timeout);
    let started = false;
    let ended = false;
    let sent = 0; // rows sent
    let lastSeq = since;
    let prepend = '';
    let timer = null;
    let waiter = null;

    function write(s) {
      if (!started) {
        started = true;
        res.statusCode = 200;
        // setHeader, not express's set: that adds "; charset=utf-8" to text/*
        if (feed === 'eventsource') {
          res.setHeader('Content-Type', 'text/event-stream');
          res.setHeader('Cache-Control', 'no-cache');
        } else {
          res.setHeader('Content-Type', 'application/json');
          res.setHeader('Cache-Control', 'must-revalidate');
        }
        if (feed === 'normal' || feed === 'longpoll') {
          s = '{"results":[\n' + s;
        }
      }
      res.write(s);
      if (typeof res.flush === 'function') {
        res.flush(); // express-pouchdb's compression middleware
      }
    }

    function finish() {
      if (ended) {
        return;
      }
      ended = true;
      cleanup();
      const last = JSON.stringify(encodeSeq(lastSeq));
      if (feed === 'normal' || feed === 'longpoll') {
        write('\n],\n"last_seq":' + last + '}\n');
        res.end('\n');
      } else if (feed === 'continuous') {
        write('{"last_seq":' + last + '}\n');
        res.end('\n');
      } else {
        res.end();
      }
    }

    function cleanup() {
      if (timer) {
        clearTimeout(timer);
        timer = null;
      }
      if (waiter) {
        updates.waiters.delete(waiter);
        waiter = null;
      }
    }

    // send writes the rows after lastSeq; true when the limit is reached.
    function send(rows) {
      for (const e of rows) {
        if (sent >= limit) {
          return true;
        }
        const r = row(e);
        if (feed === 'eventsource') {
          write('data: ' + JSON.stringify(r) + '\nid: ' + JSON.stringify(r.seq) + '\n\n');
        } else if (feed === 'continuous') {
          write(JSON.stringify(r) + '\n');
        } else {
          write(prepend + JSON.stringify(r));
          prepend = ',\r\n';
        }
        sent++;
        lastSeq = e.n;
      }
      return sent >= limit;
    }

    if (feed === 'normal') {
      let rows;
      if (opts.descending) {
        rows = updates.since(0).reverse();
      } else {
        rows = updates.since(since);
      }
      const full = send(rows);
      if (!full && !opts.descending) {
        lastSeq = updates.seq;
      }
      if (!started) {
        write('');
      }
      return finish();
    }

    // longpoll, continuous, eventsource: as CouchDB's delayed responses,
    // the status and headers go with the first row, heartbeat or end.
    if (limit === 0) {
      return finish();
    }
    const first = updates.since(since);
    if (send(first) || (feed === 'longpoll' && first.length > 0)) {
      return finish();
    }
    lastSeq = Math.max(lastSeq, updates.seq);

    function arm() {
      if (timer) {
        clearTimeout(timer);
      }
      const wait = heartbeat === null ? timeout : heartbeat;
      timer = setTimeout(onTimer, wait);
    }
    function onTimer() {
      timer = null;
      if (heartbeat === null) {
        return finish();
      }
      if (feed === 'eventsource') {
        write('event: heartbeat\ndata: \n\n');
      } else {
        write('\n');
      }
      arm();
    }
    waiter = function () {
      if (ended) {
        return;
      }
      const rows = updates.since(lastSeq);
      const full = send(rows);
      lastSeq = Math.max(lastSeq, updates.seq);
      if (full || (feed === 'longpoll' && rows.length > 0)) {
        return finish();
      }
      arm();
    };
    updates.waiters.add(waiter);
    arm();
    res.on('close', function () {
      ended = true;
      cleanup();
    });
  }
}

// Put the route in place of express-pouchdb's stub, then start the server.
const stub = new Module(stubPath, null);
stub.filename = stubPath;
stub.paths = Module._nodeModulePaths(path.dirname(stubPath));
stub.loaded = true;
stub.exports = install;
require.cache[stubPath] = stub;

require(serverMain);
