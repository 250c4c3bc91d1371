// Cross-check of lilac's Jinja engine against @huggingface/jinja: renders seeded random chats with
// the Qwen3.5 and Qwen3.6 chat templates through both, and fails on the first difference.
//
//   node crosscheck.mjs --lilac PATH/TO/lilac --data tests/data/tokenizer [--cases N] [--seed S]
//
// The chats cover system/developer prompts, multi-part user content, thinking on/off,
// preserve_thinking, assistant reasoning (as reasoning_content / reasoning / inline <think>),
// parallel tool calls with nested typed arguments (sometimes given as JSON strings, which lilac
// parses), tool results, unicode, and a few invalid chats that both must reject.
//
// Known differences of @huggingface/jinja from transformers (Python Jinja2), normalised here and
// nowhere else (the golden renders in tests/data/tokenizer pin transformers' behaviour):
//  1. `true|string` gives "true" where Python gives "True" (the Qwen3.5 template renders scalar
//     tool arguments with `| string`): its output is rewritten to Python's spelling for exactly
//     those parameter values; the generator never produces the strings "true"/"false" there.
//  2. `none|string` throws, where Python gives "None": top-level null arguments are not generated
//     for the Qwen3.5 template (nested nulls go through tojson and are generated).
//  3. JavaScript numbers cannot tell 3.0 from 3, and print exponents differently (1e-7 vs 1e-07):
//     generated floats always have a fraction and stay in [0.001, 1e6).
//  4. str.lstrip/rstrip/strip ignore their `chars` argument (they strip all whitespace): the
//     templates' `content.split('</think>')[-1].lstrip('\n')` then differs when the answer after
//     </think> starts with spaces, so inline-<think> answers are generated without leading
//     whitespace. (Reasoning is `|trim`med afterwards, so its strip calls cannot differ.)
import { Template } from "@huggingface/jinja";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";

function parseArgs(argv) {
  const a = { cases: 250, seed: 20240601 };
  for (let i = 2; i < argv.length; i += 2) {
    const k = argv[i].replace(/^--/, "");
    a[k] = argv[i + 1];
  }
  if (!a.lilac || !a.data) {
    console.error("usage: node crosscheck.mjs --lilac BIN --data DIR [--cases N] [--seed S]");
    process.exit(2);
  }
  a.cases = Number(a.cases);
  a.seed = Number(a.seed);
  return a;
}

// mulberry32: a small seeded PRNG, so a failure reproduces from its seed.
function rng(seed) {
  let s = seed >>> 0;
  const next = () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const r = {
    next,
    int: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)),
    chance: (p) => next() < p,
    pick: (xs) => xs[Math.floor(next() * xs.length)],
  };
  return r;
}

const WORDS = [
  "Hello", "world", "Réponds en français", "你好", "😀", "naïve café", "Ünïcödé", "日本語のテキスト",
  "emoji 👩‍👩‍👧 family", "quote \" double", "it's 'single'", "back\\slash", "<b>bold</b>", "a < b > c",
  "x & y", "tab\there", "json {\"a\": [1, 2]}", "{{ not jinja }}", "{% raw %}", "100%", "$HOME",
  "line one\nline two", "  padded  ", "\n\nleading newlines", "trailing newlines\n\n", "Ωμέγα", "العربية",
  "<tool_response>", "</tool_call>", "ß", "non\u00a0breaking", "zero\u200bwidth",
];

function text(r, maxPieces = 3) {
  const n = r.int(1, maxPieces);
  const parts = [];
  for (let i = 0; i < n; i++) parts.push(r.pick(WORDS));
  return parts.join(r.pick([" ", "\n", "", " \n "]));
}

