#!/usr/bin/env node
// Serving benchmark: N concurrent streaming clients against a running `lilac serve` (or any
// OpenAI-compatible server), the shape of `vllm bench serve`: every request sends an
// --input-tokens prompt and asks for exactly --output-tokens tokens (ignore_eos), streamed.
// Reports output tok/s (all streams), time to first token p50/p99, inter-token latency p50/p99
// (gaps between streamed chunks; the server sends one chunk per token when it keeps up), time
// per output token p50/p99 (per request: (last - first) / (tokens - 1)), errors, as JSON.
//
//   node bench/serve_bench.mjs --url http://127.0.0.1:8080 --concurrency 16 --requests 64 \
//        --input-tokens 1024 --output-tokens 1024 --json out.json
//
// Prompts are token ids through /v1/completions (--prompt ids, the default: distinct
// pseudo-random ids below --vocab per request, so no two prompts share a prefix), or text
// (--prompt text: distinct word sequences of about --input-tokens tokens). Plain fetch, node >= 18;
// also importable (runServeBench) for the client tests. --warmup N (default 1): untimed short
// requests before the timed ones. docs/batching.md describes its use.

import { writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

export const defaults = {
  url: 'http://127.0.0.1:8080',
  concurrency: 16,
  requests: 0,  // 0: 4 x concurrency
  inputTokens: 1024,
  outputTokens: 1024,
  prompt: 'ids',
  vocab: 150000,
  model: '',
  apiKey: process.env.LILAC_API_KEY || '',
  seed: 1,
  json: '',
  timeoutS: 3600,
  warmup: 1,  // untimed requests first (vllm bench serve's initial test run)
};

function percentile(sorted, p) {
  if (sorted.length === 0) return null;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i];
}

function summary(values) {
  const s = [...values].sort((a, b) => a - b);
  const mean = s.length ? s.reduce((a, b) => a + b, 0) / s.length : null;
  return { p50: percentile(s, 50), p90: percentile(s, 90), p99: percentile(s, 99), mean, n: s.length };
}

// A small deterministic generator (mulberry32) for the prompt ids.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function makePrompt(o, i) {
  const next = rng(o.seed * 1000003 + i);
  if (o.prompt === 'ids') return Array.from({ length: o.inputTokens }, () => Math.floor(next() * o.vocab));
  const words = ['alpha', 'bravo', 'charlie', 'delta', 'echo', 'foxtrot', 'golf', 'hotel', 'india', 'juliet'];
  const out = [`Request ${i}:`];
  for (let k = 0; k < o.inputTokens - 3; ++k) out.push(words[Math.floor(next() * words.length)]);
  return out.join(' ');
}

