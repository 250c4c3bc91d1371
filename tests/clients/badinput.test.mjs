// Bad input never crashes the server and never costs the next request: each case is a 4xx in the
// OpenAI error shape, and a good request right after it is served.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJson } from './helpers.mjs';

let srv;
before(async () => { srv = await startServer(['--ctx-size', '256', '--max-body', '1']); });
after(async () => { assert.equal((await srv.stop()).code, 0, srv.stderr()); });

const chat = (over = {}) => ({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, ...over });

const cases = [
  ['malformed JSON', '{"messages": [', 400],
  ['JSON that is not an object', '[1, 2, 3]', 400],
  ['empty body', '', 400],
  ['messages missing', {}, 400],
  ['messages not an array', { messages: 'hi' }, 400],
  ['empty messages', { messages: [] }, 400],
  ['message not an object', { messages: [42] }, 400],
  ['unknown role', { messages: [{ role: 'wizard', content: 'hi' }] }, 400],
  ['role not a string', { messages: [{ role: 7, content: 'hi' }] }, 400],
  ['content of a wrong type', { messages: [{ role: 'user', content: 12 }] }, 400],
  ['image content part', { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }, 400],
  ['max_tokens 0', chat({ max_tokens: 0 }), 400],
  ['max_tokens negative', chat({ max_tokens: -5 }), 400],
  ['max_completion_tokens a string', chat({ max_completion_tokens: 'ten' }), 400],
  ['temperature a string', chat({ temperature: 'hot' }), 400],
  ['temperature negative', chat({ temperature: -1 }), 400],
  ['top_p above 1', chat({ top_p: 1.5 }), 400],
  ['stop with five strings', chat({ stop: ['a', 'b', 'c', 'd', 'e'] }), 400],
  ['stop of a wrong type', chat({ stop: 5 }), 400],
  ['n = 2', chat({ n: 2 }), 400],
  ['top_logprobs 21', chat({ logprobs: true, top_logprobs: 21 }), 400],
  ['tools not an array', chat({ tools: {} }), 400],
  ['tool_choice naming an unknown tool', chat({ tools: [{ type: 'function', function: { name: 'a' } }], tool_choice: { type: 'function', function: { name: 'b' } } }), 400],
  ['tool_choice required without tools', chat({ tool_choice: 'required' }), 400],
  ['assistant tool call arguments not JSON', { messages: [{ role: 'user', content: 'x' }, { role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: '{oops' } }] }, { role: 'user', content: 'y' }] }, 400],
  ['stream not a boolean', chat({ stream: 'yes' }), 400],
  ['prompt longer than the context', { messages: [{ role: 'user', content: 'word '.repeat(2000) }] }, 400],
];

for (const [name, body, status] of cases) {
  test(`chat: ${name} -> ${status}, then served`, async () => {
    const r = await postJson(`${srv.baseURL}/chat/completions`, body);
    assert.equal(r.status, status, r.text);
    assert.ok(r.json && r.json.error, r.text);
    assert.equal(typeof r.json.error.message, 'string');
    assert.equal(typeof r.json.error.type, 'string');
    assert.ok('param' in r.json.error && 'code' in r.json.error);
    const ok = await postJson(`${srv.baseURL}/chat/completions`, chat());
    assert.equal(ok.status, 200, ok.text);
  });
}

test('invalid UTF-8 in the body -> 400, then served', async () => {
  const bytes = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"a'), Buffer.from([0xc3, 0x28, 0xff]),
    Buffer.from('"}]}')]);
  const res = await fetch(`${srv.baseURL}/chat/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: bytes });
  assert.equal(res.status, 400);
  assert.ok((await res.json()).error.message);
  assert.equal((await postJson(`${srv.baseURL}/chat/completions`, chat())).status, 200);
});

test('a huge body -> 413, then served', async () => {
  const huge = JSON.stringify(chat({ messages: [{ role: 'user', content: 'x'.repeat(3 << 20) }] }));
  const r = await postJson(`${srv.baseURL}/chat/completions`, huge);
  assert.equal(r.status, 413, r.text);
  assert.ok(r.json.error.message.includes('larger than'));
  assert.equal((await postJson(`${srv.baseURL}/chat/completions`, chat())).status, 200);
});

test('completions, tokenize, detokenize, unknown routes', async () => {
  for (const [path, body] of [
    ['/v1/completions', { prompt: '' }],
    ['/v1/completions', { prompt: ['a', 'b'] }],
    ['/v1/completions', { prompt: [1, 999999] }],
    ['/v1/completions', { prompt: 'x', max_tokens: 0 }],
    ['/detokenize', { tokens: [-1] }],
    ['/detokenize', { tokens: 'abc' }],
    ['/tokenize', { content: 5 }],
    ['/apply-template', { messages: [] }],
  ]) {
    const r = await postJson(`${srv.url}${path}`, body);
    assert.equal(r.status, 400, `${path} ${JSON.stringify(body)}: ${r.text}`);
    assert.ok(r.json.error.message);
  }
  const nf = await fetch(`${srv.url}/v1/nothing`);
  assert.equal(nf.status, 404);
  assert.ok((await nf.json()).error.message.includes('/v1/nothing'));
  assert.equal((await postJson(`${srv.baseURL}/completions`, { prompt: 'hello', max_tokens: 2 })).status, 200);
  assert.equal((await fetch(`${srv.url}/health`)).status, 200);
});