const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Current weather for a city. Unicode: °C, 気温.",
      parameters: {
        type: "object",
        properties: { city: { type: "string", description: "City name" }, unit: { type: "string", enum: ["c", "f"] } },
        required: ["city"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "search",
      description: "Search the web.",
      parameters: {
        type: "object",
        properties: { q: { type: "string" }, limit: { type: "integer" }, filters: { type: "object" } },
        required: ["q"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "write_file",
      description: "Write \"content\" to a file at `path`.\nOverwrites.",
      parameters: {
        type: "object",
        properties: {
          path: { type: "string" },
          content: { type: "string" },
          mode: { type: "integer", minimum: 0 },
          tags: { type: "array", items: { type: "string" } },
          options: { type: "object", properties: { overwrite: { type: "boolean" }, ratio: { type: "number" } } },
        },
        required: ["path", "content"],
      },
    },
  },
];

// A JSON value for a tool argument; `top` marks top-level argument values (see note 1 and 2).
function argValue(r, depth, top, variant) {
  const kinds = ["string", "string", "int", "float", "bool", "array", "object"];
  if (!(top && variant === "qwen35")) kinds.push("null");
  let kind = r.pick(kinds);
  if (depth >= 3 && (kind === "array" || kind === "object")) kind = "string";
  switch (kind) {
    case "string": {
      const s = text(r, 2);
      return s === "true" || s === "false" ? s + "!" : s;
    }
    case "int":
      return r.int(-1000, 100000);
    case "float":
      return r.int(1, 999999) / 8 + 0.125 * (r.int(0, 1) * 2 - 1) + 0.001;
    case "bool":
      return r.chance(0.5);
    case "null":
      return null;
    case "array": {
      const n = r.int(0, 3);
      return Array.from({ length: n }, () => argValue(r, depth + 1, false, variant));
    }
    default: {
      const o = {};
      const n = r.int(0, 3);
      for (let i = 0; i < n; i++) o[r.pick(["a", "b", "key", "nested", "ключ", "x y"]) + i] = argValue(r, depth + 1, false, variant);
      return o;
    }
  }
}

function toolCall(r, variant, id) {
  const tool = r.pick(TOOLS).function;
  const args = {};
  const names = Object.keys(tool.parameters.properties);
  const n = r.int(0, names.length);
  for (let i = 0; i < n; i++) args[names[i]] = argValue(r, 0, true, variant);
  return { id: `call_${id}`, type: "function", function: { name: tool.name, arguments: args } };
}

function userContent(r) {
  if (r.chance(0.25)) {
    const n = r.int(1, 3);
    return Array.from({ length: n }, () => ({ type: "text", text: text(r) }));
  }
  return text(r);
}

// One chat: the request lilac gets, and the same chat as transformers would receive it
// (lilac's request normalisation mirrored: developer -> system, reasoning -> reasoning_content,
// JSON-string arguments parsed).
function makeCase(r, variant, index) {
  const messages = [];
  const tools = r.chance(0.5) ? TOOLS.slice(0, r.int(1, TOOLS.length)) : null;
  if (r.chance(0.5)) messages.push({ role: r.chance(0.2) ? "developer" : "system", content: text(r) });
  const turns = r.int(1, 4);
  let callId = 0;
  for (let t = 0; t < turns; t++) {
    messages.push({ role: "user", content: userContent(r) });
    const last = t === turns - 1;
    if (last && r.chance(0.5)) break;
    const a = { role: "assistant", content: text(r) };
    const style = r.int(0, 3);
    if (style === 1) a.reasoning_content = text(r);
    if (style === 2) a.reasoning = text(r);
    if (style === 3) a.content = `<think>\n${text(r)}\n</think>\n\n${a.content.replace(/^\s+/, "")}`; // note 4
    if (r.chance(0.4)) {
      if (r.chance(0.3)) a.content = r.chance(0.5) ? "" : null;
      const n = r.int(1, 3);
      a.tool_calls = Array.from({ length: n }, () => toolCall(r, variant, callId++));
      messages.push(a);
      for (const c of a.tool_calls) messages.push({ role: "tool", tool_call_id: c.id, content: r.chance(0.2) ? "" : text(r) });
      if (last && r.chance(0.5)) break;
      messages.push({ role: "assistant", content: text(r) });
    } else {
      messages.push(a);
    }
  }
  const req = { messages, add_generation_prompt: messages[messages.length - 1].role !== "assistant" || r.chance(0.3) };
  if (tools) req.tools = tools;
  const et = r.int(0, 2);
  if (et) req.enable_thinking = et === 1;
  const pt = r.int(0, 2);
  if (pt) req.preserve_thinking = pt === 1;

  // A few chats the templates must reject.
  let expectError = false;
  if (index % 23 === 7) {
    req.messages = req.messages.filter((m) => m.role !== "user");
    req.messages.push({ role: "user", content: "<tool_response>\nonly tool output\n</tool_response>" });
    expectError = true;
  } else if (index % 23 === 13) {
    req.messages.push({ role: "system", content: "late system prompt" });
    expectError = true;
  }

  const hf = structuredClone(req);
  for (const m of hf.messages) {
    if (m.role === "developer") m.role = "system";
    if (m.reasoning !== undefined && m.reasoning_content === undefined) m.reasoning_content = m.reasoning;
  }
  // Half the time lilac gets arguments as JSON strings, as OpenAI clients send them.
  for (const m of req.messages)
    for (const c of m.tool_calls ?? []) if (r.chance(0.5)) c.function.arguments = JSON.stringify(c.function.arguments);
  return { req, hf, expectError };
}

function renderHf(template, hf) {
  const ctx = { messages: hf.messages, tools: hf.tools ?? null, add_generation_prompt: hf.add_generation_prompt };
  if ("enable_thinking" in hf) ctx.enable_thinking = hf.enable_thinking;
  if (hf.preserve_thinking === true) ctx.preserve_thinking = true;
  return template.render(ctx);
}

// Note 1: Python spells booleans True/False under `| string`.
function normaliseHf(out, variant) {
  if (variant !== "qwen35") return out;
  return out.replace(/(<parameter=[^>\n]*>\n)(true|false)(\n<\/parameter>)/g, (_, a, b, c) => a + (b === "true" ? "True" : "False") + c);
}

function firstDiff(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
}

function main() {
  const args = parseArgs(process.argv);
  let failures = 0;
  let compared = 0;
  let rejected = 0;
  for (const variant of ["qwen35", "qwen36"]) {
    const file = path.join(args.data, `chat_template_${variant}.jinja`);
    const template = new Template(fs.readFileSync(file, "utf8"));
    const r = rng(args.seed + (variant === "qwen35" ? 0 : 1));
    for (let i = 0; i < args.cases; i++) {
      const { req, hf, expectError } = makeCase(r, variant, i);
      let want;
      let hfError = null;
      try {
        want = normaliseHf(renderHf(template, hf), variant);
      } catch (e) {
        hfError = e.message;
      }
      const run = spawnSync(args.lilac, ["render", "--chat-template", file], { input: JSON.stringify(req), encoding: "utf8" });
      if (run.error) throw run.error;
      const where = `${variant} case ${i} (seed ${args.seed})`;
      if (hfError !== null || expectError) {
        if (hfError === null || run.status !== 1 || !run.stderr.includes("error")) {
          console.error(`FAIL ${where}: @huggingface/jinja ${hfError ? "raised: " + hfError : "rendered"}; lilac exit ${run.status}: ${run.stderr}`);
          console.error(JSON.stringify(req));
          failures++;
        } else {
          rejected++;
        }
        continue;
      }
      compared++;
      if (run.status !== 0 || run.stdout !== want) {
        const at = firstDiff(run.stdout, want);
        console.error(`FAIL ${where}: lilac exit ${run.status} ${run.stderr}`);
        console.error(`  first difference at byte ${at}:`);
        console.error(`  lilac:    ${JSON.stringify(run.stdout.slice(Math.max(0, at - 80), at + 80))}`);
        console.error(`  hf/jinja: ${JSON.stringify(want.slice(Math.max(0, at - 80), at + 80))}`);
        console.error(`  request:  ${JSON.stringify(req)}`);
        failures++;
      }
      if (failures >= 5) break;
    }
  }
  console.log(`jinja crosscheck: ${compared} renders identical, ${rejected} invalid chats rejected by both, ${failures} failures`);
  process.exit(failures ? 1 : 0);
}

main();
