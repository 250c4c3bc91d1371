// SIGTERM: new requests are refused (503), the running stream finishes or is cancelled within
// the grace period, and the process exits 0.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startServer } from './helpers.mjs';

test('graceful shutdown on SIGTERM', { timeout: 60000 }, async () => {
  const srv = await startServer(['--grace', '1', '--ctx-size', '100000']);
  const res = await fetch(`${srv.baseURL}/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'go on forever' }], max_tokens: 90000, stream: true,
      temperature: 0 }),
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  await reader.read();
  const t0 = Date.now();
  srv.proc.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 200));
  const refused = await fetch(`${srv.url}/v1/models`).then((r) => r.status).catch(() => 'closed');
  assert.ok(refused === 503 || refused === 'closed', `got ${refused}`);
  let rest = '';
  const dec = new TextDecoder();
  for (;;) {
    const { value, done } = await reader.read().catch(() => ({ done: true }));
    if (done) break;
    rest += dec.decode(value);
  }
  assert.ok(rest.includes('data: [DONE]'), 'the stream was ended properly');
  const { code } = await srv.exited;
  assert.equal(code, 0, srv.stderr());
  assert.ok(Date.now() - t0 < 10000, 'stopped within the grace period (+ margin)');
  assert.match(srv.stderr(), /shutting down/);
});
