// Starts `lilac serve` (the binary from $LILAC_BINARY: lilac_test_server, the test build of the
// server, which adds `--scripted`) on a free loopback port and waits for its
// "listening on http://HOST:PORT" line.
import { spawn } from 'node:child_process';
import { readFileSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

export const repoRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const binary = process.env.LILAC_BINARY || join(repoRoot, 'build', 'ci', 'lilac_test_server');
export const demoModel = join(repoRoot, 'models', 'demo');

export async function startServer(args = [], { env = {}, timeoutMs = 60000 } = {}) {
  const proc = spawn(binary, ['serve', '--port', '0', '--device', 'cpu', '--model', demoModel, ...args], {
    env: { ...process.env, LILAC_API_KEY: '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`lilac serve did not start in time:\n${stderr}`)), timeoutMs);
    proc.stdout.on('data', (d) => {
      stdout += d;
      const m = stdout.match(/listening on (http:\/\/[^\s]+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    exited.then(({ code }) => { clearTimeout(timer); reject(new Error(`lilac serve exited (${code}):\n${stderr}`)); });
  });
  return {
    url,
    baseURL: `${url}/v1`,
    proc,
    exited,
    stdout: () => stdout,
    stderr: () => stderr,
    // Peak and current resident memory of the server (kB), from /proc.
    memory() {
      const status = readFileSync(`/proc/${proc.pid}/status`, 'utf8');
      const kb = (k) => Number(status.match(new RegExp(`${k}:\\s+(\\d+)`))[1]);
      return { peakKb: kb('VmHWM'), rssKb: kb('VmRSS') };
    },
    async stop(signal = 'SIGTERM') {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      return exited;
    },
  };
}

// A script file for the TEST-ONLY `--scripted` option (lilac_test_server only).
export function writeScript(responses) {
  const dir = mkdtempSync(join(tmpdir(), 'lilac-script-'));
  const file = join(dir, 'script.json');
  writeFileSync(file, JSON.stringify({ responses }));
  return file;
}

export async function postJson(url, body, headers = {}) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, text, json, headers: res.headers };
}

// Reads an SSE body into its `data:` payloads (JSON-parsed, '[DONE]' kept).
export async function readSse(res) {
  const text = await res.text();
  return text.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => {
    const d = e.slice(6);
    return d === '[DONE]' ? d : JSON.parse(d);
  });
}
