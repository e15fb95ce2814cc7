// purchase.js: the load generator's scenario for k6 users. Every iteration
// is one purchase by the next buyer in a token list (a unique buyer per
// iteration; more iterations than tokens means repeats), with checks on the
// status, a counter per outcome, thresholds on p99 latency and on accepted <=
// stock, and a JSON summary. Only k6's built-in modules: no remote imports.
//
//   go run ./loadtest tokens --users 2000 --out /tmp/tokens.txt
//   k6 run -e URL=http://127.0.0.1:18080 -e TOKENS=/tmp/tokens.txt \
//          -e ADMIN_TOKEN=$SECKILL_ADMIN_TOKEN -e STOCK=500 -e REQUESTS=5000 -e VUS=64 \
//          loadtest/k6/purchase.js
//
// Settings (-e NAME=value): URL, TOKENS (file, one token per line), VOUCHER
// (buy this one; else one is created with ADMIN_TOKEN and STOCK), STOCK,
// REQUESTS (default: one per token), VUS, P99_MS (threshold, default 40),
// SUMMARY (JSON summary file, default k6-summary.json).
// k6 cannot read MySQL and Redis: the pipeline check is the Go tool's
// (go run ./loadtest), which runs the same scenario and then checks.
import http from 'k6/http';
import { check } from 'k6';
import { Counter } from 'k6/metrics';
import { SharedArray } from 'k6/data';
import exec from 'k6/execution';

const URL = (__ENV.URL || 'http://127.0.0.1:18080').replace(/\/+$/, '');
const STOCK = parseInt(__ENV.STOCK || '500', 10);
const VUS = parseInt(__ENV.VUS || '64', 10);
const P99_MS = parseFloat(__ENV.P99_MS || '40');

const tokens = new SharedArray('tokens', function () {
  return open(__ENV.TOKENS || './tokens.txt')
    .split('\n')
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
});
const REQUESTS = parseInt(__ENV.REQUESTS || String(tokens.length), 10);

const accepted = new Counter('purchase_accepted');
const soldOut = new Counter('purchase_sold_out');
const alreadyPurchased = new Counter('purchase_already_purchased');
const rateLimited = new Counter('purchase_rate_limited');
const unsure = new Counter('purchase_unsure'); // 5xx or no answer: may or may not have been taken
const other = new Counter('purchase_other');

export const options = {
  scenarios: {
    stampede: { executor: 'shared-iterations', vus: VUS, iterations: REQUESTS, maxDuration: '10m' },
  },
  summaryTrendStats: ['avg', 'min', 'med', 'max', 'p(90)', 'p(95)', 'p(99)'],
  thresholds: {
    'http_req_duration{name:purchase}': [`p(99)<${P99_MS}`],
    purchase_accepted: [`count<=${STOCK}`],
    checks: ['rate==1'],
  },
};

export function setup() {
  if (__ENV.VOUCHER) {
    return { voucher: __ENV.VOUCHER };
  }
  const now = Date.now();
  const body = JSON.stringify({
    title: 'k6 ' + new Date(now).toISOString(),
    face_value: 100,
    stock: STOCK,
    begin_at: new Date(now - 60 * 1000).toISOString(),
    end_at: new Date(now + 60 * 60 * 1000).toISOString(),
  });
  const res = http.post(`${URL}/api/v1/vouchers`, body, {
    headers: { Authorization: `Bearer ${__ENV.ADMIN_TOKEN}`, 'Content-Type': 'application/json' },
    tags: { name: 'create_voucher' },
  });
  if (res.status !== 201) {
    throw new Error(`create voucher: ${res.status} ${res.body}`);
  }
  return { voucher: res.json('voucher.id') };
}

export default function (data) {
  const i = exec.scenario.iterationInTest;
  const token = tokens[i % tokens.length];
  const res = http.post(`${URL}/api/v1/vouchers/${data.voucher}/orders`, null, {
    headers: { Authorization: `Bearer ${token}` },
    tags: { name: 'purchase' },
  });
  let code = '';
  try {
    code = res.json('code') || '';
  } catch (e) {
    code = '';
  }
  if (res.status === 202) {
    accepted.add(1);
  } else if (res.status === 409 && code === 'sold_out') {
    soldOut.add(1);
  } else if (res.status === 409 && code === 'already_purchased') {
    alreadyPurchased.add(1);
  } else if (res.status === 429) {
    rateLimited.add(1);
  } else if (res.status === 0 || res.status >= 500) {
    unsure.add(1);
  } else {
    other.add(1);
  }
  check(res, {
    'answered 202, 409 or 429': (r) => r.status === 202 || r.status === 409 || r.status === 429,
    'a 202 carries an order id': (r) => r.status !== 202 || typeof r.json('order_id') === 'string',
  });
}

export function handleSummary(data) {
  const m = data.metrics;
  const count = (name) => (m[name] ? m[name].values.count : 0);
  const d = m['http_req_duration{name:purchase}'] || m.http_req_duration;
  const v = d ? d.values : {};
  const ms = (x) => (typeof x === 'number' ? x.toFixed(2) : '-');
  const reqs = m.http_reqs ? m.http_reqs.values : { count: 0, rate: 0 };
  const lines = [
    '',
    `purchases   ${REQUESTS} by ${tokens.length} buyers, ${VUS} VUs: ${reqs.rate.toFixed(0)} requests/s`,
    `latency ms  p50 ${ms(v.med)}  p90 ${ms(v['p(90)'])}  p99 ${ms(v['p(99)'])}  max ${ms(v.max)}`,
    `answers     accepted ${count('purchase_accepted')} (stock ${STOCK}), sold_out ${count('purchase_sold_out')}, ` +
      `already_purchased ${count('purchase_already_purchased')}, rate_limited ${count('purchase_rate_limited')}, ` +
      `unsure ${count('purchase_unsure')}, other ${count('purchase_other')}`,
    '',
  ];
  return {
    [__ENV.SUMMARY || 'k6-summary.json']: JSON.stringify(data, null, 2),
    stdout: lines.join('\n'),
  };
}
