// The seed's Node client as a peer of the Python benchmark (bench/bench_python.py),
// measured the same way: a warm-up, then N calls, wall time and the process's
// CPU (process.cpuUsage(): user + system of every thread, libuv's and V8's too).
// The client is imported by path from $LLMRETRY_SEED_NODE (not copied into
// this repository; the run scripts skip these rows when it is not set).
//
//   node bench/node_peer.mjs seq|conc N CONC WARMUP BASE_URL [RUN]
//
// seq: N awaited callLLMWithDeadline calls one after the other; conc: the seed's
// batch.mjs pattern, mapWithConcurrency(items, CONC, callLLMWithDeadline).
// Prints one line: RESULT client=node mode=... run=... n=... ok=... secs=... rps=...
// cpu_us=... conns=... (conns: connections nginx accepted during the window).
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const seedDir = process.env.LLMRETRY_SEED_NODE;
if (!seedDir) {
  console.error("node_peer: LLMRETRY_SEED_NODE is not set (the folder of the seed Node client)");
  process.exit(2);
}
const { callLLMWithDeadline, mapWithConcurrency } = await import(
  pathToFileURL(path.join(seedDir, "client.mjs")).href);

const [mode, nArg, concArg, warmArg, base, runArg] = process.argv.slice(2);
const N = Number(nArg), C = Number(concArg), WARM = Number(warmArg), RUN = runArg ?? "1";
if (!["seq", "conc"].includes(mode) || !(N > 0) || !base) {
  console.error("usage: node node_peer.mjs seq|conc N CONC WARMUP BASE_URL [RUN]");
  process.exit(2);
}
const statusUrl = base.replace(/\/v1\/?$/, "") + "/status";

const one = (i) => callLLMWithDeadline({
  baseUrl: base, apiKey: "sk-bench",
  body: { model: "gpt-4.1-mini", messages: [{ role: "user", content: `item ${i}` }] },
}).then((r) => r.data.usage.total_tokens);

async function work(start, count) {
  const items = Array.from({ length: count }, (_, k) => start + k);
  if (mode === "conc") return mapWithConcurrency(items, C, (i) => one(i));
  const out = [];
  for (const i of items) out.push(await one(i));
  return out;
}

async function accepts() {
  const text = await (await fetch(statusUrl)).text();
  return Number(text.split("\n")[2].trim().split(/\s+/)[0]);
}

if (WARM > 0) await work(0, WARM);
const conns0 = await accepts();
const cpu0 = process.cpuUsage();
const t0 = performance.now();
const tokens = await work(WARM, N);
const secs = (performance.now() - t0) / 1000;
const cpu = process.cpuUsage(cpu0);
const conns = (await accepts()) - conns0;
const ok = tokens.filter((t) => t === 13).length;
console.log(`RESULT client=node mode=${mode} run=${RUN} n=${N} conc=${mode === "conc" ? C : 1} ` +
  `ok=${ok} secs=${secs.toFixed(4)} rps=${(N / secs).toFixed(0)} ` +
  `cpu_us=${((cpu.user + cpu.system) / N).toFixed(1)} conns=${conns}`);
process.exit(ok === N ? 0 : 1);
