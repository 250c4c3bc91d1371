// Real clients against `lilac serve` on the demo model: the openai package (v6) and the Vercel
// AI SDK (ai v6 + @ai-sdk/openai-compatible v2).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateText, streamText, tool, jsonSchema } from 'ai';
import { startServer, writeScript } from './helpers.mjs';

let demo;    // the demo model (random weights: the text is meaningless, the protocol is real)
let script;  // TEST-ONLY --scripted: forced outputs for tool calls
const KEY = 'test-key-123';

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather for a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string' }, days: { type: 'integer' } },
      required: ['city'],
    },
  },
};
const toolCallText = (city, days) => `<tool_call>\n<function=get_weather>\n<parameter=city>\n${city}\n</parameter>\n` +
  `<parameter=days>\n${days}\n</parameter>\n</function>\n</tool_call>`;

before(async () => {
  demo = await startServer(['--api-key', KEY, '--alias', 'demo']);
  const file = writeScript([
    { match: 'Tool result', text: 'It is sunny in Paris.\n</think>\n\nSunny, 21 °C in Paris.' },
    { match: 'weather', text: `The user asks for weather.\n</think>\n\n${toolCallText('Paris', 3)}\n${toolCallText('Zürich', 1)}` },
    { text: 'Nothing to do.\n</think>\n\nHello from the script — grüß dich!' },
  ]);
  script = await startServer(['--scripted', file]);
});

after(async () => {
  for (const s of [demo, script]) if (s) assert.equal((await s.stop()).code, 0, s.stderr());
});

test('models.list', async () => {
  const client = new OpenAI({ baseURL: demo.baseURL, apiKey: KEY });
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids, ['demo']);
});