// One streaming request; resolves to its timings (ms, from performance.now()).
async function oneRequest(o, i) {
  const body = {
    prompt: makePrompt(o, i),
    max_tokens: o.outputTokens,
    ignore_eos: true,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  };
  if (o.model) body.model = o.model;
  const headers = { 'Content-Type': 'application/json' };
  if (o.apiKey) headers.Authorization = `Bearer ${o.apiKey}`;
  const start = performance.now();
  const res = await fetch(`${o.url.replace(/\/$/, '')}/v1/completions`, {
    method: 'POST', headers, body: JSON.stringify(body), signal: AbortSignal.timeout(o.timeoutS * 1000),
  });
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${(await res.text()).slice(0, 300)}`);
  const decoder = new TextDecoder();
  const reader = res.body.getReader();
  let buffer = '';
  const chunkTimes = [];
  let usage = null, done = false, text = '';
  for (;;) {
    const { value, done: end } = await reader.read();
    if (end) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      if (!event.startsWith('data: ')) continue;  // heartbeats (': ...')
      const data = event.slice(6);
      if (data === '[DONE]') { done = true; continue; }
      const j = JSON.parse(data);
      if (j.error) throw new Error(`stream error: ${JSON.stringify(j.error)}`);
      if (j.usage) usage = j.usage;
      const piece = j.choices?.[0]?.text;
      if (piece) { chunkTimes.push(performance.now()); text += piece; }
    }
  }
  if (!done) throw new Error('the stream ended without [DONE]');
  const tokens = usage?.completion_tokens ?? chunkTimes.length;
  return { start, end: performance.now(), chunkTimes, tokens, promptTokens: usage?.prompt_tokens ?? null, text };
}

export async function runServeBench(options = {}) {
  const o = { ...defaults, ...options };
  const total = o.requests > 0 ? o.requests : 4 * o.concurrency;
  const results = [];
  const errors = [];
  let next = 0;
  // Untimed first requests (16 prompt tokens, 2 out), one after another, as `vllm bench serve`
  // sends its initial test prompt: the client's first connection and fetch set-up (s19: ~80 ms of a
  // 5.6 s run at 16 clients) and a cold server path are not counted in the duration.
  for (let w = 0; w < o.warmup; ++w) {
    try {
      await oneRequest({ ...o, inputTokens: 16, outputTokens: 2 }, -1 - w);
    } catch (e) {
      errors.push(`warm-up: ${String(e.message || e)}`);
    }
  }
  const started = performance.now();
  async function client() {
    while (next < total) {
      const i = next++;
      try { results.push(await oneRequest(o, i)); } catch (e) { errors.push(String(e.message || e)); }
    }
  }
  await Promise.all(Array.from({ length: o.concurrency }, client));
  const wall = (performance.now() - started) / 1000;
  const outputTokens = results.reduce((a, r) => a + r.tokens, 0);
  const ttft = [], itl = [], tpot = [];
  for (const r of results) {
    if (r.chunkTimes.length) ttft.push(r.chunkTimes[0] - r.start);
    for (let k = 1; k < r.chunkTimes.length; ++k) itl.push(r.chunkTimes[k] - r.chunkTimes[k - 1]);
    if (r.tokens > 1 && r.chunkTimes.length) tpot.push((r.chunkTimes.at(-1) - r.chunkTimes[0]) / (r.tokens - 1));
  }
  return {
    url: o.url,
    concurrency: o.concurrency,
    requests: total,
    completed: results.length,
    errors: errors.length,
    error_samples: errors.slice(0, 5),
    input_tokens: o.inputTokens,
    output_tokens_requested: o.outputTokens,
    prompt: o.prompt,
    warmup_requests: o.warmup,
    duration_s: wall,
    output_tokens: outputTokens,
    output_tok_s: outputTokens / wall,
    per_stream_tok_s: outputTokens / wall / Math.min(o.concurrency, total),
    requests_per_s: results.length / wall,
    ttft_ms: summary(ttft),
    itl_ms: summary(itl),
    tpot_ms: summary(tpot),
  };
}

function parseArgs(argv) {
  const o = {};
  const names = {
    '--url': ['url', String], '--concurrency': ['concurrency', Number], '--requests': ['requests', Number],
    '--input-tokens': ['inputTokens', Number], '--output-tokens': ['outputTokens', Number],
    '--prompt': ['prompt', String], '--vocab': ['vocab', Number], '--model': ['model', String],
    '--api-key': ['apiKey', String], '--seed': ['seed', Number], '--json': ['json', String],
    '--timeout': ['timeoutS', Number], '--warmup': ['warmup', Number],
  };
  for (let i = 0; i < argv.length; ++i) {
    if (argv[i] === '--help' || argv[i] === '-h') {
      console.log(`usage: node bench/serve_bench.mjs [${Object.keys(names).join(' X] [')} X]`);
      process.exit(0);
    }
    const spec = names[argv[i]];
    if (!spec || i + 1 >= argv.length) throw new Error(`unknown or incomplete option ${argv[i]} (see --help)`);
    const v = spec[1](argv[++i]);
    if (spec[1] === Number && !Number.isFinite(v)) throw new Error(`${argv[i - 1]}: not a number`);
    o[spec[0]] = v;
  }
  if (o.prompt && o.prompt !== 'ids' && o.prompt !== 'text') throw new Error('--prompt: ids or text');
  return o;
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const o = parseArgs(process.argv.slice(2));
  const report = await runServeBench(o);
  const text = JSON.stringify(report, null, 2);
  if (o.json) writeFileSync(o.json, text + '\n');
  console.log(text);
  process.exit(report.errors > 0 ? 1 : 0);
}
