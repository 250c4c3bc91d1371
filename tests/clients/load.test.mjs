// Load: 512 requests from 16 concurrent clients on loopback, every fifth abandoning its stream
// after the first delta. No crash, every request answered (a completion, or 429/503), memory
// bounded, the server healthy afterwards. The queue (32) holds every client, so all are served;
// a queue smaller than the client count turns the test into a 429 storm (QueueFullGives429 in
// tests/server covers that).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startServer } from './helpers.mjs';

test('512 requests, 16 clients, a fifth disconnecting mid-stream', { timeout: 240000 }, async () => {
  const srv = await startServer(['--queue', '32', '--log-level', 'warn']);
  const TOTAL = 512, CLIENTS = 16;
  const counts = { ok: 0, busy: 0, aborted: 0, other: 0 };
  const before = srv.memory();
  let next = 0;
  const started = Date.now();
  async function one(i) {
    const abandon = i % 5 === 0;
    const stream = abandon || i % 2 === 0;
    const ac = new AbortController();
    const res = await fetch(`${srv.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: `request ${i}` }], max_tokens: abandon ? 64 : 6, stream }),
      signal: ac.signal,
    });
    if (res.status === 429 || res.status === 503) { counts.busy++; await res.text(); return; }
    if (res.status !== 200) { counts.other++; console.error(res.status, await res.text()); return; }
    if (abandon) {
      const reader = res.body.getReader();
      await reader.read();  // the first delta
      ac.abort();
      counts.aborted++;
      return;
    }
    const text = await res.text();
    if (stream) assert.ok(text.endsWith('data: [DONE]\n\n'), text);
    else assert.equal(JSON.parse(text).object, 'chat.completion');
    counts.ok++;
  }
  async function client() {
    while (next < TOTAL) {
      const i = next++;
      try { await one(i); } catch (e) { if (e.name !== 'AbortError') { counts.other++; console.error(e); } }
    }
  }
  await Promise.all(Array.from({ length: CLIENTS }, client));
  const seconds = (Date.now() - started) / 1000;
  const mem = srv.memory();
  const health = await fetch(`${srv.url}/health`);
  assert.equal(health.status, 200);
  const after = await fetch(`${srv.baseURL}/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'still there?' }], max_tokens: 3 }),
  });
  assert.equal(after.status, 200);
  const metrics = await (await fetch(`${srv.url}/metrics`)).text();
  const cancelled = Number(metrics.match(/lilac_requests_cancelled_total (\d+)/)[1]);
  console.log(`load: ${TOTAL} requests in ${seconds.toFixed(1)} s: ${counts.ok} completed, ${counts.aborted} abandoned ` +
    `(${cancelled} cancelled by the engine), ${counts.busy} busy (429/503), ${counts.other} other; ` +
    `RSS ${(before.rssKb / 1024).toFixed(0)} MB before, peak ${(mem.peakKb / 1024).toFixed(0)} MB, ` +
    `now ${(mem.rssKb / 1024).toFixed(0)} MB`);
  assert.equal(counts.other, 0);
  assert.equal(counts.ok + counts.aborted + counts.busy, TOTAL);
  assert.ok(counts.aborted >= TOTAL / 5 - counts.busy);
  assert.ok(counts.ok >= TOTAL / 2, 'most requests complete');
  assert.ok(mem.peakKb < 1024 * 1024, `peak RSS ${mem.peakKb} kB`);
  assert.equal((await srv.stop()).code, 0, srv.stderr());
});
