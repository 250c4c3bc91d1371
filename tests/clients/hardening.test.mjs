// Issue 10 with real clients: the official `openai` SDK (global fetch, pooled keep-alive
// connections) and Node's fetch against the hardened transport.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, postJson } from './helpers.mjs';

let srv;
before(async () => { srv = await startServer(['--ctx-size', '256', '--api-key', 'sekret']); });
after(async () => { assert.equal((await srv.stop()).code, 0, srv.stderr()); });

const messages = [{ role: 'user', content: 'hi' }];

test('a wrong key, then the right key on the pooled connection: 401, then 200', async () => {
  // The 401 used to leave its body unread on the keep-alive connection; the next request on it
  // (the one with the right key) then failed with 400.
  for (let i = 0; i < 3; i++) {
    const bad = new OpenAI({ baseURL: srv.baseURL, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(bad.chat.completions.create({ model: 'lilac-demo', messages, max_tokens: 2 }),
      (e) => e.status === 401);
    const good = new OpenAI({ baseURL: srv.baseURL, apiKey: 'sekret', maxRetries: 0 });
    const r = await good.chat.completions.create({ model: 'lilac-demo', messages, max_tokens: 2 });
    assert.ok(r.choices[0].finish_reason);
  }
});

const auth = { Authorization: 'Bearer sekret' };

test('deep JSON and out-of-range numbers are 400s naming the field', async () => {
  const deep = '['.repeat(100000) + ']'.repeat(100000);
  const cases = [
    [`{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":${deep}}]}`, null],
    [`{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"x":${deep}}}`, null],
    ['{"messages":[{"role":"user","content":"hi"}],"temperature":1e309}', 'temperature'],
    ['{"messages":[{"role":"user","content":"hi"}],"max_tokens":-1e309}', 'max_tokens'],
    ['{"messages":[{"role":"user","content":"hi"}],"max_tokens":1e300}', 'max_tokens'],
  ];
  for (const [body, param] of cases) {
    const r = await postJson(`${srv.baseURL}/chat/completions`, body, auth);
    assert.equal(r.status, 400, r.text.slice(0, 300));
    if (param) assert.equal(r.json.error.param, param);
  }
  const ok = await postJson(`${srv.baseURL}/chat/completions`, { messages, max_tokens: 2 }, auth);
  assert.equal(ok.status, 200, ok.text);
});

test('a gzip body is refused with 415', async () => {
  const { gzipSync } = await import('node:zlib');
  const res = await fetch(`${srv.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'Content-Encoding': 'gzip', ...auth },
    body: gzipSync(JSON.stringify({ messages, max_tokens: 2 })),
  });
  assert.equal(res.status, 415, await res.text());
});
