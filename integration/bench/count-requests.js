// Counts the requests a pouchdb-server process serves, at the server:
// preloaded into it with NODE_OPTIONS="--require <this file>" by the
// per-user scale test and benchmark (integration/peruser_test.go).
//
// Every HTTP request the process receives is counted on arrival and until
// its response finished or its connection closed: requests in flight now
// and their peak, continuous/longpoll/eventsource feeds (long-lived, counted
// apart from the rest) open now and their peak, and the total. GET
// /_couchrep_requests answers these figures (it is not counted itself);
// ?reset=1 also starts new peaks from the current values. With
// COUCHREP_COUNT_REQUESTS_LOG=1 in its environment it also keeps every
// request's method and URL in arrival order (a test's request trace:
// integration/startreq_test.go), answered by GET /_couchrep_requests?log=1
// as {"log": ["GET /db/_local/x", ...]} (?log=1&reset=1 empties it).
'use strict';

const http = require('http');

const c = {inflight: 0, peak: 0, feeds: 0, peak_feeds: 0, total: 0};
const keepLog = process.env.COUCHREP_COUNT_REQUESTS_LOG === '1';
let log = [];
const emit = http.Server.prototype.emit;

http.Server.prototype.emit = function (ev, req, res) {
  if (ev !== 'request') {
    return emit.apply(this, arguments);
  }
  if (req.url.startsWith('/_couchrep_requests')) {
    res.writeHead(200, {'Content-Type': 'application/json'});
    if (req.url.indexOf('log=1') !== -1) {
      res.end(JSON.stringify({log: log}));
      if (req.url.indexOf('reset=1') !== -1) {
        log = [];
      }
      return true;
    }
    res.end(JSON.stringify(c));
    if (req.url.indexOf('reset=1') !== -1) {
      c.peak = c.inflight;
      c.peak_feeds = c.feeds;
    }
    return true;
  }
  const feed = /[?&]feed=(continuous|longpoll|eventsource)/.test(req.url);
  c.total++;
  if (keepLog) {
    log.push(req.method + ' ' + req.url);
  }
  if (feed) {
    c.feeds++;
    c.peak_feeds = Math.max(c.peak_feeds, c.feeds);
  } else {
    c.inflight++;
    c.peak = Math.max(c.peak, c.inflight);
  }
  let done = false;
  const end = () => {
    if (done) {
      return;
    }
    done = true;
    if (feed) {
      c.feeds--;
    } else {
      c.inflight--;
    }
  };
  res.on('finish', end);
  res.on('close', end);
  return emit.apply(this, arguments);
};
