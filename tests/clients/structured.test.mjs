// Structured output end to end on the demo model (random weights: without the grammar its output
// is never JSON): response_format json_schema / json_object and forced tool calls through the
// openai client and raw HTTP, every answer validated by an independent validator (ajv, draft
// 2020-12, with ajv-formats), and unsupported schema features answered with a 400 naming them.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { startServer, postJson } from './helpers.mjs';
import { generateSchema } from './schema-corpus.mjs';

const CORPUS_SIZE = 200;
const noThinking = { chat_template_kwargs: { enable_thinking: false } };
let server;
let client;

function validator() {
  const ajv = new Ajv2020({ strict: true, strictTuples: false, allErrors: true });
  addFormats(ajv);
  return ajv;
}

before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused' });
});

after(async () => {
  if (server) assert.equal((await server.stop()).code, 0, server.stderr());
});

const ask = [{ role: 'user', content: 'Answer in JSON.' }];

test(`a corpus of ${CORPUS_SIZE} generated schemas: every answer parses and validates (ajv)`, async () => {
  const ajv = validator();
  const failures = [];
  for (let i = 0; i < CORPUS_SIZE; i++) {
    const schema = generateSchema(i + 1);
    const validate = ajv.compile(schema);
    const res = await postJson(`${server.baseURL}/chat/completions`, {
      messages: ask, max_tokens: 600, seed: i, temperature: 1,
      response_format: { type: 'json_schema', json_schema: { name: `s${i}`, schema, strict: true } },
      ...noThinking,
    });
    const where = `schema ${i}: ${JSON.stringify(schema)}\n`;
    if (res.status !== 200) { failures.push(`${where}status ${res.status}: ${res.text}`); continue; }
    const choice = res.json.choices[0];
    if (choice.finish_reason !== 'stop') { failures.push(`${where}finish_reason ${choice.finish_reason}: ${choice.message.content}`); continue; }
    let value;
    try { value = JSON.parse(choice.message.content); } catch (e) { failures.push(`${where}not JSON: ${choice.message.content}`); continue; }
    if (!validate(value)) failures.push(`${where}invalid ${JSON.stringify(value)}: ${ajv.errorsText(validate.errors)}`);
  }
  assert.deepEqual(failures, []);
});

const person = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 12 },
    age: { type: 'integer', minimum: 0, maximum: 130 },
    email: { type: 'string', format: 'email' },
    born: { type: 'string', format: 'date' },
    tags: { type: 'array', items: { enum: ['a', 'b', 'c'] }, maxItems: 3 },
    nick: { type: 'string', maxLength: 5, nullable: true },
  },
  required: ['name', 'age', 'email', 'born', 'tags', 'nick'],
  additionalProperties: false,
};
const { nick, ...personForAjv } = person.properties;  // ajv has no `nullable`: check it by hand
const personAjv = { ...person, properties: { ...personForAjv, nick: { type: ['string', 'null'], maxLength: 5 } } };

test('openai client: response_format json_schema, plain and streamed', async () => {
  const validate = validator().compile(personAjv);
  const response_format = { type: 'json_schema', json_schema: { name: 'person', schema: person, strict: true } };
  const r = await client.chat.completions.create({ model: 'demo', messages: ask, max_tokens: 400, seed: 3, response_format, ...noThinking });
  assert.equal(r.choices[0].finish_reason, 'stop');
  const value = JSON.parse(r.choices[0].message.content);
  assert.ok(validate(value), JSON.stringify(validate.errors));

  const stream = await client.chat.completions.create({ model: 'demo', messages: ask, max_tokens: 400, seed: 4, response_format, stream: true, ...noThinking });
  let text = '';
  let finish = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, 'stop');
  assert.ok(validate(JSON.parse(text)), text);
});

test('response_format json_object: a JSON object', async () => {
  let complete = 0;
  for (let seed = 0; seed < 4; seed++) {
    const r = await client.chat.completions.create({ model: 'demo', messages: ask, max_tokens: 300, seed, response_format: { type: 'json_object' }, ...noThinking });
    const c = r.choices[0];
    assert.ok(c.message.content.startsWith('{'), c.message.content);
    if (c.finish_reason === 'stop') {  // free-form JSON has no bound: a cut answer is a prefix
      complete++;
      const v = JSON.parse(c.message.content);
      assert.equal(typeof v, 'object');
      assert.ok(v !== null && !Array.isArray(v));
    }
  }
  assert.ok(complete > 0, 'no json_object answer ended within max_tokens');
});