test('chat, non-streaming', async () => {
  const client = new OpenAI({ baseURL: demo.baseURL, apiKey: KEY });
  const r = await client.chat.completions.create({
    model: 'demo', messages: [{ role: 'user', content: 'Say hi' }], max_completion_tokens: 12, seed: 7,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 12);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

test('chat, streaming with include_usage', async () => {
  const client = new OpenAI({ baseURL: demo.baseURL, apiKey: KEY });
  const stream = await client.chat.completions.create({
    model: 'demo', messages: [{ role: 'user', content: 'Count to three' }], max_tokens: 16, stream: true,
    stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  const ids = new Set(chunks.map((c) => c.id));
  assert.equal(ids.size, 1);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  assert.ok(last.usage.completion_tokens > 0 && last.usage.completion_tokens <= 16);
  const finish = chunks.filter((c) => c.choices[0]?.finish_reason).map((c) => c.choices[0].finish_reason);
  assert.equal(finish.length, 1);
  assert.ok(['stop', 'length'].includes(finish[0]));
});

test('same seed, same answer; the second turn reuses the prompt', async () => {
  const client = new OpenAI({ baseURL: demo.baseURL, apiKey: KEY });
  const ask = (seed) => client.chat.completions.create({
    model: 'demo', messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 20, seed, temperature: 1,
  });
  const a = await ask(1234);
  const b = await ask(1234);
  const msg = (r) => JSON.stringify([r.choices[0].message.content, r.choices[0].message.reasoning_content]);
  assert.equal(msg(a), msg(b));
  assert.equal(a.usage.completion_tokens, b.usage.completion_tokens);
  const turn2 = await client.chat.completions.create({
    model: 'demo', max_tokens: 4,
    messages: [{ role: 'user', content: 'Tell me a story' },
      { role: 'assistant', content: a.choices[0].message.content ?? '' },
      { role: 'user', content: 'Another one' }],
  });
  assert.ok(turn2.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(turn2.usage));
});

test('a wrong API key is an AuthenticationError', async () => {
  const client = new OpenAI({ baseURL: demo.baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(client.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  const health = await fetch(`${demo.url}/health`);
  assert.equal(health.status, 200);
});

test('openai: stream().finalChatCompletion() reassembles tool calls', async () => {
  const client = new OpenAI({ baseURL: script.baseURL, apiKey: 'none' });
  const runner = client.chat.completions.stream({
    model: 'x', messages: [{ role: 'user', content: 'What is the weather in Paris?' }], tools: [weatherTool],
  });
  const argDeltas = new Map();  // index -> the arguments deltas of that call, in order
  const heads = [];
  runner.on('chunk', (chunk) => {
    for (const tc of chunk.choices[0]?.delta?.tool_calls ?? []) {
      if (tc.id) heads.push(tc);
      if (!argDeltas.has(tc.index)) argDeltas.set(tc.index, []);
      argDeltas.get(tc.index).push(tc.function?.arguments ?? '');
    }
  });
  const final = await runner.finalChatCompletion();
  // Each call: a head (id, type, name, arguments ''), then one arguments delta per parameter and
  // the closing brace, with only index and function.arguments.
  assert.equal(heads.length, 2);
  for (const h of heads) assert.deepEqual([h.type, h.function.name, h.function.arguments], ['function', 'get_weather', '']);
  assert.deepEqual(argDeltas.get(0), ['', '{"city":"Paris"', ',"days":3', '}']);
  assert.deepEqual(argDeltas.get(1), ['', '{"city":"Zürich"', ',"days":1', '}']);
  const choice = final.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  const calls = choice.message.tool_calls;
  assert.equal(calls.length, 2);
  assert.equal(calls[0].type, 'function');
  assert.equal(calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(calls[0].function.arguments), { city: 'Paris', days: 3 });
  assert.deepEqual(JSON.parse(calls[1].function.arguments), { city: 'Zürich', days: 1 });
  assert.notEqual(calls[0].id, calls[1].id);
  // Non-streaming, the same calls; then the tool result goes back and the answer comes.
  const r = await client.chat.completions.create({
    model: 'x', messages: [{ role: 'user', content: 'What is the weather in Paris?' }], tools: [weatherTool],
    tool_choice: 'required',
  });
  assert.equal(r.choices[0].message.tool_calls.length, 2);
  assert.equal(r.choices[0].message.reasoning_content.trim(), 'The user asks for weather.');
  const follow = await client.chat.completions.create({
    model: 'x', tools: [weatherTool],
    messages: [{ role: 'user', content: 'What is the weather in Paris?' }, r.choices[0].message,
      { role: 'tool', tool_call_id: r.choices[0].message.tool_calls[0].id, content: 'Tool result: sunny, 21 C' }],
  });
  assert.equal(follow.choices[0].message.content.trim(), 'Sunny, 21 °C in Paris.');
  assert.equal(follow.choices[0].finish_reason, 'stop');
});

test('AI SDK: generateText and streamText', async () => {
  const provider = createOpenAICompatible({ name: 'lilac', baseURL: demo.baseURL, apiKey: KEY, includeUsage: true });
  const g = await generateText({ model: provider('demo'), prompt: 'Hello', maxOutputTokens: 10 });
  assert.equal(typeof g.text, 'string');
  assert.ok(g.usage.outputTokens > 0 && g.usage.outputTokens <= 10);
  const s = streamText({ model: provider('demo'), prompt: 'Hello again', maxOutputTokens: 10 });
  let streamed = '';
  for await (const part of s.textStream) streamed += part;
  assert.equal(streamed, await s.text);
  const usage = await s.usage;
  assert.ok(usage.outputTokens > 0 && usage.outputTokens <= 10);
});

test('AI SDK: tool calls and reasoning from the scripted server', async () => {
  const provider = createOpenAICompatible({ name: 'lilac', baseURL: script.baseURL });
  const r = await generateText({
    model: provider('x'),
    prompt: 'What is the weather in Paris?',
    tools: {
      get_weather: tool({
        description: 'Current weather for a city',
        inputSchema: jsonSchema({ type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } } }),
      }),
    },
  });
  assert.equal(r.finishReason, 'tool-calls');
  assert.equal(r.toolCalls.length, 2);
  assert.equal(r.toolCalls[0].toolName, 'get_weather');
  assert.deepEqual(r.toolCalls[0].input, { city: 'Paris', days: 3 });
  assert.equal(r.reasoningText?.trim(), 'The user asks for weather.');
  const s = streamText({ model: provider('x'), prompt: 'Just say hello' });
  let text = '';
  for await (const part of s.textStream) text += part;
  assert.equal(text.trim(), 'Hello from the script — grüß dich!');
  assert.equal((await s.reasoningText)?.trim(), 'Nothing to do.');
});
