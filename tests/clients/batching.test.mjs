// Continuous batching through HTTP (docs/batching.md): `lilac serve --parallel 8` on the demo
// model (CPU). 32 concurrent streaming clients (the openai package) each get exactly the greedy
// answer the same request gets served alone; /metrics shows decode steps that carried more than
// one sequence; nothing is lost; clients that disconnect free their slots; the serving benchmark
// script (bench/serve_bench.mjs) runs against it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, repoRoot } from './helpers.mjs';
import { join } from 'node:path';

let srv;
let client;

before(async () => {
  srv = await startServer(['--parallel', '8', '--queue', '64', '--log-level', 'warn']);
  client = new OpenAI({ baseURL: srv.baseURL, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  if (srv) assert.equal((await srv.stop()).code, 0, srv.stderr());
});

async function metrics() {
  return (await fetch(`${srv.url}/metrics`)).text();
}
function metric(text, name) {
  const m = text.match(new RegExp(`^${name.replace(/[{}"=]/g, '\\$&')} (\\S+)$`, 'm'));
  assert.ok(m, `${name} in\n${text}`);
  return Number(m[1]);
}

const request = (i) => ({
  model: 'demo',
  messages: [{ role: 'user', content: `Client ${i} asks about ${'colours and numbers '.repeat(i % 4)}item ${i}.` }],
  temperature: 0,
  max_tokens: 12 + (i % 9),
});

test('32 concurrent streaming clients get the answers they get alone', { timeout: 240000 }, async () => {
  const N = 32;
  const alone = [];
  for (let i = 0; i < N; ++i) {
    const r = await client.chat.completions.create(request(i));
    alone.push({ content: r.choices[0].message.content, reasoning: r.choices[0].message.reasoning_content ?? '',
      tokens: r.usage.completion_tokens });
  }
  const before = await metrics();
  const batchedBefore = metric(before, 'lilac_batch_size_count') - metric(before, 'lilac_batch_size_bucket{le="1"}');
  const together = await Promise.all(Array.from({ length: N }, async (_, i) => {
    const stream = await client.chat.completions.create({ ...request(i), stream: true, stream_options: { include_usage: true } });
    let content = '', reasoning = '', tokens = null;
    for await (const chunk of stream) {
      const d = chunk.choices[0]?.delta;
      if (d?.content) content += d.content;
      if (d?.reasoning_content) reasoning += d.reasoning_content;
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
    }
    return { content, reasoning, tokens };
  }));
  assert.equal(together.length, N, 'none lost');
  for (let i = 0; i < N; ++i) assert.deepEqual(together[i], alone[i], `client ${i}`);
  const after = await metrics();
  const batched = metric(after, 'lilac_batch_size_count') - metric(after, 'lilac_batch_size_bucket{le="1"}');
  assert.ok(batched - batchedBefore > 0, `decode steps with more than one sequence:\n${after}`);
  assert.equal(metric(after, 'lilac_slots'), 8);
  assert.equal(metric(after, 'lilac_running'), 0);
});

test('clients that disconnect free their slots', { timeout: 120000 }, async () => {
  // Eight endless streams take every slot; they disconnect after their first chunk.
  const controllers = [];
  await Promise.all(Array.from({ length: 8 }, async (_, i) => {
    const ac = new AbortController();
    controllers.push(ac);
    const res = await fetch(`${srv.baseURL}/completions`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: `endless ${i}`, max_tokens: 100000, ignore_eos: true, stream: true }),
      signal: ac.signal,
    });
    assert.equal(res.status, 200);
    await res.body.getReader().read();
  }));
  assert.equal(metric(await metrics(), 'lilac_running'), 8);
  for (const ac of controllers) ac.abort();
  const until = Date.now() + 20000;
  let running = 8;
  while (Date.now() < until && (running = metric(await metrics(), 'lilac_running')) > 0)
    await new Promise((r) => setTimeout(r, 50));
  assert.equal(running, 0, 'the engine cancelled the abandoned streams');
  // All slots serve again.
  const answers = await Promise.all(Array.from({ length: 8 }, (_, i) => client.chat.completions.create(request(i))));
  for (const a of answers) assert.equal(a.choices[0].finish_reason === 'stop' || a.choices[0].finish_reason === 'length', true);
});

test('ignore_eos gives exactly max_tokens; the serving benchmark runs', { timeout: 120000 }, async () => {
  const r = await client.completions.create({ model: 'demo', prompt: [1, 2, 3, 4], max_tokens: 40, temperature: 0, ignore_eos: true });
  assert.equal(r.usage.completion_tokens, 40);
  assert.equal(r.choices[0].finish_reason, 'length');
  const { runServeBench } = await import(join(repoRoot, 'bench', 'serve_bench.mjs'));
  const report = await runServeBench({ url: srv.url, concurrency: 4, requests: 8, inputTokens: 64, outputTokens: 16, vocab: 500 });
  assert.equal(report.errors, 0, JSON.stringify(report.error_samples));
  assert.equal(report.completed, 8);
  assert.equal(report.output_tokens, 8 * 16);
  assert.equal(report.warmup_requests, 1);
  assert.ok(report.output_tok_s > 0);
  for (const k of ['ttft_ms', 'itl_ms', 'tpot_ms']) assert.ok(report[k].p50 > 0 && report[k].p99 >= report[k].p50, k);
});