test('completions endpoint: response_format json_schema', async () => {
  const schema = { type: 'object', properties: { ok: { type: 'boolean' }, n: { type: 'integer', minimum: 1, maximum: 9 } }, required: ['ok', 'n'] };
  const res = await postJson(`${server.baseURL}/completions`, {
    prompt: 'JSON:', max_tokens: 100, seed: 1, response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
  });
  assert.equal(res.status, 200, res.text);
  assert.equal(res.json.choices[0].finish_reason, 'stop');
  assert.ok(validator().compile(schema)(JSON.parse(res.json.choices[0].text)), res.json.choices[0].text);
});

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      parameters: {
        type: 'object',
        properties: {
          city: { type: 'string', maxLength: 10 },
          unit: { type: 'string', enum: ['c', 'f'] },
          days: { type: 'integer', minimum: 1, maximum: 14 },
        },
        required: ['city', 'days'],
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'set_alarm',
      parameters: {
        type: 'object',
        properties: { at: { type: 'string', format: 'time' }, repeat: { type: 'array', items: { enum: ['mon', 'tue'] }, maxItems: 2 } },
        required: ['at'],
      },
    },
  },
];

test('openai client: tools with tool_choice required and a named function give valid calls', async () => {
  const ajv = validator();
  const schemas = Object.fromEntries(tools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
  for (const [seed, tool_choice] of [[1, 'required'], [2, 'required'], [3, { type: 'function', function: { name: 'set_alarm' } }]]) {
    const r = await client.chat.completions.create({
      model: 'demo', messages: [{ role: 'user', content: 'Do something.' }], max_tokens: 300, seed, tools, tool_choice,
      parallel_tool_calls: false, ...noThinking,
    });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
    assert.equal(c.message.tool_calls.length, 1);
    const call = c.message.tool_calls[0].function;
    if (typeof tool_choice === 'object') assert.equal(call.name, 'set_alarm');
    const validate = schemas[call.name];
    assert.ok(validate, call.name);
    assert.ok(validate(JSON.parse(call.arguments)), `${call.arguments}: ${ajv.errorsText(validate.errors)}`);
  }
});

test('a forced tool call streams as tool_call deltas', async () => {
  const stream = await client.chat.completions.create({
    model: 'demo', messages: [{ role: 'user', content: 'Weather?' }], max_tokens: 300, seed: 9, tools,
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, parallel_tool_calls: false, stream: true, ...noThinking,
  });
  let name = '';
  let args = '';
  let finish = null;
  for await (const chunk of stream) {
    for (const d of chunk.choices[0]?.delta?.tool_calls ?? []) {
      name += d.function?.name ?? '';
      args += d.function?.arguments ?? '';
    }
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(name, 'get_weather');
  assert.ok(validator().compile(tools[0].function.parameters)(JSON.parse(args)), args);
});

test('with thinking on, the grammar starts after </think>', async () => {
  // The demo model rarely closes its reasoning by chance: a request that ends is either cut in
  // the reasoning (no content) or a valid answer.
  const schema = { type: 'object', properties: { a: { type: 'integer', minimum: 0, maximum: 5 } }, required: ['a'] };
  const r = await client.chat.completions.create({
    model: 'demo', messages: ask, max_tokens: 40, seed: 5, response_format: { type: 'json_schema', json_schema: { name: 't', schema } },
  });
  const c = r.choices[0];
  if (c.message.content) assert.ok(validator().compile(schema)(JSON.parse(c.message.content)), c.message.content);
  else assert.equal(c.finish_reason, 'length');
});

test('unsupported schema features answer 400 naming them', async () => {
  const cases = [
    [{ type: 'string', format: 'hostname' }, 'hostname'],
    [{ type: 'object', patternProperties: { '^x': { type: 'string' } } }, 'patternProperties'],
    [{ type: 'array', items: { type: 'integer' }, uniqueItems: true }, 'uniqueItems'],
    [{ type: 'string', pattern: '^(?=a)a+$' }, 'lookaround'],
    [{ type: 'string', pattern: '(a)\\1' }, 'backreferences'],
    [{ oneOf: [{ type: 'string' }, { type: 'string', maxLength: 2 }] }, 'oneOf'],
    [{ $ref: 'https://example.com/schema.json' }, '$ref'],
    [{ type: 'number', multipleOf: 3 }, 'multipleOf'],
    [{ type: 'object', properties: { a: { type: 'string' } }, required: ['b'] }, "'b'"],
    [{ not: { type: 'string' } }, "'not'"],
  ];
  for (const [schema, word] of cases) {
    const res = await postJson(`${server.baseURL}/chat/completions`, {
      messages: ask, max_tokens: 5, response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
    });
    assert.equal(res.status, 400, `${JSON.stringify(schema)}: ${res.text}`);
    assert.ok(res.json.error.message.includes(word), `${word} not in: ${res.json.error.message}`);
  }
  const bad = await postJson(`${server.baseURL}/chat/completions`, { messages: ask, response_format: { type: 'xml' } });
  assert.equal(bad.status, 400);
  assert.match(bad.json.error.message, /json_schema/);
  const badTool = await postJson(`${server.baseURL}/chat/completions`, {
    messages: ask, tool_choice: 'required',
    tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { x: { type: 'string', format: 'ipv4' } } } } }],
  });
  assert.equal(badTool.status, 400, badTool.text);
  assert.match(badTool.json.error.message, /ipv4/);
  // The server keeps serving.
  const ok = await postJson(`${server.baseURL}/chat/completions`, { messages: ask, max_tokens: 2 });
  assert.equal(ok.status, 200);
});
