// The openai package's Responses API (client.responses.create / stream) against `lilac serve`
// /v1/responses: the demo model (random weights) and scripted outputs (function calls and their
// outputs, reasoning items).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, writeScript } from './helpers.mjs';

let demo;
let script;
const KEY = 'responses-key';

const weatherTool = {
  type: 'function', name: 'get_weather', description: 'Current weather for a city', strict: false,
  parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
};
const call = (city, days) => `<tool_call>\n<function=get_weather>\n<parameter=city>\n${city}\n</parameter>\n` +
  `<parameter=days>\n${days}\n</parameter>\n</function>\n</tool_call>`;

before(async () => {
  demo = await startServer(['--api-key', KEY, '--alias', 'demo']);
  const file = writeScript([
    { match: 'Tool result', text: 'Got it.\n</think>\n\nSunny, 21 °C in Paris.' },
    { match: 'weather', text: `Need the weather.\n</think>\n\n${call('Paris', 3)}` },
    { text: 'Nothing to do.\n</think>\n\nHello from the script — grüß dich!' },
  ]);
  script = await startServer(['--scripted', file]);
});

after(async () => {
  for (const s of [demo, script]) if (s) assert.equal((await s.stop()).code, 0, s.stderr());
});

test('responses.create on the demo model', async () => {
  const client = new OpenAI({ baseURL: demo.baseURL, apiKey: KEY });
  const r = await client.responses.create({ model: 'demo', input: 'Say hi', max_output_tokens: 12, instructions: 'Be brief.' });
  assert.equal(r.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(r.status));
  assert.equal(typeof r.output_text, 'string');
  assert.ok(r.usage.input_tokens > 0);
  assert.ok(r.usage.output_tokens > 0 && r.usage.output_tokens <= 12);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
});

test('responses.create, plain: reasoning and message items; output_text', async () => {
  const client = new OpenAI({ baseURL: script.baseURL, apiKey: 'none' });
  const r = await client.responses.create({ model: 'x', input: 'hello', store: false });
  assert.equal(r.status, 'completed');
  assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'message']);
  assert.equal(r.output[0].content[0].text, 'Nothing to do.');
  assert.equal(r.output_text, 'Hello from the script — grüß dich!');
});

test('responses streaming: the event sequence, then the function call round trip', async () => {
  const client = new OpenAI({ baseURL: script.baseURL, apiKey: 'none' });
  const stream = await client.responses.create({
    model: 'x', stream: true, tools: [weatherTool, { type: 'web_search' }], reasoning: { effort: 'high' },
    input: [{ role: 'user', content: [{ type: 'input_text', text: 'What is the weather in Paris?' }] }],
  });
  const types = [];
  let args = '';
  const deltas = [];
  let done;
  let completed;
  for await (const e of stream) {
    types.push(e.type);
    if (e.type === 'response.function_call_arguments.delta') { args += e.delta; deltas.push(e.delta); }
    if (e.type === 'response.function_call_arguments.done') done = e;
    if (e.type === 'response.completed') completed = e.response;
  }
  // The arguments stream per parameter: '{"city":"Paris"', ',"days":3', '}'; done has them whole.
  assert.deepEqual(deltas, ['{"city":"Paris"', ',"days":3', '}']);
  assert.equal(done.arguments, args);
  assert.equal(done.name, 'get_weather');
  const added = types.indexOf('response.output_item.added', types.indexOf('response.reasoning_text.delta'));
  assert.ok(added >= 0 && added < types.indexOf('response.function_call_arguments.delta'));
  assert.ok(types.indexOf('response.function_call_arguments.done') < types.lastIndexOf('response.output_item.done'));
  assert.equal(types[0], 'response.created');
  assert.equal(types.at(-1), 'response.completed');
  assert.ok(types.includes('response.reasoning_text.delta'));
  assert.ok(types.includes('response.function_call_arguments.done'));
  assert.deepEqual(JSON.parse(args), { city: 'Paris', days: 3 });
  const fc = completed.output.find((o) => o.type === 'function_call');
  assert.equal(fc.name, 'get_weather');
  assert.ok(completed.usage.output_tokens > 0);
  // The call's output goes back with the items of the first response (stateless: all of them).
  const follow = await client.responses.create({
    model: 'x', tools: [weatherTool],
    input: [
      { role: 'user', content: 'What is the weather in Paris?' },
      ...completed.output,
      { type: 'function_call_output', call_id: fc.call_id, output: 'Tool result: sunny, 21 C' },
    ],
  });
  assert.equal(follow.output_text, 'Sunny, 21 °C in Paris.');
  assert.ok(follow.usage.input_tokens_details.cached_tokens > 0, JSON.stringify(follow.usage));
  // The SDK's stream helper reassembles the same response.
  const helper = client.responses.stream({ model: 'x', input: 'hello' });
  const final = await helper.finalResponse();
  assert.equal(final.output_text, 'Hello from the script — grüß dich!');
});

test('previous_response_id is a clear 400 (stateless server)', async () => {
  const client = new OpenAI({ baseURL: script.baseURL, apiKey: 'none', maxRetries: 0 });
  await assert.rejects(client.responses.create({ model: 'x', input: 'hi', previous_response_id: 'resp_123' }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'previous_response_id');
});
