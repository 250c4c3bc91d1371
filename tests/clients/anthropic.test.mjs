// The Anthropic SDK (@anthropic-ai/sdk) against `lilac serve` /v1/messages: the demo model (random
// weights: the text is meaningless, the protocol is real) and scripted outputs (tool use,
// thinking, the thinking budget).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, writeScript } from './helpers.mjs';

let demo;
let script;
const KEY = 'anthropic-key-1';

const weatherTool = {
  name: 'get_weather',
  description: 'Current weather for a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
};
const call = (city, days) => `<tool_call>\n<function=get_weather>\n<parameter=city>\n${city}\n</parameter>\n` +
  `<parameter=days>\n${days}\n</parameter>\n</function>\n</tool_call>`;

before(async () => {
  demo = await startServer(['--api-key', KEY, '--alias', 'demo']);
  const file = writeScript([
    { match: 'Tool result', text: 'Got it.\n</think>\n\nSunny, 21 °C in Paris.' },
    { match: 'weather', text: `Need the weather.\n</think>\n\nLet me check.\n${call('Paris', 3)}` },
    { match: 'ponder', text: 'one two three four five six seven eight nine ten\n</think>\n\nDone pondering.' },
    { text: 'Nothing to do.\n</think>\n\nHello from the script — grüß dich!' },
  ]);
  script = await startServer(['--scripted', file]);
});

after(async () => {
  for (const s of [demo, script]) if (s) assert.equal((await s.stop()).code, 0, s.stderr());
});

test('messages.create on the demo model, x-api-key auth', async () => {
  const client = new Anthropic({ baseURL: demo.url, apiKey: KEY });
  const m = await client.messages.create({
    model: 'claude-sonnet-4-5', max_tokens: 12, messages: [{ role: 'user', content: 'Say hi' }],
  });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.ok(Array.isArray(m.content));
  assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason));
  assert.ok(m.usage.input_tokens > 0);
  assert.ok(m.usage.output_tokens > 0 && m.usage.output_tokens <= 12);
  // Bearer auth (ANTHROPIC_AUTH_TOKEN) works as well.
  const bearer = new Anthropic({ baseURL: demo.url, authToken: KEY, apiKey: null });
  const b = await bearer.messages.create({ model: 'x', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(b.type, 'message');
});

test('a wrong key and an image are clear errors in Anthropic shape', async () => {
  const wrong = new Anthropic({ baseURL: demo.url, apiKey: 'nope', maxRetries: 0 });
  await assert.rejects(wrong.messages.create({ model: 'x', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e instanceof Anthropic.AuthenticationError && e.error?.error?.type === 'authentication_error');
  const client = new Anthropic({ baseURL: demo.url, apiKey: KEY, maxRetries: 0 });
  await assert.rejects(client.messages.create({
    model: 'x', max_tokens: 2,
    messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0KGgo=' } }] }],
  }), (e) => e instanceof Anthropic.BadRequestError && /text only/.test(e.message));
});

test('messages.stream: thinking, text and a tool_use block, then the tool round trip', async () => {
  const client = new Anthropic({ baseURL: script.url, apiKey: 'none' });
  const events = [];
  const stream = client.messages.stream({
    model: 'x', max_tokens: 400, tools: [weatherTool], messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
  });
  const partials = [];
  stream.on('streamEvent', (e) => {
    events.push(e.type);
    if (e.type === 'content_block_delta' && e.delta.type === 'input_json_delta') partials.push(e.delta.partial_json);
  });
  const final = await stream.finalMessage();
  // The tool_use input streams per parameter, then the closing brace.
  assert.deepEqual(partials, ['{"city":"Paris"', ',"days":3', '}']);
  assert.deepEqual(final.content.map((b) => b.type), ['thinking', 'text', 'tool_use']);
  assert.equal(final.content[0].thinking, 'Need the weather.');
  assert.equal(final.content[1].text, 'Let me check.');
  const use = final.content[2];
  assert.equal(use.name, 'get_weather');
  assert.deepEqual(use.input, { city: 'Paris', days: 3 });
  assert.equal(final.stop_reason, 'tool_use');
  assert.equal(events[0], 'message_start');
  assert.equal(events.at(-1), 'message_stop');
  assert.ok(events.includes('content_block_delta'));
  // The tool result goes back (with the thinking block, as Claude Code sends it).
  const follow = await client.messages.create({
    model: 'x', max_tokens: 400, tools: [weatherTool],
    messages: [
      { role: 'user', content: 'What is the weather in Paris?' },
      { role: 'assistant', content: final.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'Tool result: sunny, 21 C' }] },
    ],
  });
  assert.equal(follow.stop_reason, 'end_turn');
  assert.equal(follow.content.at(-1).text, 'Sunny, 21 °C in Paris.');
  assert.ok(follow.usage.cache_read_input_tokens > 0, JSON.stringify(follow.usage));
});

test('thinking budget_tokens cuts the thinking; disabled thinking; count_tokens', async () => {
  const client = new Anthropic({ baseURL: script.url, apiKey: 'none' });
  const cut = await client.messages.create({
    model: 'x', max_tokens: 100, thinking: { type: 'enabled', budget_tokens: 3 },
    messages: [{ role: 'user', content: 'ponder this' }],
  });
  assert.equal(cut.content[0].type, 'thinking');
  assert.ok(cut.content[0].thinking.length < 'one two three four'.length, cut.content[0].thinking);
  assert.ok('one two three'.startsWith(cut.content[0].thinking), cut.content[0].thinking);
  assert.equal(cut.content[1].type, 'text');
  const full = await client.messages.create({
    model: 'x', max_tokens: 100, messages: [{ role: 'user', content: 'ponder this' }],
  });
  assert.equal(full.content[0].thinking, 'one two three four five six seven eight nine ten');
  const count = (thinking) => client.messages.countTokens({
    model: 'x', ...(thinking ? { thinking } : {}), messages: [{ role: 'user', content: 'ponder this' }],
    system: [{ type: 'text', text: 'x-anthropic-billing-header: cc_version=1; cch=abcde;' }, { type: 'text', text: 'Be brief.' }],
  });
  const on = await count({ type: 'enabled', budget_tokens: 1024 });
  const off = await count({ type: 'disabled' });
  assert.ok(on.input_tokens > 0);
  assert.ok(off.input_tokens > on.input_tokens, `${off.input_tokens} vs ${on.input_tokens}`);
});

test('--chat-template-kwargs: server-wide defaults (a thinking budget); invalid JSON refused at start', async () => {
  const file = writeScript([{ text: 'one two three four five six seven eight nine ten\n</think>\n\nDone.' }]);
  const s = await startServer(['--scripted', file, '--chat-template-kwargs', '{"thinking_budget": 2}']);
  try {
    const client = new Anthropic({ baseURL: s.url, apiKey: 'none' });
    const m = await client.messages.create({ model: 'x', max_tokens: 50, messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(m.content[0].type, 'thinking');
    assert.ok('one two'.startsWith(m.content[0].thinking) && m.content[0].thinking.length > 0, m.content[0].thinking);
    // A request's own budget wins over the default.
    const own = await client.messages.create({
      model: 'x', max_tokens: 50, thinking: { type: 'enabled', budget_tokens: 100 }, messages: [{ role: 'user', content: 'hi' }],
    });
    assert.equal(own.content[0].thinking, 'one two three four five six seven eight nine ten');
  } finally {
    assert.equal((await s.stop()).code, 0, s.stderr());
  }
  await assert.rejects(startServer(['--scripted', file, '--chat-template-kwargs', '[1, 2]']), /must be a JSON object/);
});
